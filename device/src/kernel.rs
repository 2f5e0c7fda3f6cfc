//! Declaring kernels once for both targets.
//!
//! ```
//! devcomm_device::kernel! {
//!     /// out[i] = a * x[i] + y[i]
//!     pub unsafe fn axpy(a: f32, x: *const f32, y: *const f32, out: *mut f32, n: u32) {
//!         let i = devcomm_device::arch::global_thread_x();
//!         if i < n {
//!             let i = i as usize;
//!             *out.add(i) = a * *x.add(i) + *y.add(i);
//!         }
//!     }
//! }
//! ```
//!
//! On `nvptx64` this is `#[no_mangle] pub unsafe extern "ptx-kernel" fn axpy(..)`
//! (the crate needs `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]`).
//! On the host it is a plain `pub unsafe fn axpy(..)` plus a marker type `axpy`
//! implementing [`Kernel`], which `devcomm`'s `Stream::launch::<axpy>` uses to
//! find the PTX entry point by name on a GPU, or to run the function on CPU
//! threads on the emulated runtime.

use core::ffi::c_void;

/// A value that can be passed to a kernel: plain data with the same layout on
/// the host and on `nvptx64` (64-bit pointers, little-endian, C layout).
///
/// # Safety
///
/// Implementors must be `#[repr(C)]` (or primitive) plain data, contain no
/// host-only references, and have identical size, alignment and field offsets
/// on the host and on `nvptx64-nvidia-cuda`.
pub unsafe trait KernelParam: Copy + 'static {}

macro_rules! impl_param {
    ($($t:ty),*) => { $(
        // SAFETY: primitive with identical layout on both targets.
        unsafe impl KernelParam for $t {}
    )* };
}
impl_param!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64, usize, isize, bool);
// SAFETY: 64-bit pointers on both targets; the pointee lives in device memory.
unsafe impl<T: 'static> KernelParam for *const T {}
// SAFETY: as above.
unsafe impl<T: 'static> KernelParam for *mut T {}
// SAFETY: `Dim3` is `#[repr(C)]` of three `u32`.
unsafe impl KernelParam for crate::arch::Dim3 {}

/// A tuple of [`KernelParam`]s: a kernel's argument list.
pub trait KernelArgs: Copy + 'static {
    /// Number of parameters.
    const COUNT: usize;
    /// Calls `f` with the address of each parameter, in order. The addresses
    /// point into `self` (what `cuLaunchKernel` wants in `kernelParams`).
    fn for_each_param(&self, f: &mut dyn FnMut(*mut c_void));
}

macro_rules! impl_args {
    ($($name:ident : $idx:tt),*) => {
        impl<$($name: KernelParam),*> KernelArgs for ($($name,)*) {
            const COUNT: usize = 0 $(+ { let _ = $idx; 1 })*;
            #[allow(unused_variables)]
            fn for_each_param(&self, f: &mut dyn FnMut(*mut c_void)) {
                $( f(&self.$idx as *const $name as *mut c_void); )*
            }
        }
    };
}
impl_args!();
impl_args!(A: 0);
impl_args!(A: 0, B: 1);
impl_args!(A: 0, B: 1, C: 2);
impl_args!(A: 0, B: 1, C: 2, D: 3);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11);

/// A kernel declared with [`kernel!`](crate::kernel!): its PTX entry name, its
/// argument tuple, and its host form for the emulated runtime.
pub trait Kernel {
    /// The PTX `.entry` name (the function's name).
    const NAME: &'static str;
    /// The argument tuple.
    type Args: KernelArgs;
    /// Runs the kernel body for the calling emulated GPU thread.
    ///
    /// # Safety
    ///
    /// As for the kernel itself: the arguments must satisfy its contract, and
    /// the caller must be a thread of the emulated runtime.
    unsafe fn emulate(args: Self::Args);
}

/// Declares a kernel for both targets; see the [module docs](self).
///
/// The function must be `unsafe fn`, return nothing, and take only
/// [`KernelParam`] arguments (at most 12).
#[macro_export]
macro_rules! kernel {
    ($(
        $(#[$meta:meta])*
        $vis:vis unsafe fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block
    )*) => {$(
        #[cfg(target_arch = "nvptx64")]
        $(#[$meta])*
        #[no_mangle]
        $vis unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body

        #[cfg(not(target_arch = "nvptx64"))]
        $(#[$meta])*
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
        $vis unsafe fn $name($($arg: $ty),*) $body

        #[cfg(not(target_arch = "nvptx64"))]
        #[allow(non_camel_case_types)]
        #[doc = concat!("Launch handle of the kernel [`", stringify!($name), "()`].")]
        $vis struct $name {
            _private: (),
        }

        #[cfg(not(target_arch = "nvptx64"))]
        impl $crate::kernel::Kernel for $name {
            const NAME: &'static str = stringify!($name);
            type Args = ($($ty,)*);
            #[inline]
            unsafe fn emulate(args: Self::Args) {
                // Bound before the arguments, which may shadow the name.
                let body: unsafe fn($($ty),*) = $name;
                #[allow(unused_variables, clippy::unused_unit)]
                let ($($arg,)*) = args;
                // SAFETY: forwarded from the caller's contract.
                unsafe { body($($arg),*) }
            }
        }
    )*};
}
