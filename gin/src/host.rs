//! What `devcomm` hands the proxy: a bootstrap to connect transports over,
//! access to this rank's windows and device, and the GIN memory itself.

use crate::copy_queue::CopyQueue;
use crate::error::{GinHostError, GinResult};
use devcomm_device::abi::gin::{GinSlot, QueueTail};

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
/// mapping is in the [`devcomm_device::abi::gin::GinState`] given to kernels).
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
