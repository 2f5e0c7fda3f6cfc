//! Declaring kernels once for both targets, and what a kernel crate of
//! your own needs.
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
//! implementing [`Kernel`], which `devcomm`'s `Stream::launch_in::<axpy>(&module, ..)`
//! uses to find the PTX entry point by name in `module` on a GPU, or to run
//! the function on CPU threads on the emulated runtime. The marker also
//! records the module it was declared in ([`Kernel::MODULE_PATH`]), so that
//! `Stream::launch::<K>` (the library's own kernels only) refuses, on both
//! runtimes alike, a kernel of another crate.
//!
//! # A kernel crate of your own
//!
//! Kernels live in a `no_std` library crate that is built twice: to PTX by
//! [`devcomm-build`](https://docs.rs/devcomm-build) from the `build.rs` of
//! the crate that launches them (this needs the nightly toolchain with
//! `rust-src`: `rustup toolchain install nightly --component rust-src`), and
//! as an ordinary host library that the emulated runtime calls. A complete
//! minimal layout, `my-kernels` beside the program `my-app`:
//!
//! `my-kernels/Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "my-kernels"
//! version = "0.1.0"
//! edition = "2021"
//!
//! [dependencies]
//! devcomm-device = "0.1"
//! ```
//!
//! `my-kernels/src/lib.rs`: two crate attributes (a macro cannot write
//! them), then [`kernel_crate!`](crate::kernel_crate!) for the GPU's panic
//! handler, then the kernels:
//!
//! ```ignore
//! #![no_std]
//! #![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
//!
//! devcomm_device::kernel_crate!();
//!
//! use devcomm_device::arch::{global_thread_x, grid_threads_x};
//! use devcomm_device::math;
//!
//! devcomm_device::kernel! {
//!     /// `out[i] = sqrt(x[i])` for `i < n`.
//!     ///
//!     /// # Safety
//!     /// `x` and `out` hold `n` elements of device memory.
//!     pub unsafe fn sqrt_all(x: *const f32, out: *mut f32, n: u32) {
//!         let mut i = global_thread_x();
//!         while i < n {
//!             *out.add(i as usize) = math::sqrt(*x.add(i as usize));
//!             i += grid_threads_x();
//!         }
//!     }
//! }
//! ```
//!
//! `my-app/Cargo.toml` (the program):
//!
//! ```toml
//! [package]
//! name = "my-app"
//! version = "0.1.0"
//! edition = "2021"
//!
//! [dependencies]
//! devcomm = "0.1"
//! my-kernels = { path = "../my-kernels" }
//!
//! [build-dependencies]
//! devcomm-build = "0.1"
//! ```
//!
//! `my-app/build.rs` builds the kernel crate to one PTX file in `OUT_DIR`:
//!
//! ```ignore
//! use std::path::PathBuf;
//!
//! fn main() {
//!     let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
//!     let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
//!     println!("cargo:rerun-if-changed=../my-kernels/src");
//!     println!("cargo:rerun-if-changed=../my-kernels/Cargo.toml");
//!     let ptx = devcomm_build::PtxBuilder::new("my-kernels")
//!         .manifest_dir(here.join("../my-kernels"))
//!         .arch("sm_90")
//!         .build()
//!         .unwrap_or_else(|e| panic!("building my-kernels to PTX: {e}"));
//!     ptx.copy_to(out.join("my_kernels.ptx")).unwrap();
//! }
//! ```
//!
//! `my-app/src/main.rs` embeds the PTX, loads it once per device and
//! launches from it with `launch_in` (on the emulated runtime the PTX is not
//! compiled, but its entry names are read, so a kernel missing from it fails
//! there as it would on a GPU):
//!
//! ```ignore
//! use devcomm::runtime::{Device, LaunchConfig, RuntimeSelection};
//! use my_kernels::sqrt_all;
//!
//! static MY_KERNELS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/my_kernels.ptx"));
//!
//! fn main() -> devcomm::Result<()> {
//!     let dev = Device::open(RuntimeSelection::from_env()?, 0)?;
//!     let module = dev.load_module(MY_KERNELS_PTX)?;
//!     let x = dev.alloc_from(&[4.0f32, 9.0, 2.0])?;
//!     let out = dev.alloc::<f32>(3)?;
//!     // SAFETY: both buffers hold 3 elements and outlive the launch (read_vec waits).
//!     unsafe {
//!         dev.stream().launch_in::<sqrt_all>(&module, LaunchConfig::for_elements(3, 32), (x.as_ptr(), out.as_mut_ptr(), 3))?;
//!     }
//!     println!("{:?}", dev.stream().read_vec(&out)?);
//!     Ok(())
//! }
//! ```
//!
//! `Stream::launch::<sqrt_all>(..)` (without a module) is an
//! `InvalidUsage` error on both runtimes, naming `launch_in`: it launches
//! only the library's own kernels (`devcomm-kernels`).
//!
//! # More arguments than sixteen
//!
//! A kernel takes at most 16 arguments. Beyond that, or to keep launches
//! readable, pass a `#[repr(C)]` struct by value: it is a [`KernelParam`]
//! once you promise that its layout is the same on both targets (plain
//! data, no references), as `devcomm`'s `DevComm` is.
//!
//! ```
//! use devcomm_device::KernelParam;
//!
//! /// Everything an RMSNorm launch needs, as one kernel argument.
//! #[derive(Clone, Copy)]
//! #[repr(C)]
//! pub struct RmsNormArgs {
//!     pub x: *const f32,
//!     pub weight: *const f32,
//!     pub out: *mut f32,
//!     pub rows: u32,
//!     pub cols: u32,
//!     pub eps: f32,
//! }
//!
//! // SAFETY: #[repr(C)] of pointers (64-bit on both targets) and 32-bit
//! // scalars: the same size, alignment and offsets on the host and nvptx64.
//! unsafe impl KernelParam for RmsNormArgs {}
//!
//! devcomm_device::kernel! {
//!     /// One block per row.
//!     ///
//!     /// # Safety
//!     /// The pointers of `a` hold `rows * cols` (`weight`: `cols`) elements.
//!     pub unsafe fn rms_norm(a: RmsNormArgs) {
//!         let _ = a; // ...
//!     }
//! }
//! # fn main() {}
//! ```
//!
//! The launch then passes a one-element tuple: `(RmsNormArgs { .. },)`.
//! (`devcomm`'s tests run such a kernel on the emulated runtime:
//! `tests/runtime.rs`, `struct_argument_and_sixteen_arguments`.)

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
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13, O: 14);
impl_args!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13, O: 14, P: 15);

