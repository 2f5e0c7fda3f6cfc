//! Hopper's bulk-copy engine (the TMA's non-tensor `cp.async.bulk`) and the
//! shared-memory barriers (`mbarrier`) its loads complete on.
//!
//! A bulk copy moves a contiguous, 16-byte aligned run of bytes (a multiple
//! of 16) between global memory — including an LSA peer's, over NVLink — and
//! the block's shared memory, without occupying the issuing thread:
//!
//! * [`load_to_shared`] global → shared, completing on an mbarrier
//!   (declare the bytes first with [`mbarrier_arrive_expect_tx`], then wait
//!   for the phase with [`mbarrier_try_wait_parity`]);
//! * [`store_from_shared`] shared → global, tracked in bulk groups
//!   ([`commit_group`], [`wait_group_read`], [`wait_group`]).
//!
//! On the emulator every operation completes immediately (a copy with
//! plain 16-byte loads and stores), a valid schedule of the asynchronous one.
//!
//! Ordering: bulk stores are performed by the async proxy. Before a generic
//! store that publishes them (a signal), call [`wait_group`]`::<0>()` and
//! [`fence_proxy_async`].

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// Initialises the mbarrier at `bar` (8 bytes of shared memory) for
/// `count` arrivals per phase. Follow with [`fence_mbarrier_init`] before
/// the bulk engine uses it.
///
/// # Safety
/// `bar` is 8-byte aligned shared memory of this block, not in use.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: *mut u64, count: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller's contract: `bar` is 8-byte aligned shared memory of
    // this block that no one else uses yet, so converting it to a shared-window
    // address and initialising the mbarrier there writes only those 8 bytes.
    unsafe {
        asm!("{{ .reg .u64 a; .reg .u32 s; cvta.to.shared.u64 a, {p}; cvt.u32.u64 s, a; mbarrier.init.shared::cta.b64 [s], {c}; }}",
             p = in(reg64) bar, c = in(reg32) count, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = count;
        // SAFETY: the caller's contract: `bar` is valid, 8-byte aligned and not in use.
        unsafe { bar.write_volatile(0) };
    }
}

