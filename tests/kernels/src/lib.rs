//! The kernels of devcomm's own tests and benchmarks: self-tests of the
//! device API (`selftest`, `lsa`, `gin`), the kernels that provoke faults,
//! and the benchmarks' kernels. They are not the library's
//! (`devcomm-kernels`, which `Stream::launch` runs): like a user's kernel
//! crate, this one is built to PTX on its own, and the tests and benchmarks
//! load it with `Device::load_module` and launch from it with
//! `Stream::launch_in` (`devcomm_tests::test_kernels` gives the module of a
//! device, loaded once).
//!
//! Its PTX is committed beside it (`ptx/devcomm_test_kernels.sm_90.ptx`,
//! written by `cargo xtask ptx --update`), so the tests need no nightly
//! toolchain; on the emulated runtime the same functions run from their
//! host form.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![warn(missing_docs)]

devcomm_device::kernel_crate!();

pub mod coll_bench;
pub mod coll_sequence;
pub mod gin;
pub mod hier;
pub mod lsa;
pub mod moe;
mod report;
pub mod rma;
pub mod route;
pub mod selftest;
