//! Hooks through which the host's emulated runtime answers device intrinsics.
//!
//! The device crate is `no_std` and knows nothing of threads; the `devcomm`
//! crate's emulated runtime knows, for each CPU thread running a kernel, which
//! GPU thread it stands for. It installs one [`EmuHooks`] table at start-up with
//! [`install`]; every intrinsic in [`crate::arch`] on the host goes through it.

use crate::arch::Dim3;
use core::sync::atomic::{AtomicPtr, Ordering};

/// Where the calling emulated GPU thread stands in its launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Geometry {
    /// `threadIdx`.
    pub thread_idx: Dim3,
    /// `blockIdx`.
    pub block_idx: Dim3,
    /// `blockDim`.
    pub block_dim: Dim3,
    /// `gridDim`.
    pub grid_dim: Dim3,
}

/// Which threads a reducing barrier ([`EmuHooks::barrier_max`]) joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmuBarrier {
    /// Every live thread of the block (`bar.sync 0`).
    Block,
    /// The lanes of `mask` in the caller's warp.
    Warp {
        /// Lane mask.
        mask: u32,
    },
    /// Named barrier `id` of `threads` threads, which are the block's
    /// threads `first .. first + threads`.
    Named {
        /// Barrier id.
        id: u32,
        /// Thread count.
        threads: u32,
        /// First participating thread (linear index in the block).
        first: u32,
    },
}

/// The emulated runtime's answers to device intrinsics, for the calling thread.
pub struct EmuHooks {
    /// Geometry of the calling thread.
    pub geometry: fn() -> Geometry,
    /// Block barrier of the calling thread's block.
    pub sync_threads: fn(),
    /// Barrier among the lanes of `mask` in the caller's warp (`bar.warp.sync`).
    pub sync_warp: fn(mask: u32),
    /// Barrier among the lanes of `mask` (the caller's among them) that also
    /// hands each the `value` of every lane of `mask` (indexed by lane; the
    /// others 0): the basis of `match.any` and `shfl` on the host.
    pub warp_exchange: fn(mask: u32, value: u64) -> [u64; 32],
    /// Named barrier `id` (1..16) of `nthreads` threads of the block (`bar.sync id, n`).
    pub named_barrier: fn(id: u32, nthreads: u32),
    /// A barrier that also hands every participant the largest `value` any
    /// participant brought (`bar.red` / `redux.sync` on a GPU).
    pub barrier_max: fn(barrier: EmuBarrier, value: u32) -> u32,
    /// Base and size of the calling block's dynamic shared memory.
    pub dynamic_shared: fn() -> (*mut u8, u32),
    /// Global nanosecond clock.
    pub global_timer_ns: fn() -> u64,
    /// Give up the CPU inside a spin loop.
    pub yield_now: fn(),
    /// Abort the calling kernel.
    pub trap: fn() -> !,
}

static HOOKS: AtomicPtr<EmuHooks> = AtomicPtr::new(core::ptr::null_mut());

/// Install the hook table. Later calls replace it; the table must live forever.
pub fn install(hooks: &'static EmuHooks) {
    HOOKS.store(hooks as *const EmuHooks as *mut EmuHooks, Ordering::Release);
}

/// Whether a hook table is installed.
pub fn installed() -> bool {
    !HOOKS.load(Ordering::Acquire).is_null()
}

/// The installed hook table.
///
/// # Panics
///
/// When called on the host outside the emulated runtime (no table installed):
/// a device intrinsic has no meaning there.
#[inline]
pub fn hooks() -> &'static EmuHooks {
    let p = HOOKS.load(Ordering::Acquire);
    if p.is_null() {
        panic!("devcomm-device: a device intrinsic ran on the host outside the emulated runtime");
    }
    // SAFETY: `install` only stores pointers derived from `&'static EmuHooks`.
    unsafe { &*p }
}
