//! # devcomm
//!
//! Device-initiated GPU communication for Rust: the host side. Kernels put,
//! signal, wait and synchronise with other GPUs themselves, over NVLink
//! load/store (LSA) and the network (GIN); this crate sets that up, in the
//! shape of NCCL's host API (names in the docs' search: `ncclCommInitRank`,
//! `ncclDevCommCreate`, ...). Everything runs on real GPUs (CUDA) and on the
//! *emulated runtime* (each "GPU" is host memory, kernels run on CPU
//! threads), which is what the examples below use.
//!
//! ## Walkthrough
//!
//! Each step is a program that runs (`cargo test --doc` runs them on the
//! emulated runtime). Ranks are usually processes (`devcomm-run -n 2 prog`,
//! torchrun, Slurm: [`comm::Communicator::init_from_env`]); here they are
//! threads of one process, one communicator per emulated device.
//!
//! **1. Communicators** (`ncclCommInitAll`): one per device, with rank,
//! size and a bootstrap between them.
//!
//! ```
//! use devcomm::prelude::*;
//!
//! let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
//! assert_eq!((comms[1].rank(), comms[1].count()), (1, 2));
//! std::thread::scope(|s| {
//!     for c in &comms {
//!         s.spawn(move || c.bootstrap_barrier()); // collective: every rank calls it
//!     }
//! });
//! # Ok::<(), devcomm::Error>(())
//! ```
//!
//! **2. Symmetric memory and a window** (`ncclMemAlloc`,
//! `ncclCommWindowRegister`): every rank allocates the same size and
//! registers it collectively; each rank then sees every LSA peer's copy
//! mapped into its own address space. Window memory does not start zeroed:
//! write what kernels read first.
//!
//! **3. A device communicator** (`ncclDevCommCreate`): what kernels get,
//! built from [`DevCommRequirements`]: here one LSA barrier, GIN to every
//! peer with one signal, and the window made usable by GIN.
//!
//! **4. A kernel that uses LSA and GIN**: each rank stores a value straight
//! into the next rank's window (LSA), meets the others at an LSA barrier,
//! then puts 8 bytes to the next rank through GIN with a signal and waits
//! for the signal from the previous one.
//!
//! **5. Clean up**: the device communicator, the window, the communicator.
//!
//! The kernel is `ring_step` in the repository's
//! `examples/kernels/src/lib.rs` (a kernel crate of its own, as any user's: kernels run on a GPU from PTX,
//! and that crate's PTX is committed beside it in `examples/ptx/`). It
//! stores into the next rank's window, meets the others at LSA barrier 0,
//! then puts 8 bytes to the next rank with `Gin::put` and a signal, and
//! waits for the previous rank's.
//!
//! ```
//! use devcomm::prelude::*;
//! use devcomm_example_kernels::ring_step;
//! // The kernel crate's PTX, as a program embeds it (see `devcomm_device::kernel`).
//! static PTX: &str =
//!     include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ptx/devcomm_example_kernels.sm_90.ptx"));
//!
//! let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
//! std::thread::scope(|s| {
//!     let ranks: Vec<_> = comms.iter().map(|comm| s.spawn(move || -> devcomm::Result<[u64; 3]> {
//!         let stream = comm.device().stream();
//!         // 2. Memory and window.
//!         let mem = comm.mem_alloc(4096)?;
//!         let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
//!         window.write(&stream, 8, &[comm.rank() as u64 + 7])?;
//!         // 3. Device communicator.
//!         let mut req = DevCommRequirements::new();
//!         req.lsa_barrier_count = 1;
//!         req.gin_connection_type = GinConnectionType::Full;
//!         req.gin_signal_count = 1;
//!         req.use_window(&window);
//!         let handle = comm.create_dev_comm(&req)?;
//!         // 4. The kernel, from its crate's module.
//!         let module = comm.device().load_module(PTX)?;
//!         let errors = comm.device().alloc_from(&[0u32])?;
//!         // SAFETY: the device communicator and window outlive the launch
//!         // (the reads below synchronise the stream); `errors` holds one word.
//!         unsafe {
//!             stream.launch_in::<ring_step>(
//!                 &module,
//!                 LaunchConfig::new(1, 64),
//!                 (handle.dev_comm(), window.desc(), errors.as_mut_ptr()),
//!             )?;
//!         }
//!         if let Some(e) = Error::from_device_code(stream.read_vec(&errors)?[0], "ring_step") {
//!             return Err(e);
//!         }
//!         let mut words = [0u64; 3];
//!         window.read(&stream, 0, &mut words)?;
//!         // 5. Clean up (dropping does the same, without the error).
//!         handle.destroy()?;
//!         window.deregister()?;
//!         comm.finalize()?;
//!         Ok(words)
//!     })).collect();
//!     for (rank, r) in ranks.into_iter().enumerate() {
//!         let words = r.join().unwrap()?;
//!         let prev = (rank + 1) % 2; // with two ranks, the previous rank is the next one
//!         assert_eq!(words, [prev as u64 + 100, rank as u64 + 7, prev as u64 + 7]);
//!     }
//!     Ok::<(), devcomm::Error>(())
//! })?;
//! # Ok::<(), devcomm::Error>(())
//! ```
//!
//! The same program runs on GPUs: open CUDA devices instead
//! ([`RuntimeSelection::Cuda`], or `auto`); the module then holds the
//! kernel's PTX for the driver.
//!
//! ## Modules
//!
//! * [`runtime`]: devices, streams, memory and kernel launches on two
//!   interchangeable runtimes, CUDA (real GPUs) and the emulated runtime.
//! * [`comm`]: communicators: bootstrap between processes, split, abort, async errors.
//! * [`memory`], [`window`]: symmetric memory and windows.
//! * [`dev_comm`]: device communicators ([`DevCommRequirements`], [`DevCommHandle`]).
//! * [`gin`]: GIN backends ([`gin::GinType`], [`gin::GinConnectionType`]).
//! * [`p2p`]: a point-to-point transfer engine independent of communicators
//!   (UCCL-style endpoints, send/recv, one-sided write/read; copy engine on
//!   one host, TCP between hosts).
//!
//! Kernels are written once with [`devcomm_device::kernel!`] and run on both
//! runtimes.
#![warn(missing_docs)]

