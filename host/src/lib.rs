//! # devcomm
//!
//! Device-initiated GPU communication for Rust: the host side.
//!
//! * [`runtime`]: devices, streams, memory and kernel launches on two
//!   interchangeable runtimes, CUDA (real GPUs) and the emulated runtime
//!   (each "GPU" is host memory, kernels run on CPU threads).
//! * communicators: bootstrap between processes, split, abort, async errors.
//!
//! Kernels are written once with [`devcomm_device::kernel!`] and run on both
//! runtimes.
#![warn(missing_docs)]

pub mod error;
pub mod runtime;

pub use error::{Error, ErrorCode, Result};
pub use runtime::{Device, DeviceBuffer, Event, LaunchConfig, Module, RuntimeKind, RuntimeSelection, Stream};

pub mod bootstrap;
pub mod comm;
pub mod dev_comm;
pub mod env;
pub mod gin;
pub mod launch;
pub mod memory;
pub mod ptx;
pub mod team;
pub mod window;

pub use dev_comm::{DevCommHandle, DevCommRequirements};
pub use memory::SymmetricMemory;
pub use team::{Team, TeamKind};
pub use window::{Window, WindowFlags};
