//! Moving data to and from LSA peers, and signalling them.
//!
//! Pointers come from [`WindowDesc::lsa_ptr`](crate::comm::WindowDesc::lsa_ptr)
//! (or [`SymPtr`](crate::comm::SymPtr)); a local pointer works as well, so
//! the same copy serves put (local → peer) and get (peer → local).

use crate::arch::{self, bulk, load16, store16};
use crate::atomic::{self, Scope};
use crate::comm::{AbortInfo, WindowDesc};
use crate::coop::Coop;
use crate::wait::{self, Deadline, WaitError};

/// 16-byte vectors each thread keeps in flight in [`copy`].
pub const UNROLL: usize = 4;

/// Copies `bytes` from `src` to `dst`, spread over the threads of `coop`.
///
/// When both addresses are 16-byte aligned the bulk moves as 16-byte
/// vectors, [`UNROLL`] loads in flight per thread before their stores, with
/// consecutive threads on consecutive vectors; the tail (and misaligned
/// copies) moves in 8-byte words where aligned, else byte by byte. The copy
/// is *not* followed by a `coop.sync()`: callers that need the data visible
/// to the peer follow it with a barrier or a [`signal_add`] with release.
///
/// # Safety
/// `src` and `dst` are valid for `bytes` bytes and do not overlap; every
/// thread of `coop` calls with the same arguments.
#[inline]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn copy<C: Coop>(coop: &C, dst: *mut u8, src: *const u8, bytes: usize) {
    // SAFETY: the caller's contract (valid, non-overlapping `src`/`dst`, same
    // arguments on every thread of `coop`); the coop's thread ranks are
    // `0..size`, each once, as `copy_strided` requires.
    unsafe { copy_strided(coop.thread_rank() as usize, coop.size() as usize, dst, src, bytes) }
}

/// [`copy_strided`] with `U` (1 to 16) 16-byte vectors in flight per
/// thread in every step, the last step too (its loads guarded): a copy of
/// a few rows by a few warps, latency-bound, moves each row in
/// `vectors / (U * n)` round trips instead of [`copy_strided`]'s whole
/// groups of [`UNROLL`] then one vector at a time. The MoE high-throughput
/// kernels copy their tokens with it.
///
/// # Safety
/// As for [`copy_strided`].
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn copy_strided_by<const U: usize>(t: usize, n: usize, dst: *mut u8, src: *const u8, bytes: usize) {
    let aligned16 = (dst as usize | src as usize) % 16 == 0;
    let vec_bytes = if aligned16 { bytes / 16 * 16 } else { 0 };
    let vectors = vec_bytes / 16;
    let mut base = t;
    while base < vectors {
        let mut v = [[0u32; 4]; U];
        crate::coll::pack::each_lane!(U, |u| {
            let i = base + u * n;
            if i < vectors {
                // SAFETY: `i < vectors`: vector `i` lies in `src[..vec_bytes]`
                // (the caller's contract), 16-byte aligned (`aligned16`).
                v[u] = unsafe { load16(src.add(i * 16)) };
            }
        });
        crate::coll::pack::each_lane!(U, |u| {
            let i = base + u * n;
            if i < vectors {
                // SAFETY: as for the load, the same vector of `dst`; vector
                // `i` is thread `t`'s alone (`i % n == t`).
                unsafe { store16(dst.add(i * 16), v[u]) };
            }
        });
        base += U * n.max(1);
    }
    // SAFETY: the rest (`vec_bytes <= bytes`) of both buffers, no whole
    // vectors in it: `copy_strided`'s word and byte tail.
    unsafe { copy_strided(t, n, dst.add(vec_bytes), src.add(vec_bytes), bytes - vec_bytes) };
}

