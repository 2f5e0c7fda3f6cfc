//! `devcomm-device`: the device side of devcomm.
//!
//! This crate is `#![no_std]` and compiles for two targets from one source:
//!
//! * `nvptx64-nvidia-cuda`: real GPUs. Intrinsics are PTX special registers,
//!   barriers and inline PTX.
//! * the host: the *emulated runtime* of the `devcomm` crate runs the very same
//!   kernel functions on CPU threads. Intrinsics call the hooks that runtime
//!   installs (see [`emu`]).
//!
//! Kernels are declared with [`kernel!`], which yields a PTX entry point on
//! the GPU target and, on the host, a callable function plus a marker type that
//! implements [`Kernel`] so the host crate can launch it on either runtime.
//! A kernel crate of your own starts with two crate attributes and
//! [`kernel_crate!`]; the [`kernel`](mod@kernel) module shows a whole one, with its
//! `build.rs` and the host code that loads its PTX.
//!
//! Kernels compute with [`math`] (`sqrt`, `rsqrt`, `exp`, `log`, `fma`,
//! `min`, `max`: PTX instructions on the GPU, `core`-only versions on the
//! host, since `core` has none of them) and combine values across a warp,
//! a tile or a block with [`reduce`].
//!
//! ## Coming from NCCL's device API
//!
//! The names follow NCCL's (2.28–2.32) in Rust spelling, and every
//! counterpart carries NCCL's name as a search alias (type `ncclGin` in the
//! documentation's search box):
//!
//! | NCCL | devcomm-device |
//! |---|---|
//! | `ncclDevComm` | [`comm::DevComm`] (made by the host: `devcomm::DevCommHandle::dev_comm`) |
//! | `ncclWindow_t` | [`comm::WindowDesc`] (`devcomm::Window::desc`) |
//! | `ncclGetLsaPointer`, `ncclGetLocalPointer`, `ncclGetPeerPointer` | [`WindowDesc::lsa_ptr`](comm::WindowDesc::lsa_ptr), [`local_ptr`](comm::WindowDesc::local_ptr), [`peer_ptr`](comm::WindowDesc::peer_ptr) |
//! | `ncclSymPtr<T>` | [`comm::SymPtr`] |
//! | `ncclTeam`, `ncclTeamWorld`, `ncclTeamLsa`, `ncclTeamRail` | [`team::Team`], [`DevComm::world`](comm::DevComm::world), [`lsa`](comm::DevComm::lsa), [`rail`](comm::DevComm::rail) |
//! | `ncclTeamRankToWorld`, `ncclTeamRankToTeam`, `ncclTeamInnerFactor`, `ncclTeamOuterFactor` | [`Team::rank_to_world`](team::Team::rank_to_world), [`rank_to_team`](team::Team::rank_to_team), [`inner_factor`](team::Team::inner_factor), [`outer_factor`](team::Team::outer_factor) |
//! | `ncclCoopThread`, `ncclCoopWarp`, `ncclCoopTile<N>`, `ncclCoopLanes`, `ncclCoopWarpSpan`, `ncclCoopCta` | [`coop::ThreadCoop`], [`coop::Warp`], [`coop::Tile`], [`coop::Lanes`], [`coop::WarpSpan`], [`coop::Cta`] |
//! | `ncclLsaBarrierSession` | [`lsa::LsaBarrierSession`] |
//! | `ncclGin` (`put`, `putValue`, `get`, `signal`, `flush`, `readSignal`, `waitSignal`, `resetSignal`, counters, shadows) | [`gin::Gin`] ([`put`](gin::Gin::put), [`put_value`](gin::Gin::put_value), [`get`](gin::Gin::get), [`signal`](gin::Gin::signal), [`flush`](gin::Gin::flush), [`read_signal`](gin::Gin::read_signal), [`wait_signal`](gin::Gin::wait_signal), [`reset_signal`](gin::Gin::reset_signal), ...) |
//! | `ncclGin_SignalInc`, `ncclGin_SignalAdd`, `ncclGin_CounterInc` | [`gin::RemoteAction::SignalInc`], [`gin::RemoteAction::SignalAdd`], [`gin::LocalAction::CounterInc`] |
//! | `ncclGinBarrierSession` | [`gin::GinBarrierSession`] |
//! | `ncclGinType_t`, `ncclGinConnectionType_t` | [`abi::gin::GinBackend`], [`abi::gin::GinConnection`] (host: `devcomm::gin::GinType`, `GinConnectionType`) |
//!
//! Beyond NCCL's building blocks: [`coll`] has collectives callable from a
//! kernel (over the LSA team, and over a world of several LSA teams with
//! [`coll::hier::all_reduce`]), and [`route::Router`] puts, signals and
//! waits per peer over LSA or GIN, whichever reaches it.
//!
//! Where devcomm differs: every call that can fail returns a `Result`
//! (NCCL's return nothing), the same one on every thread of the coop
//! ([`coop::Coop::agree`]), and every wait ends on the host's abort flag or
//! a timeout ([`wait`]) instead of hanging. The host and the device share
//! their structures through one module, [`abi`].
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]
#![warn(missing_docs)]

pub mod abi;
pub mod arch;
pub mod atomic;
pub mod coll;
pub mod comm;
pub mod coop;
#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
pub mod error;
pub mod gin;
pub mod kernel;
pub mod lsa;
pub mod math;
pub mod moe;
pub mod reduce;
pub mod route;
pub mod team;
pub mod wait;

pub use arch::Dim3;
pub use kernel::{Kernel, KernelArgs, KernelParam, MAX_KERNEL_ARGS};
