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
pub mod error;
pub mod host;
pub mod proxy;
pub mod ring;
pub mod transport;

pub use copy_queue::CopyQueue;
pub use descriptor::{RemoteSignal, Request};
pub use error::{GinHostError, GinResult};
pub use host::{Bootstrap, GinHostMemory, LocalMemory};
pub use proxy::Proxy;
pub use ring::Rings;
pub use transport::tcp::{TcpConfig, TcpTransport};
pub use transport::{Landing, PeerFailure, PutTarget, Transport};

pub use devcomm_device::abi::gin::{
    slot_tag, GinDescriptor, GinOp, GinSlot, GinState, LocalActionKind, QueueTail, RemoteActionKind,
};
