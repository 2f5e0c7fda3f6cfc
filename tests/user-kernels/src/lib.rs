//! A kernel crate outside `devcomm-kernels`, written as a user writes one
//! (the template of `devcomm_device::kernel`'s docs): the tests launch its
//! kernels with `Stream::launch_in` from its PTX, and check that
//! `Stream::launch` refuses them on both runtimes. [`strict`] holds
//! purpose-written wrong kernels (and their correct versions) for the
//! emulator's strict mode.
//!
//! Its PTX for the GPU is committed beside it (`ptx/user_kernels.sm_90.ptx`,
//! written by `cargo xtask ptx --update`), so the tests need no
//! nightly toolchain; the emulated runtime reads only its entry names.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

devcomm_device::kernel_crate!();

pub mod strict;

use devcomm_device::arch::{global_thread_x, grid_threads_x};
use devcomm_device::{math, KernelParam};

devcomm_device::kernel! {
    /// `out[i] = sqrt(x[i]) * a + b` for `i < n`, grid-stride.
    ///
    /// # Safety
    /// `x` and `out` hold `n` elements of device memory.
    pub unsafe fn sqrt_scale(x: *const f32, out: *mut f32, n: u32, a: f32, b: f32) {
        let mut i = global_thread_x();
        while i < n {
            let k = i as usize;
            *out.add(k) = math::fma(math::sqrt(*x.add(k)), a, b);
            i += grid_threads_x();
        }
    }
}

/// The arguments of [`affine_struct()`], passed as one kernel argument.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Affine {
    /// Input, `n` elements.
    pub x: *const f32,
    /// Output, `n` elements.
    pub out: *mut f32,
    /// Elements.
    pub n: u32,
    /// Scale.
    pub a: f32,
    /// Offset.
    pub b: f64,
    /// A byte, to check the packing of what follows.
    pub flag: u8,
    /// Added when `flag` is set.
    pub extra: u64,
}

// SAFETY: `#[repr(C)]` of pointers (64-bit on both targets) and scalars of
// the same size and alignment on the host and nvptx64: one layout.
unsafe impl KernelParam for Affine {}

devcomm_device::kernel! {
    /// `out[i] = x[i] * a + b (+ extra if flag)`, all from one struct argument.
    ///
    /// # Safety
    /// `p.x` and `p.out` hold `p.n` elements of device memory.
    pub unsafe fn affine_struct(p: Affine) {
        let mut i = global_thread_x();
        let add = if p.flag != 0 { p.extra as f32 } else { 0.0 };
        while i < p.n {
            let k = i as usize;
            *p.out.add(k) = *p.x.add(k) * p.a + p.b as f32 + add;
            i += grid_threads_x();
        }
    }

    /// Sixteen arguments: thread 0 writes `out[j]` = argument `j + 1` (as
    /// `u64`) for the fifteen after `out`.
    ///
    /// # Safety
    /// `out` holds 15 elements.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sixteen(
        out: *mut u64, a1: u8, a2: u16, a3: u32, a4: u64, a5: i8, a6: i16, a7: i32, a8: i64, a9: f32, a10: f64,
        a11: u32, a12: u64, a13: u8, a14: u32, a15: u64
    ) {
        if global_thread_x() == 0 {
            let v = [
                a1 as u64, a2 as u64, a3 as u64, a4, a5 as i64 as u64, a6 as i64 as u64, a7 as i64 as u64,
                a8 as u64, a9 as u64, a10 as u64, a11 as u64, a12, a13 as u64, a14 as u64, a15,
            ];
            for (j, x) in v.into_iter().enumerate() {
                *out.add(j) = x;
            }
        }
    }
}
