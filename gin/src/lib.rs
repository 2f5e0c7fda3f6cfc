//! `devcomm-gin`: the host side of GIN, devcomm's GPU-initiated networking.
//!
//! GPU kernels post [`GinDescriptor`]s into rings in host memory (see
//! `devcomm_device::abi::gin` for the memory layout and the protocol). This
//! crate serves them:
//!
//! * [`proxy`]: one progress thread per device communicator drains the rings
//!   in ticket order, asks a [`Transport`] to carry each operation, applies
//!   local actions (counters) and publishes completion (the ring's tail,
//!   which is also the producers' credit);
//! * [`transport`]: how bytes and signals reach a peer: `Tcp` (between
//!   hosts, or between emulated nodes) and `CopyEngine` (same host:
//!   asynchronous copy-engine copies into the peer's mapped window through
//!   a [`CopyQueue`], then, once a fence behind the data has passed, an
//!   atomic add on the peer's signal in shared memory), and, behind the
//!   `verbs` feature, `Verbs` (RDMA write + fenced fetch-add; unit-tested
//!   against a model NIC — no NIC exists on our machines).
//!
//! The crate sits *below* `devcomm`: it knows nothing of communicators or
//! CUDA. `devcomm` hands it raw GIN memory ([`GinHostMemory`]), a way to
//! reach the rank's windows ([`LocalMemory`]) and a bootstrap ([`Bootstrap`]).
#![warn(missing_docs)]

pub mod copy_queue;
pub mod descriptor;
pub mod proxy;
pub mod ring;
pub mod transport;

pub use copy_queue::CopyQueue;
pub use descriptor::{RemoteSignal, Request};
pub use proxy::Proxy;
pub use ring::Rings;
pub use transport::tcp::{TcpConfig, TcpTransport};
pub use transport::{Landing, PeerFailure, Transport};

pub use devcomm_device::abi::gin::{
    slot_tag, GinDescriptor, GinOp, GinSlot, GinState, LocalActionKind, QueueTail, RemoteActionKind,
};

/// Errors of the host side of GIN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GinHostError {
    /// A descriptor or argument is malformed (bad op, id out of range, bytes past a window).
    #[error("invalid GIN request: {0}")]
    Invalid(String),
    /// A peer failed or a connection broke.
    #[error("GIN peer failure: {0}")]
    Remote(String),
    /// The operating system refused something.
    #[error("GIN system error: {0}")]
    System(String),
    /// A wait ran past its limit.
    #[error("GIN timeout: {0}")]
    Timeout(String),
    /// The backend or transport asked for does not exist here.
    #[error("GIN backend unavailable: {0}")]
    Unavailable(String),
}

/// Result of this crate's calls.
pub type GinResult<T> = Result<T, GinHostError>;

/// The bootstrap collectives a transport needs to connect (implemented by
/// `devcomm` over its communicator).
pub trait Bootstrap: Send + Sync {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn nranks(&self) -> usize;
    /// Every rank's `data`, in rank order.
    fn allgather(&self, data: &[u8]) -> GinResult<Vec<Vec<u8>>>;
}

/// The proxy's access to this rank's memory (implemented by `devcomm`).
pub trait LocalMemory: Send + Sync {
    /// Device address of `bytes` at `offset` of this rank's window `window`,
    /// or `Invalid` if the window is unknown or the range exceeds it.
    fn window_addr(&self, window: u32, offset: u64, bytes: u64) -> GinResult<u64>;
    /// Copies `data` to device address `addr` and returns once it is there
    /// (visible to kernels).
    fn write_device(&self, addr: u64, data: &[u8]) -> GinResult<()>;
    /// Copies from device address `addr` into `out`, returning once done.
    fn read_device(&self, addr: u64, out: &mut [u8]) -> GinResult<()>;
    /// A new [`CopyQueue`] over this rank's device (asynchronous copies and
    /// writes with fences), for transports with a device data path (the
    /// copy engine). The default says it is unavailable.
    fn copy_queue(&self) -> GinResult<Box<dyn CopyQueue>> {
        Err(GinHostError::Unavailable("device copy queues are not available to this proxy".into()))
    }
}

/// GIN memory of one rank, as host pointers (what the GPU sees through its
/// mapping is in the [`GinState`] given to kernels).
#[derive(Clone, Copy, Debug)]
pub struct GinHostMemory {
    /// Rings, `[context][peer][depth]` slots.
    pub rings: *mut GinSlot,
    /// Tails, `[context][peer]`.
    pub tails: *mut QueueTail,
    /// This rank's signals (`total_signals` u64s).
    pub signals: *mut u64,
    /// This rank's counters.
    pub counters: *mut u64,
    /// Contexts.
    pub contexts: u32,
    /// Ranks (rings per context).
    pub nranks: u32,
    /// Descriptors per ring (a power of two).
    pub depth: u32,
    /// Signals (user's and barriers').
    pub total_signals: u32,
    /// Counters.
    pub counters_len: u32,
}

// SAFETY: the pointers name host memory that `devcomm` keeps alive for the
// proxy's whole life; all shared words are accessed atomically.
unsafe impl Send for GinHostMemory {}
// SAFETY: as above.
unsafe impl Sync for GinHostMemory {}
