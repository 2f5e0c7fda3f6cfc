//! devcomm's own kernels, built two ways from this one source:
//! to PTX (embedded in the `devcomm` crate) and as an ordinary host library
//! that the emulated runtime calls.
//!
//! Only the library's kernels live here: `Stream::launch` runs them from
//! the embedded PTX. The kernels of devcomm's own tests and benchmarks are
//! a kernel crate of their own (`devcomm-test-kernels`, in `tests/kernels`),
//! launched from its module with `Stream::launch_in` as a user's are.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]
#![warn(missing_docs)]

devcomm_device::kernel_crate!();

pub mod coll;
pub mod moe;
pub mod rma;
mod shared;
pub mod util;