/// [`copy_strided_by`] of `P` rows at once (pair `p`: `bytes` from
/// `src[p]` to `dst[p]`): every row's `U` vectors of a step are loaded
/// before any is stored, `P * U` in flight per thread. Copies of a few
/// rows one after another wait a round trip each; `P` together wait one
/// (the MoE high-throughput pack copies its tokens two at a time).
///
/// # Safety
/// As for [`copy_strided`], for each pair; no destination overlaps
/// another pair's source or destination.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn copy_rows_strided_by<const U: usize, const P: usize>(
    t: usize,
    n: usize,
    dst: [*mut u8; P],
    src: [*const u8; P],
    bytes: usize,
) {
    let mut aligned16 = true;
    crate::coll::pack::each_lane!(P, |p| {
        aligned16 &= (dst[p] as usize | src[p] as usize) % 16 == 0;
    });
    let vec_bytes = if aligned16 { bytes / 16 * 16 } else { 0 };
    let vectors = vec_bytes / 16;
    let mut base = t;
    while base < vectors {
        let mut v = [[[0u32; 4]; U]; P];
        crate::coll::pack::each_lane!(P, |p| {
            crate::coll::pack::each_lane!(U, |u| {
                let i = base + u * n;
                if i < vectors {
                    // SAFETY: `i < vectors`: vector `i` of row `p`'s
                    // `src[..vec_bytes]`, 16-byte aligned (`aligned16`).
                    v[p][u] = unsafe { load16(src[p].add(i * 16)) };
                }
            });
        });
        crate::coll::pack::each_lane!(P, |p| {
            crate::coll::pack::each_lane!(U, |u| {
                let i = base + u * n;
                if i < vectors {
                    // SAFETY: as for the load, the same vector of `dst[p]`,
                    // thread `t`'s alone (`i % n == t`).
                    unsafe { store16(dst[p].add(i * 16), v[p][u]) };
                }
            });
        });
        base += U * n.max(1);
    }
    crate::coll::pack::each_lane!(P, |p| {
        // SAFETY: the rest of row `p` (`vec_bytes <= bytes`), no whole
        // vectors in it: `copy_strided`'s word and byte tail.
        unsafe { copy_strided(t, n, dst[p].add(vec_bytes), src[p].add(vec_bytes), bytes - vec_bytes) };
    });
}

/// A copy from one source to several destinations, begun: thread `t` of
/// `n`'s first `U` 16-byte vectors of `src[..bytes]` loaded
/// ([`CopyAhead::load`]), before the destinations are known; then
/// [`CopyAhead::store`] copies the thread's share to each destination,
/// loading each vector once (the MoE low-latency dispatch sends a token to
/// every LSA rank whose experts it names this way). A caller whose
/// destinations depend on a load of their own can make that load between
/// the two, so the round trips overlap. (Tried for the pushed one-shot
/// all-reduce, whose staging area depends on the barrier epoch's load, in
/// session 20: no gain measured on 2 × H200, 12.77 µs at 2 MiB graphed
/// against 12.6–12.9; not kept there.)
pub(crate) struct CopyAhead<const U: usize> {
    v: [[u32; 4]; U],
    t: usize,
    n: usize,
    src: *const u8,
    bytes: usize,
    vectors: usize,
}

impl<const U: usize> CopyAhead<U> {
    /// Loads thread `t` of `n`'s first `U` vectors of `src[..bytes]`
    /// (none unless `src` is 16-byte aligned).
    ///
    /// # Safety
    /// `src` is valid for reads of `bytes` bytes; `t < n`.
    #[inline(always)]
    pub(crate) unsafe fn load(t: usize, n: usize, src: *const u8, bytes: usize) -> Self {
        let n = n.max(1);
        let vectors = if src as usize % 16 == 0 { bytes / 16 } else { 0 };
        let mut v = [[0u32; 4]; U];
        crate::coll::pack::each_lane!(U, |u| {
            let i = t + u * n;
            if i < vectors {
                // SAFETY: `i < vectors`: vector `i` lies in `src[..bytes]`
                // (the contract), 16-byte aligned.
                v[u] = unsafe { load16(src.add(i * 16)) };
            }
        });
        CopyAhead { v, t, n, src, bytes, vectors }
    }

    /// Copies the thread's share of the source to every `dst(j)`, `j < m`,
    /// that is `Some` ([`copy_strided`] for each when a destination is not
    /// 16-byte aligned, or the source was not).
    ///
    /// # Safety
    /// As for [`copy_strided`] with this copy's source, for every
    /// destination `dst(j)` that is `Some` (none overlapping the source or
    /// another); `dst(j)` returns the same on every call; every thread of
    /// the `n` calls with the same `m` and destinations.
    #[inline(always)]
    pub(crate) unsafe fn store(self, m: usize, dst: impl Fn(usize) -> Option<*mut u8>) {
        // SAFETY: the contract; `false`: the destinations are checked.
        unsafe { self.store_to(m, dst, false) }
    }

