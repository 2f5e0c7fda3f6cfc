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
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]
#![warn(missing_docs)]

pub mod abi;
pub mod arch;
pub mod atomic;
pub mod comm;
pub mod coop;
#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
pub mod error;
pub mod gin;
pub mod kernel;
pub mod lsa;
pub mod team;
pub mod wait;

pub use arch::Dim3;
pub use kernel::{Kernel, KernelArgs, KernelParam};