/// Makes initialised mbarriers visible to the async proxy (the bulk engine).
#[inline(always)]
pub fn fence_mbarrier_init() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence: no operands, no memory-safety preconditions.
    unsafe {
        asm!("fence.proxy.async.shared::cta;", options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}

/// Arrives once at `bar` and declares `bytes` more bytes of bulk loads that
/// complete on its current phase.
///
/// # Safety
/// `bar` is an initialised mbarrier of this block.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: *mut u64, bytes: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller's contract: `bar` is an initialised mbarrier in this
    // block's shared memory; the arrive updates only its 8 bytes.
    unsafe {
        asm!("{{ .reg .u64 a; .reg .u32 s; .reg .b64 st; cvta.to.shared.u64 a, {p}; cvt.u32.u64 s, a; mbarrier.arrive.expect_tx.shared::cta.b64 st, [s], {n}; }}",
             p = in(reg64) bar, n = in(reg32) bytes, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = (bar, bytes);
    }
}

/// Whether the phase with parity `parity` of `bar` has completed (waits a
/// little in hardware before answering no).
///
/// # Safety
/// `bar` is an initialised mbarrier of this block.
#[inline(always)]
pub unsafe fn mbarrier_try_wait_parity(bar: *mut u64, parity: u32) -> bool {
    #[cfg(target_arch = "nvptx64")]
    {
        let done: u32;
        // SAFETY: the caller's contract: `bar` is an initialised mbarrier in
        // this block's shared memory; `try_wait` only reads its phase.
        unsafe {
            asm!("{{ .reg .u64 a; .reg .u32 s; .reg .pred p; cvta.to.shared.u64 a, {b}; cvt.u32.u64 s, a; mbarrier.try_wait.parity.shared::cta.b64 p, [s], {ph}; selp.u32 {d}, 1, 0, p; }}",
                 b = in(reg64) bar, ph = in(reg32) parity, d = out(reg32) done, options(nostack));
        }
        done != 0
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = (bar, parity);
        true
    }
}

/// Starts a bulk load of `bytes` from global `src` into shared `dst`,
/// completing on `bar`.
///
/// # Safety
/// `dst` is shared memory of this block and `src` global memory, both
/// 16-byte aligned and valid for `bytes`, a non-zero multiple of 16;
/// `bytes` were declared on `bar`'s current phase.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_to_shared(dst: *mut u8, src: *const u8, bytes: u32, bar: *mut u64) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller's contract: `dst` is this block's shared memory and
    // `src` global memory, both 16-byte aligned and valid for `bytes` (a
    // non-zero multiple of 16), and `bar` an initialised mbarrier whose phase
    // expects these bytes, so the engine writes only `[dst, dst + bytes)`.
    unsafe {
        asm!("{{ .reg .u64 a, b; .reg .u32 d, m; cvta.to.shared.u64 a, {d}; cvt.u32.u64 d, a; cvta.to.shared.u64 b, {bar}; cvt.u32.u64 m, b; cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [{s}], {n}, [m]; }}",
             d = in(reg64) dst, s = in(reg64) src, n = in(reg32) bytes, bar = in(reg64) bar, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = bar;
        // SAFETY: the caller's contract: `src` valid for reads and `dst` for
        // writes of `bytes`, both 16-byte aligned; shared and global memory
        // do not overlap.
        unsafe { copy16(dst, src, bytes) };
    }
}

/// The emulator's bulk copy: 16-byte plain loads and stores (which the
/// strict mode delays and checks like any other).
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `bytes`, a multiple of
/// 16, both 16-byte aligned and not overlapping.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
unsafe fn copy16(dst: *mut u8, src: *const u8, bytes: u32) {
    let mut at = 0usize;
    while at < bytes as usize {
        // SAFETY: `at + 16 <= bytes` (a multiple of 16), inside both ranges
        // and 16-byte aligned (the caller's contract).
        unsafe { super::store16(dst.add(at), super::load16(src.add(at))) };
        at += 16;
    }
}

/// Starts a bulk store of `bytes` from shared `src` to global `dst` (a
/// peer's LSA address works), in the current bulk group.
///
/// # Safety
/// As for [`load_to_shared`], the other way round; `src` must not be
/// overwritten before [`wait_group_read`] says the store has read it.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn store_from_shared(dst: *mut u8, src: *const u8, bytes: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller's contract (as for `load_to_shared`, the other way
    // round): `src` shared and `dst` global, 16-byte aligned, valid for
    // `bytes`; the caller keeps `src` unchanged until `wait_group_read`.
    unsafe {
        asm!("{{ .reg .u64 a; .reg .u32 s; cvta.to.shared.u64 a, {s}; cvt.u32.u64 s, a; cp.async.bulk.global.shared::cta.bulk_group [{d}], [s], {n}; }}",
             d = in(reg64) dst, s = in(reg64) src, n = in(reg32) bytes, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller's contract: `src` valid for reads and `dst` for
    // writes of `bytes`, both 16-byte aligned; shared and global memory do
    // not overlap.
    unsafe {
        copy16(dst, src, bytes)
    };
}

/// Closes the current bulk group of stores.
#[inline(always)]
pub fn commit_group() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: closes the thread's bulk group; no operands, no memory accessed.
    unsafe {
        asm!("cp.async.bulk.commit_group;", options(nostack));
    }
}

/// Waits until at most `N` bulk groups still *read* their shared memory.
#[inline(always)]
pub fn wait_group_read<const N: u32>() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: waits on the thread's own bulk groups; a constant operand, no memory accessed.
    unsafe {
        asm!("cp.async.bulk.wait_group.read {n};", n = const N, options(nostack));
    }
}

/// Waits until at most `N` bulk groups are incomplete (their writes done).
#[inline(always)]
pub fn wait_group<const N: u32>() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: waits on the thread's own bulk groups; a constant operand, no memory accessed.
    unsafe {
        asm!("cp.async.bulk.wait_group {n};", n = const N, options(nostack));
    }
}

/// Orders the async proxy's completed accesses (bulk stores) before the
/// calling thread's later generic accesses (e.g. a release that publishes them).
#[inline(always)]
pub fn fence_proxy_async() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence: no operands, no memory-safety preconditions.
    unsafe {
        asm!("fence.proxy.async;", options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}