    /// [`CopyAhead::store`], told by the caller whether every destination
    /// is 16-byte aligned (`aligned`: no check of each, a round of
    /// `dst(j)` calls that the MoE receive paid a shuffle each for).
    ///
    /// # Safety
    /// As for [`CopyAhead::store`]; with `aligned`, every `Some` `dst(j)`
    /// is 16-byte aligned.
    #[inline(always)]
    pub(crate) unsafe fn store_to(self, m: usize, dst: impl Fn(usize) -> Option<*mut u8>, aligned: bool) {
        let CopyAhead { mut v, t, n, src, bytes, vectors } = self;
        if vectors == 0 || (!aligned && (0..m).any(|j| dst(j).is_some_and(|d| d as usize % 16 != 0))) {
            for j in 0..m {
                if let Some(d) = dst(j) {
                    // SAFETY: the contract, destination `j`.
                    unsafe { copy_strided_cold(t, n, d, src, bytes) };
                }
            }
            return;
        }
        let mut base = t;
        loop {
            for j in 0..m {
                if let Some(d) = dst(j) {
                    crate::coll::pack::each_lane!(U, |u| {
                        let i = base + u * n;
                        if i < vectors {
                            // SAFETY: vector `i < vectors` of destination
                            // `j`, 16-byte aligned (checked above); vector
                            // `i` is thread `t`'s alone (`i % n == t`).
                            unsafe { store16(d.add(i * 16), v[u]) };
                        }
                    });
                }
            }
            base += U * n;
            if base >= vectors {
                break;
            }
            crate::coll::pack::each_lane!(U, |u| {
                let i = base + u * n;
                if i < vectors {
                    // SAFETY: as in `load`.
                    v[u] = unsafe { load16(src.add(i * 16)) };
                }
            });
        }
        let done = vectors * 16;
        if done == bytes {
            return;
        }
        for j in 0..m {
            if let Some(d) = dst(j) {
                // SAFETY: the bytes after the whole vectors (`done <= bytes`)
                // of the source and destination `j`.
                unsafe { copy_strided_cold(t, n, d.add(done), src.add(done), bytes - done) };
            }
        }
    }
}

/// [`copy_strided`] kept out of line, for the paths of the vector copies
/// that rarely run (a source or destination not 16-byte aligned, bytes
/// past the last whole vector): inlined, each call site added a copy of
/// its four loops to kernels whose instruction fetch already stalled them
/// (the MoE low-latency dispatch had six such copies beside its hot code:
/// 35 % of its warp samples waited for instructions on one H200, session
/// 36).
///
/// # Safety
/// As for [`copy_strided`].
#[inline(never)]
pub(crate) unsafe fn copy_strided_cold(t: usize, n: usize, dst: *mut u8, src: *const u8, bytes: usize) {
    // SAFETY: the contract.
    unsafe { copy_strided(t, n, dst, src, bytes) }
}