pub mod error;
pub mod runtime;

pub use error::{Error, ErrorCode, Result};
pub use runtime::{Device, DeviceBuffer, Event, Graph, LaunchConfig, Module, RuntimeKind, RuntimeSelection, Stream};

pub mod bootstrap;
pub mod coll;
pub mod comm;
pub mod dev_comm;
pub mod env;
pub mod gin;
pub mod launch;
pub mod memory;
pub mod moe;
pub mod p2p;
pub mod ptx;
pub mod rma;
pub mod team;
pub mod window;

pub use dev_comm::{DevCommHandle, DevCommRequirements};
pub use memory::SymmetricMemory;
pub use team::{Team, TeamKind};
pub use window::{Window, WindowFlags};

pub use bootstrap::UniqueId;
pub use comm::{Communicator, Config};
pub use devcomm_device::comm::{DevComm, WindowDesc};
pub use gin::{GinConnectionType, GinType};

/// What most programs use, in one import: `use devcomm::prelude::*;`.
pub mod prelude {
    pub use crate::bootstrap::UniqueId;
    pub use crate::comm::{Communicator, Config};
    pub use crate::dev_comm::{DevCommHandle, DevCommRequirements};
    pub use crate::gin::{GinConnectionType, GinType};
    pub use crate::memory::SymmetricMemory;
    pub use crate::runtime::{Device, DeviceBuffer, LaunchConfig, RuntimeKind, RuntimeSelection, Stream};
    pub use crate::window::{Window, WindowFlags};
    pub use crate::{Error, Result};
    pub use devcomm_device::comm::{DevComm, SymPtr, WindowDesc};
}
