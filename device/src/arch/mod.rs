//! Thread geometry, block barriers, shared memory and timers.
//!
//! Every function here has one meaning on both targets. On `nvptx64` it is a
//! special-register read or a PTX instruction; on the host it asks
//! the emulated runtime through the hooks in [`crate::emu`].

pub mod bulk;

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
use nvptx as imp;

#[cfg(not(target_arch = "nvptx64"))]
mod emulated;
#[cfg(not(target_arch = "nvptx64"))]
use emulated as imp;

/// A three-dimensional extent or index, as CUDA's `dim3`/`uint3`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Dim3 {
    /// Fastest-varying coordinate.
    pub x: u32,
    /// Middle coordinate.
    pub y: u32,
    /// Slowest-varying coordinate.
    pub z: u32,
}

impl Dim3 {
    /// `Dim3 { x, y: 1, z: 1 }`.
    pub const fn x(x: u32) -> Self {
        Dim3 { x, y: 1, z: 1 }
    }

    /// `Dim3 { x, y, z }`.
    pub const fn new(x: u32, y: u32, z: u32) -> Self {
        Dim3 { x, y, z }
    }

    /// Number of elements: `x * y * z` (saturating, never panics).
    pub const fn volume(&self) -> u64 {
        (self.x as u64).saturating_mul(self.y as u64).saturating_mul(self.z as u64)
    }
}

/// Index of the calling thread in its block (`threadIdx`).
#[inline(always)]
pub fn thread_idx() -> Dim3 {
    imp::thread_idx()
}

/// Index of the calling thread's block in the grid (`blockIdx`).
#[inline(always)]
pub fn block_idx() -> Dim3 {
    imp::block_idx()
}

/// Threads per block (`blockDim`).
#[inline(always)]
pub fn block_dim() -> Dim3 {
    imp::block_dim()
}

/// Blocks per grid (`gridDim`).
#[inline(always)]
pub fn grid_dim() -> Dim3 {
    imp::grid_dim()
}

/// Linear rank of the calling thread in its block (x fastest).
#[inline(always)]
pub fn thread_rank_in_block() -> u32 {
    let t = thread_idx();
    let d = block_dim();
    t.x + d.x * (t.y + d.y * t.z)
}

/// Number of threads in a block.
#[inline(always)]
pub fn threads_per_block() -> u32 {
    let d = block_dim();
    d.x * d.y * d.z
}

/// Linear rank of the calling thread's block in the grid (x fastest).
#[inline(always)]
pub fn block_rank_in_grid() -> u32 {
    let b = block_idx();
    let g = grid_dim();
    b.x + g.x * (b.y + g.y * b.z)
}

/// Global linear index along x: `blockIdx.x * blockDim.x + threadIdx.x`.
#[inline(always)]
pub fn global_thread_x() -> u32 {
    block_idx().x * block_dim().x + thread_idx().x
}

/// Threads in the whole grid along x: `gridDim.x * blockDim.x`.
#[inline(always)]
pub fn grid_threads_x() -> u32 {
    grid_dim().x * block_dim().x
}

/// Block-wide barrier (`__syncthreads`): every thread of the block must reach
/// it; shared and global memory written before it by threads of the block is
/// visible to the block's threads after it.
#[inline(always)]
pub fn sync_threads() {
    imp::sync_threads()
}

/// Threads per warp.
pub const WARP_SIZE: u32 = 32;

/// The caller's lane in its warp (`%laneid`; the block's linear thread rank
/// modulo 32).
#[inline(always)]
pub fn lane_id() -> u32 {
    imp::lane_id()
}

/// The caller's warp in its block (linear thread rank / 32).
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_rank_in_block() / WARP_SIZE
}

/// Barrier among the lanes of `mask` of the caller's warp (`__syncwarp(mask)`);
/// every lane in `mask` must call it with the same mask.
#[inline(always)]
pub fn sync_warp(mask: u32) {
    imp::sync_warp(mask)
}

/// The lanes of the caller's warp executing this call together with it
/// (`activemask`), the caller included. Only a hint of convergence: any
/// subset holding the caller is a correct answer, and the emulator always
/// answers the caller alone (it runs every lane as if diverged).
#[inline(always)]
pub fn active_mask() -> u32 {
    imp::active_mask()
}

/// The lanes of `mask` whose `value` equals the caller's (`match.any.sync.b64`).
/// Every lane of `mask` must call it with the same `mask`, the caller among them.
#[inline(always)]
pub fn match_any(mask: u32, value: u64) -> u32 {
    imp::match_any(mask, value)
}

/// The lanes of `mask` whose `pred` holds (`vote.sync.ballot.b32`). Every
/// lane of `mask` must call it with the same `mask`, the caller among them.
#[inline(always)]
pub fn ballot(mask: u32, pred: bool) -> u32 {
    imp::ballot(mask, pred)
}

/// Lane `src`'s `value` (`shfl.sync.idx`, 64 bits). Every lane of `mask`
/// must call it with the same `mask`; `src` is one of them.
#[inline(always)]
pub fn shfl(mask: u32, value: u64, src: u32) -> u64 {
    imp::shfl(mask, value, src)
}

/// Named barrier `id` (1..=15; 0 is [`sync_threads`]'s) among `nthreads`
/// threads of the block, a multiple of 32 (`bar.sync id, nthreads`).
#[inline(always)]
pub fn named_barrier(id: u32, nthreads: u32) {
    imp::named_barrier(id, nthreads)
}