/// The work of thread `t` of `n` threads copying `bytes` from `src` to
/// `dst` together (any set of threads: a coop, or a whole grid with `t` the
/// global thread index). See [`copy`].
///
/// # Safety
/// As for [`copy`]; the `n` threads use `t = 0..n` once each.
#[inline]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn copy_strided(t: usize, n: usize, dst: *mut u8, src: *const u8, bytes: usize) {
    let aligned16 = (dst as usize | src as usize) % 16 == 0;
    let vec_bytes = if aligned16 { bytes / 16 * 16 } else { 0 };
    let vectors = vec_bytes / 16;
    // Whole groups: each thread moves UNROLL vectors per step.
    let step = n * UNROLL;
    let groups = vectors / step;
    for g in 0..groups {
        let base = g * step + t;
        let mut v = [[0u32; 4]; UNROLL];
        for (u, slot) in v.iter_mut().enumerate() {
            // SAFETY: vector `base + u * n` < `groups * step <= vectors`, so
            // its 16 bytes lie in `src[..vec_bytes]`, valid by the caller's
            // contract; `aligned16` holds, so the address is 16-byte aligned.
            *slot = unsafe { load16(src.add((base + u * n) * 16)) };
        }
        for (u, slot) in v.iter().enumerate() {
            // SAFETY: as for the load: the same vector of `dst`, in bounds and
            // 16-byte aligned; each vector index belongs to one thread only
            // (`t` distinct in `0..n`), so no two threads write it.
            unsafe { store16(dst.add((base + u * n) * 16), *slot) };
        }
    }
    let mut i = groups * step + t;
    while i < vectors {
        // SAFETY: `i < vectors`, so vector `i` is inside both buffers and
        // 16-byte aligned (`aligned16`); vector `i` is this thread's alone.
        unsafe { store16(dst.add(i * 16), load16(src.add(i * 16))) };
        i += n;
    }
    // Tail: 8-byte words when both ends allow, then single bytes.
    // SAFETY: both blocks: `vec_bytes <= bytes`, so the offsets stay inside (or one
    // past the end of) the buffers the caller guarantees.
    let (d, s) = (unsafe { dst.add(vec_bytes) }, unsafe { src.add(vec_bytes) });
    let rest = bytes - vec_bytes;
    let words = if (d as usize | s as usize) % 8 == 0 { rest / 8 } else { 0 };
    let mut w = t;
    while w < words {
        // SAFETY: `w < words = rest / 8`, so word `w` lies in the last `rest`
        // bytes of both buffers, and both `d` and `s` are 8-byte aligned
        // (`words` is 0 otherwise); word `w` is this thread's alone.
        unsafe { arch::store_volatile((d as *mut u64).add(w), arch::load_volatile((s as *const u64).add(w))) };
        w += n;
    }
    let mut b = words * 8 + t;
    while b < rest {
        // SAFETY: `b < rest`, so byte `b` lies in the last `rest` bytes of
        // both buffers; byte `b` is this thread's alone.
        unsafe { arch::store_volatile(d.add(b), arch::load_volatile(s.add(b))) };
        b += n;
    }
}

/// Shared memory [`copy_bulk`] needs for `stages` chunks of `chunk` bytes.
pub const fn copy_bulk_smem_bytes(chunk: u32, stages: u32) -> u32 {
    chunk * stages + 8 * stages
}

/// Copies `bytes` from `src` to `dst` with the bulk-copy engine (TMA): the
/// coop's leader streams `chunk`-byte pieces global → shared → global through
/// `stages` buffers at `smem`, keeping loads ahead of stores; the other
/// threads copy the non-16-byte tail. Returns after every store completed
/// and the coop joined, so `smem` can be reused and a following release
/// (signal) publishes the data.
///
/// Falls back to [`copy`] when `dst` or `src` is not 16-byte aligned.
///
/// # Safety
/// As for [`copy`]; `smem` is this block's shared memory, 16-byte aligned,
/// [`copy_bulk_smem_bytes`]`(chunk, stages)` long and not otherwise in use;
/// `chunk` is a non-zero multiple of 16 and `stages >= 2`.
#[inline]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn copy_bulk<C: Coop>(
    coop: &C,
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    smem: *mut u8,
    chunk: u32,
    stages: u32,
) {
    // SAFETY: the caller's contract is `copy_bulk_strided`'s, and one coop
    // with `first = 0`, `stride = 1` covers every chunk.
    unsafe { copy_bulk_strided(coop, dst, src, bytes, smem, chunk, stages, 0, 1) }
}

