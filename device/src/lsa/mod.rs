//! LSA: load/store access to the GPUs of this node.
//!
//! Every LSA peer's window is mapped into the caller's address space (see
//! [`crate::comm::WindowDesc`]), so moving data to a peer is a store through
//! a pointer. This module adds what makes that usable from a kernel:
//!
//! * [`barrier::LsaBarrierSession`]: a barrier among the LSA team's GPUs, with
//!   a memory order, that can time out or be aborted;
//! * [`ops`]: copies spread over a coop with 16-byte accesses (to one peer or
//!   to all), single-value puts, signals and waits on peers' words;
//! * [`ll`]: low-latency small messages whose arrival is their own signal;
//! * [`reduce`](mod@reduce): element-wise reductions of the LSA peers' buffers.
//!
//! A typical fused kernel: compute into the local window, `copy` to peers,
//! `LsaBarrierSession::sync`, read what the peers wrote.

pub mod barrier;
pub mod ll;
pub mod ops;
pub mod reduce;

pub use barrier::{BarrierError, LsaBarrierSession};
pub use ops::{copy, copy_to_all, get_value, put_value, signal_add, wait_signal};
pub use reduce::{reduce, ReduceOp, Reducible};
