//! devcomm's own kernels, built two ways from this one source:
//! to PTX (embedded in the `devcomm` crate) and as an ordinary host library
//! that the emulated runtime calls.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![warn(missing_docs)]

devcomm_device::kernel_crate!();

pub mod coll;
pub mod gin;
pub mod lsa;
mod report;
pub mod selftest;