/// As [`copy_bulk`], but this coop moves only chunks `first, first + stride,
/// first + 2 * stride, ...` of the copy (and, when `first == 0`, the tail):
/// `stride` coops (e.g. the blocks of a grid, `first` = block index) share
/// one copy with neighbouring chunks in flight at the same time.
///
/// # Safety
/// As for [`copy_bulk`]; `stride >= 1`, `first < stride`, and the `stride`
/// coops use each `first` once.
#[allow(clippy::too_many_arguments)]
#[inline]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn copy_bulk_strided<C: Coop>(
    coop: &C,
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    smem: *mut u8,
    chunk: u32,
    stages: u32,
    first: usize,
    stride: usize,
) {
    if (dst as usize | src as usize) % 16 != 0 || chunk == 0 || chunk % 16 != 0 || stages < 2 || stride == 0 {
        let (t, n) = (coop.thread_rank() as usize, coop.size() as usize);
        // SAFETY: the caller's contract for `src`/`dst`; the `stride` coops
        // (each `first` once) number their threads `first * n + t`, which
        // covers `0..stride * n` once each, as `copy_strided` requires.
        unsafe { copy_strided(first * n + t, stride.max(1) * n, dst, src, bytes) };
        coop.sync();
        return;
    }
    let bulk_bytes = bytes / 16 * 16;
    let total = bulk_bytes.div_ceil(chunk as usize);
    // This coop's chunks, numbered 0.. locally.
    let chunks = if first < total { (total - first).div_ceil(stride) } else { 0 };
    if coop.is_leader() && chunks > 0 {
        // SAFETY: `smem` is `copy_bulk_smem_bytes(chunk, stages)` =
        // `chunk * stages + 8 * stages` bytes (the caller's contract): the
        // mbarriers follow the `stages` buffers, 16-byte aligned since
        // `chunk` is a multiple of 16.
        let bars = unsafe { smem.add((chunk * stages) as usize) } as *mut u64;
        let at = |c: usize| (first + c * stride) * chunk as usize;
        let len = |c: usize| (bulk_bytes - at(c)).min(chunk as usize) as u32;
        // SAFETY: `c % stages < stages`: one of the `stages` buffers of `smem`.
        let buf = |c: usize| unsafe { smem.add((c % stages as usize) * chunk as usize) };
        // SAFETY: `c % stages < stages`: one of the `stages` mbarriers after the buffers.
        let bar = |c: usize| unsafe { bars.add(c % stages as usize) };
        // SAFETY: called only for `c < chunks`, so `at(c) + len(c) <=
        // bulk_bytes <= bytes`: `src.add(at(c))` is valid for `len(c)` bytes
        // (a non-zero multiple of 16 and 16-byte aligned, as `src`, `chunk`
        // and `bulk_bytes` are), `buf(c)` holds `chunk >= len(c)` bytes, and
        // `bar(c)` is initialised (below, before the first load); the
        // expect_tx declares exactly the bytes the load completes on it.
        // `buf(c)` is free: its previous chunk's store has read it
        // (`wait_group_read` before every refill).
        let load = |c: usize| unsafe {
            bulk::mbarrier_arrive_expect_tx(bar(c), len(c));
            bulk::load_to_shared(buf(c), src.add(at(c)), len(c), bar(c));
        };
        for s in 0..stages as usize {
            // SAFETY: mbarrier `s < stages` of `smem`, 8-byte aligned (above),
            // not yet in use: the caller hands `smem` over unused.
            unsafe { bulk::mbarrier_init(bars.add(s), 1) };
        }
        bulk::fence_mbarrier_init();
        for c in 0..chunks.min(stages as usize) {
            load(c);
        }
        for c in 0..chunks {
            let parity = ((c / stages as usize) & 1) as u32;
            // SAFETY: `bar(c)` was initialised above.
            while !unsafe { bulk::mbarrier_try_wait_parity(bar(c), parity) } {}
            // SAFETY: `c < chunks`, so `dst.add(at(c))` is valid for `len(c)`
            // bytes (16-byte aligned, a multiple of 16) by the caller's
            // contract, and `buf(c)` holds chunk `c`, loaded (the wait
            // above); it is not refilled before `wait_group_read` says this
            // store has read it.
            unsafe { bulk::store_from_shared(dst.add(at(c)), buf(c), len(c)) };
            bulk::commit_group();
            // Once the previous chunk's store has read its buffer, refill it.
            if c >= 1 && c - 1 + (stages as usize) < chunks {
                bulk::wait_group_read::<1>();
                load(c - 1 + stages as usize);
            }
        }
        bulk::wait_group::<0>();
        bulk::fence_proxy_async();
    }
    if first == 0 {
        let (t, n) = (coop.thread_rank() as usize, coop.size() as usize);
        let mut b = bulk_bytes + t;
        while b < bytes {
            // SAFETY: `b < bytes`: inside both buffers (the caller's
            // contract); byte `b` is this thread's alone, and the bulk part
            // (`< bulk_bytes`) is not touched here.
            unsafe { arch::store_volatile(dst.add(b), arch::load_volatile(src.add(b))) };
            b += n;
        }
    }
    coop.sync();
}

