//! Hooks through which the host's emulated runtime answers device intrinsics.
//!
//! The device crate is `no_std` and knows nothing of threads; the `devcomm`
//! crate's emulated runtime knows, for each CPU thread running a kernel, which
//! GPU thread it stands for. It installs one [`EmuHooks`] table at start-up with
//! [`install`]; every intrinsic in [`crate::arch`] on the host goes through it.
//!
//! The runtime's *strict mode* (`DEVCOMM_EMU_STRICT=1`) installs a second
//! table, [`EmuMemHooks`], with [`install_memory`]: then the device crate's
//! own plain loads and stores of device memory ([`crate::arch::load16`],
//! [`crate::arch::store16`], [`crate::arch::load_volatile`],
//! [`crate::arch::store_volatile`], and everything built on them:
//! [`crate::lsa::copy`], [`crate::lsa::put_value`], [`crate::lsa::get_value`],
//! the LSA reductions, the LL receive, the bulk-copy fallbacks, GIN's inline
//! put sources) and every ordering event of [`crate::atomic`] (release and
//! acquire atomics, fences) go through it, so the runtime can delay stores
//! until a release and check accesses for data races. A kernel's own
//! `*p = v` cannot be intercepted: it stays a plain host store.

use crate::arch::Dim3;
use core::panic::Location;
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

/// The strict emulator's hooks for plain memory accesses and ordering
/// events of the calling thread (see the module docs). Each is called on
/// the thread of an emulated kernel, or outside one (host code using the
/// device crate), where it must act as the plain operation would.
pub struct EmuMemHooks {
    /// A plain store of the `len` bytes at `src` to `dst`, made at `site`.
    /// The hook may delay it (a store buffer); loads through
    /// [`EmuMemHooks::load`] by the same thread see it at once.
    ///
    /// # Safety
    /// `src` is valid for reads of `len` bytes; `dst` is valid for writes
    /// of `len` bytes until the calling kernel ends.
    pub store: unsafe fn(dst: *mut u8, src: *const u8, len: usize, site: &'static Location<'static>),
    /// A plain load of `len` bytes at `src` into `dst` (the caller's own
    /// memory), made at `site`.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes.
    pub load: unsafe fn(src: *const u8, dst: *mut u8, len: usize, site: &'static Location<'static>),
    /// An ordering event of the calling thread: `release` before an access
    /// with release semantics (or a fence), `acquire` after one with
    /// acquire semantics; `cta`: at block (CTA) scope only.
    pub order: fn(acquire: bool, release: bool, cta: bool),
    /// An atomic access of `len` bytes at `addr` by the calling thread is
    /// about to happen (its earlier plain stores to those bytes go first).
    pub atomic: fn(addr: *const u8, len: usize),
}

static HOOKS: AtomicPtr<EmuHooks> = AtomicPtr::new(core::ptr::null_mut());
static MEMORY: AtomicPtr<EmuMemHooks> = AtomicPtr::new(core::ptr::null_mut());

/// Install the strict emulator's memory hooks (see [`EmuMemHooks`]). Later
/// calls replace them; the table must live forever.
pub fn install_memory(hooks: &'static EmuMemHooks) {
    MEMORY.store(hooks as *const EmuMemHooks as *mut EmuMemHooks, Ordering::Release);
}

/// The installed memory hooks, if the runtime runs in strict mode.
#[inline]
pub fn memory() -> Option<&'static EmuMemHooks> {
    let p = MEMORY.load(Ordering::Acquire);
    // SAFETY: `install_memory` only stores pointers derived from `&'static EmuMemHooks`.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Tells the strict emulator (if installed) that the calling thread makes an
/// ordering event: see [`EmuMemHooks::order`].
#[inline]
pub fn order(acquire: bool, release: bool, cta: bool) {
    if let Some(m) = memory() {
        (m.order)(acquire, release, cta)
    }
}

/// Tells the strict emulator (if installed) that the calling thread makes
/// an atomic access of `len` bytes at `addr`: see [`EmuMemHooks::atomic`].
#[inline]
pub fn atomic_access(addr: *const u8, len: usize) {
    if let Some(m) = memory() {
        (m.atomic)(addr, len)
    }
}

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
