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
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]
#![warn(missing_docs)]

pub mod arch;
pub mod atomic;
pub mod comm;
pub mod coop;
#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
pub mod gin;
pub mod kernel;
pub mod lsa;
pub mod math;
pub mod reduce;
pub mod team;
pub mod wait;

pub use arch::Dim3;
pub use kernel::{Kernel, KernelArgs, KernelParam, MAX_KERNEL_ARGS};