/// Copies `bytes` from `src` into byte `offset` of every LSA peer's copy of
/// `window` (the caller's own included), spread over `coop`.
///
/// # Safety
/// `offset + bytes <= window.size`; `src` valid for `bytes` and not
/// overlapping bytes `offset..offset + bytes` of any LSA peer's copy of
/// `window` (the caller's own included); every thread of `coop` calls with
/// the same arguments.
#[inline]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn copy_to_all<C: Coop>(coop: &C, window: &WindowDesc, offset: u64, src: *const u8, bytes: usize) {
    for k in 0..window.lsa_size {
        // Start with the next peer, so LSA ranks do not all hit peer 0 first.
        let peer = (window.lsa_rank + 1 + k) % window.lsa_size;
        // SAFETY: `offset + bytes <= window.size` (the caller's contract), so
        // the peer's copy of the window is valid for `bytes` at `offset`;
        // `src` is valid for `bytes` and does not overlap it (also the
        // caller's contract); every thread of `coop` passes the same
        // arguments.
        unsafe { copy(coop, window.lsa_ptr(offset, peer), src, bytes) };
    }
}

/// Stores one value at `dst` (a peer's or a local address) with a volatile
/// store: visible to the peer eventually, ordered with nothing. To publish
/// it, follow it with a release ([`signal_add`], a fence, a barrier of the
/// block followed by a release): without one, a peer that sees a later
/// signal may still read the old value — on a GPU, and on the emulator's
/// strict mode, which delays the store until the thread's next release
/// (see [`arch::store_volatile`]).
///
/// # Safety
/// `dst` is valid and aligned for `T`.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn put_value<T: Copy>(dst: *mut T, value: T) {
    // SAFETY: the caller's contract: `dst` is valid and aligned for `T`.
    unsafe { arch::store_volatile(dst, value) }
}

/// Loads one value at `src` (a peer's or a local address) with a volatile
/// load, ordered with nothing: to read data a peer published, acquire
/// first ([`wait_signal`], an acquire load of its flag, a fence after a
/// relaxed one). On the emulator's strict mode the load is checked for data
/// races: reading a value another thread stored without a release that
/// this thread acquired is reported with both sites (see
/// [`arch::load_volatile`]).
///
/// # Safety
/// `src` is valid and aligned for `T`.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn get_value<T: Copy>(src: *const T) -> T {
    // SAFETY: the caller's contract: `src` is valid and aligned for `T`.
    unsafe { arch::load_volatile(src) }
}

/// Adds `value` to the `u64` signal at `signal` (usually a peer's) with
/// release at system scope: everything the calling thread wrote before —
/// and, after a `coop.sync()`, everything its coop wrote — is visible to a
/// peer that sees the new value with acquire.
///
/// # Safety
/// `signal` is a valid, 8-byte aligned `u64` that is only updated atomically.
#[inline(always)]
pub unsafe fn signal_add(signal: *mut u64, value: u64) {
    // SAFETY: the caller's contract: a valid, aligned `u64` only updated
    // atomically, as `red_add_release` requires.
    unsafe { atomic::red_add_release(signal, value, Scope::Sys) }
}

/// Waits until the `u64` signal at `signal` has reached `least` (wrap-safe),
/// with acquire at system scope; returns the value seen. Gives up on the
/// communicator's abort flag or after `abort.timeout_ns`.
///
/// # Safety
/// As for [`signal_add`].
#[inline(always)]
pub unsafe fn wait_signal(signal: *const u64, least: u64, abort: &AbortInfo) -> Result<u64, WaitError> {
    let mut deadline = Deadline::new(abort);
    // SAFETY: the caller's contract (as for `signal_add`): a valid, aligned
    // `u64` only updated atomically, as `wait_ge_u64` requires.
    unsafe { wait::wait_ge_u64(signal, least, Scope::Sys, &mut deadline) }
}