/// [`sync_threads`] that also returns the largest `value` any thread of the
/// block brought, to every thread (`bar.red.or` over the value's bits; one
/// reducing barrier when every value is 0).
#[inline(always)]
pub fn sync_threads_max(value: u32) -> u32 {
    imp::sync_threads_max(value)
}

/// [`sync_warp`] that also returns the largest `value` of the lanes of
/// `mask` (`redux.sync.max.u32`).
#[inline(always)]
pub fn sync_warp_max(mask: u32, value: u32) -> u32 {
    imp::sync_warp_max(mask, value)
}

/// [`named_barrier`] that also returns the largest `value` of its threads,
/// which are the block's threads `first_thread .. first_thread + nthreads`.
#[inline(always)]
pub fn named_barrier_max(id: u32, nthreads: u32, first_thread: u32, value: u32) -> u32 {
    imp::named_barrier_max(id, nthreads, first_thread, value)
}

/// Base of the block's dynamic shared memory (the `shared_mem_bytes` of the
/// launch), 16-byte aligned. Valid for the block's lifetime; its size is
/// [`dynamic_shared_size`].
#[inline(always)]
pub fn dynamic_shared<T>() -> *mut T {
    imp::dynamic_shared().cast()
}

/// Size in bytes of the block's dynamic shared memory.
#[inline(always)]
pub fn dynamic_shared_size() -> u32 {
    imp::dynamic_shared_size()
}

/// Loads 16 bytes from a 16-byte-aligned address (`ld.v4.u32`), local or
/// an LSA peer's.
///
/// A plain (weak) load: on the emulator's strict mode it sees the calling
/// thread's delayed stores and is checked for data races (see
/// [`store_volatile`]).
///
/// # Safety
/// `p` is valid for 16 bytes and 16-byte aligned.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load16(p: *const u8) -> [u32; 4] {
    // SAFETY: the caller's contract (16 valid bytes, 16-byte aligned) is the
    // target implementation's contract.
    unsafe { imp::load16(p) }
}

/// Stores 16 bytes to a 16-byte-aligned address (`st.v4.u32`).
///
/// A plain (weak) store: see [`store_volatile`] for what the emulator's
/// strict mode does with it.
///
/// # Safety
/// `p` is valid for 16 bytes and 16-byte aligned.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn store16(p: *mut u8, v: [u32; 4]) {
    // SAFETY: the caller's contract (16 valid bytes, 16-byte aligned) is the
    // target implementation's contract.
    unsafe { imp::store16(p, v) }
}

/// Loads a `T` with a volatile load (`ld.volatile`: the compiler neither
/// drops nor merges it, but it orders nothing; a relaxed load of each
/// naturally aligned word of at most 8 bytes).
///
/// On the emulator's strict mode (`DEVCOMM_EMU_STRICT=1`) the load sees the
/// calling thread's own delayed stores (see [`store_volatile`]) and is
/// checked for data races: a load of a word that another thread stored to
/// without a release that this thread has acquired since is reported with
/// both sites.
///
/// # Safety
/// `p` is valid for reads of a `T` and aligned for it.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_volatile<T: Copy>(p: *const T) -> T {
    // SAFETY: the caller's contract is the target implementation's.
    unsafe { imp::load_volatile(p) }
}

/// Stores a `T` with a volatile store (`st.volatile`: kept by the compiler,
/// ordering nothing).
///
/// Other threads, blocks, GPUs and the GIN proxy may see such a store late:
/// only a release of the storing thread (a fence, a release atomic such as
/// [`crate::lsa::signal_add`], a barrier of its block, the end of the
/// kernel) makes it visible to whoever acquires after it. The emulator's
/// strict mode does exactly that: the store waits in a per-thread store
/// buffer until such a release (or a random moment), so a kernel that
/// signals data without a release reads wrong data on the CPU as on a GPU.
/// Only the device crate's own store paths can be delayed this way; a
/// kernel's `*p = v` is a plain host store on the emulator.
///
/// # Safety
/// `p` is valid for writes of a `T` and aligned for it.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn store_volatile<T: Copy>(p: *mut T, v: T) {
    // SAFETY: the caller's contract is the target implementation's.
    unsafe { imp::store_volatile(p, v) }
}

/// A plain load (`ld`, which the compiler may combine with others), with
/// the strict emulator's checks of [`load_volatile`].
///
/// # Safety
/// `p` is valid for reads of a `T` and aligned for it.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub(crate) unsafe fn load_weak<T: Copy>(p: *const T) -> T {
    // SAFETY: the caller's contract is the target implementation's.
    unsafe { imp::load_weak(p) }
}

/// A global nanosecond clock, comparable across the GPU (`%globaltimer`).
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    imp::global_timer_ns()
}

/// The SM the calling thread runs on (`%smid`; 0 on the emulator), for
/// diagnostics: it may change during a thread's life under preemption.
#[inline(always)]
pub fn sm_id() -> u32 {
    imp::sm_id()
}

/// Back off inside a spin loop: `nanosleep` on the GPU, a yield on the
/// emulator (whose "threads" share few CPU cores).
#[inline(always)]
pub fn spin_backoff(ns: u32) {
    imp::spin_backoff(ns)
}

/// Abort the kernel. On the GPU this is `trap` (the context is lost); on the
/// emulator the launch reports an error.
#[inline(always)]
pub fn trap() -> ! {
    imp::trap()
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Self {
        Dim3::x(x)
    }
}

impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Self {
        Dim3::new(x, y, 1)
    }
}

impl From<(u32, u32, u32)> for Dim3 {
    fn from((x, y, z): (u32, u32, u32)) -> Self {
        Dim3::new(x, y, z)
    }
}