/// The most arguments a [`kernel!`](crate::kernel!) takes (a [`KernelArgs`]
/// tuple has at most this many elements). Pass a `#[repr(C)]` struct as one
/// [`KernelParam`] for more (see the [module docs](self)).
pub const MAX_KERNEL_ARGS: usize = 16;

/// A kernel declared with [`kernel!`](crate::kernel!): its PTX entry name, its
/// argument tuple, and its host form for the emulated runtime.
pub trait Kernel {
    /// The PTX `.entry` name (the function's name).
    const NAME: &'static str;
    /// The module the kernel was declared in (`module_path!()` where
    /// [`kernel!`](crate::kernel!) was called), e.g.
    /// `"devcomm_kernels::util"`: its first segment is the kernel's crate.
    const MODULE_PATH: &'static str;
    /// The argument tuple.
    type Args: KernelArgs;
    /// Runs the kernel body for the calling emulated GPU thread.
    ///
    /// # Safety
    ///
    /// As for the kernel itself: the arguments must satisfy its contract, and
    /// the caller must be a thread of the emulated runtime.
    unsafe fn emulate(args: Self::Args);

    /// The (Rust) name of the crate the kernel was declared in: the first
    /// segment of [`Self::MODULE_PATH`].
    fn crate_name() -> &'static str {
        match Self::MODULE_PATH.split_once("::") {
            Some((krate, _)) => krate,
            None => Self::MODULE_PATH,
        }
    }
}

/// Declares a kernel for both targets; see the [module docs](self).
///
/// The function must be `unsafe fn`, return nothing, and take only
/// [`KernelParam`] arguments (at most [`MAX_KERNEL_ARGS`], 16; more as a
/// `#[repr(C)]` struct, see the [module docs](self)).
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
            const MODULE_PATH: &'static str = module_path!();
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

/// The most registers a thread of each named kernel may use, CUDA's
/// `__launch_bounds__` / `-maxrregcount` for one kernel (PTX's `.maxnreg`):
/// a kernel whose threads hold fewer registers fits more warps per SM, which
/// hides memory latency (a copy or a wait that one warp cannot keep busy);
/// past what the kernel needs, the compiler spills to local memory instead.
///
/// ```ignore
/// devcomm_device::max_registers!(moe_dispatch = 128, moe_combine_bf16 = 128);
/// ```
///
/// On `nvptx64` it leaves one `u32` global per kernel in the PTX, named
/// `__devcomm_maxnreg_<kernel>`; `devcomm-build` turns each into the
/// kernel's `.maxnreg` directive and refuses a name that is no kernel of
/// the module or a count outside 16..=255. On the host it expands to
/// nothing.
#[macro_export]
macro_rules! max_registers {
    ($($name:ident = $n:literal),* $(,)?) => {$(
        #[cfg(target_arch = "nvptx64")]
        const _: () = {
            #[used]
            #[export_name = concat!("__devcomm_maxnreg_", stringify!($name))]
            static MAX_REGISTERS: u32 = $n;
        };
    )*};
}

/// What a kernel crate needs besides its kernels: the GPU's panic handler
/// (a panic on the GPU is a `trap`, which ends the kernel and the CUDA
/// context; the emulated runtime reports it as the launch's error). Call it
/// once, at the root of a `no_std` kernel crate; on the host it expands to
/// nothing (the program's `std` has the handler).
///
/// Crate attributes cannot come from a macro, so the crate root still
/// starts with these two lines:
///
/// ```ignore
/// #![no_std]
/// #![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
///
/// devcomm_device::kernel_crate!();
/// ```
///
/// See the [module docs](mod@crate::kernel) for a whole kernel crate, its
/// `build.rs` and how the program loads the PTX.
#[macro_export]
macro_rules! kernel_crate {
    () => {
        #[cfg(target_arch = "nvptx64")]
        #[panic_handler]
        fn __devcomm_kernel_panic(_: &::core::panic::PanicInfo) -> ! {
            $crate::arch::trap()
        }
    };
}
