//! Host implementations of [`super`]'s intrinsics: each asks the emulated
//! runtime's hooks (see [`crate::emu`]) about the calling CPU thread.

use super::Dim3;
use crate::emu::hooks;
use core::panic::Location;

#[inline]
pub fn thread_idx() -> Dim3 {
    (hooks().geometry)().thread_idx
}

#[inline]
pub fn block_idx() -> Dim3 {
    (hooks().geometry)().block_idx
}

#[inline]
pub fn block_dim() -> Dim3 {
    (hooks().geometry)().block_dim
}

#[inline]
pub fn grid_dim() -> Dim3 {
    (hooks().geometry)().grid_dim
}

#[inline]
pub fn sync_threads() {
    (hooks().sync_threads)()
}

#[inline]
pub fn lane_id() -> u32 {
    super::thread_rank_in_block() % super::WARP_SIZE
}

#[inline]
pub fn sync_warp(mask: u32) {
    (hooks().sync_warp)(mask)
}

#[inline]
pub fn active_mask() -> u32 {
    1 << lane_id()
}

/// The lanes' values of `mask`, the caller's own without a barrier when it is alone.
fn exchange(mask: u32, value: u64) -> [u64; 32] {
    let lane = lane_id();
    if mask == 1 << lane {
        let mut v = [0; 32];
        v[lane as usize] = value;
        return v;
    }
    (hooks().warp_exchange)(mask, value)
}

#[inline]
pub fn match_any(mask: u32, value: u64) -> u32 {
    let v = exchange(mask, value);
    (0..32).filter(|&l| mask & (1 << l) != 0 && v[l as usize] == value).fold(0, |m, l| m | 1 << l)
}

#[inline]
pub fn ballot(mask: u32, pred: bool) -> u32 {
    let v = exchange(mask, pred as u64);
    (0..32).filter(|&l| mask & (1 << l) != 0 && v[l as usize] != 0).fold(0, |m, l| m | 1 << l)
}

#[inline]
pub fn shfl(mask: u32, value: u64, src: u32) -> u64 {
    exchange(mask, value)[(src % 32) as usize]
}

#[inline]
pub fn named_barrier(id: u32, nthreads: u32) {
    (hooks().named_barrier)(id, nthreads)
}

#[inline]
pub fn sync_threads_max(value: u32) -> u32 {
    (hooks().barrier_max)(crate::emu::EmuBarrier::Block, value)
}

#[inline]
pub fn sync_warp_max(mask: u32, value: u32) -> u32 {
    if mask == 1 << lane_id() {
        return value;
    }
    (hooks().barrier_max)(crate::emu::EmuBarrier::Warp { mask }, value)
}

#[inline]
pub fn named_barrier_max(id: u32, nthreads: u32, first_thread: u32, value: u32) -> u32 {
    (hooks().barrier_max)(crate::emu::EmuBarrier::Named { id, threads: nthreads, first: first_thread }, value)
}

#[inline]
pub fn dynamic_shared() -> *mut u8 {
    (hooks().dynamic_shared)().0
}

#[inline]
pub fn dynamic_shared_size() -> u32 {
    (hooks().dynamic_shared)().1
}

#[inline]
pub fn global_timer_ns() -> u64 {
    (hooks().global_timer_ns)()
}

#[inline]
pub fn sm_id() -> u32 {
    0
}

#[inline]
pub fn spin_backoff(_ns: u32) {
    (hooks().yield_now)()
}

#[inline]
pub fn trap() -> ! {
    (hooks().trap)()
}

/// # Safety
/// As for [`super::load16`]: `p` is valid for reads of 16 bytes and 16-byte aligned.
#[inline]
#[track_caller]
pub unsafe fn load16(p: *const u8) -> [u32; 4] {
    // SAFETY: the caller guarantees 16 valid bytes aligned to 16, more than
    // `[u32; 4]`'s alignment of 4.
    unsafe { load_volatile(p as *const [u32; 4]) }
}

/// # Safety
/// As for [`super::store16`]: `p` is valid for writes of 16 bytes and 16-byte aligned.
#[inline]
#[track_caller]
pub unsafe fn store16(p: *mut u8, v: [u32; 4]) {
    // SAFETY: the caller guarantees 16 bytes valid for writes, aligned to 16,
    // more than `[u32; 4]`'s alignment of 4.
    unsafe { store_volatile(p as *mut [u32; 4], v) }
}

/// # Safety
/// As for [`super::load_volatile`]: `p` is valid for reads and aligned.
#[inline]
#[track_caller]
pub unsafe fn load_volatile<T: Copy>(p: *const T) -> T {
    match crate::emu::memory() {
        Some(m) => {
            let mut v = core::mem::MaybeUninit::<T>::uninit();
            // SAFETY: the caller's contract makes `p` valid for reads of a
            // `T`; `v` is a `T`'s worth of writable bytes.
            unsafe {
                (m.load)(p as *const u8, v.as_mut_ptr() as *mut u8, core::mem::size_of::<T>(), Location::caller())
            };
            // SAFETY: the hook wrote all `size_of::<T>()` bytes of `v` with
            // the bytes at `p` (or this thread's pending stores to them),
            // which hold a `T` by the caller's contract.
            unsafe { v.assume_init() }
        }
        // SAFETY: the caller's contract: `p` is valid for reads and aligned.
        None => unsafe { p.read_volatile() },
    }
}

/// # Safety
/// As for [`super::store_volatile`]: `p` is valid for writes and aligned.
#[inline]
#[track_caller]
pub unsafe fn store_volatile<T: Copy>(p: *mut T, v: T) {
    match crate::emu::memory() {
        // SAFETY: `v` is a `T`'s worth of readable bytes; the caller's
        // contract makes `p` valid for writes of a `T` (device memory of
        // the kernel, valid until it ends).
        Some(m) => unsafe {
            (m.store)(p as *mut u8, &v as *const T as *const u8, core::mem::size_of::<T>(), Location::caller())
        },
        // SAFETY: the caller's contract: `p` is valid for writes and aligned.
        None => unsafe { p.write_volatile(v) },
    }
}

/// # Safety
/// As for [`super::load_weak`]: `p` is valid for reads and aligned.
#[inline]
#[track_caller]
pub unsafe fn load_weak<T: Copy>(p: *const T) -> T {
    // SAFETY: forwarded; on the host a volatile read is a plain read that
    // the compiler keeps.
    unsafe { load_volatile(p) }
}
