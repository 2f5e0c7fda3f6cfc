//! Low-latency all-reduce: no barrier; every 8 bytes of payload travel
//! with two copies of a flag in one 16-byte store (as NCCL's LL protocol),
//! so their arrival is the signal.
//!
//! Each rank stores its input into slot `[seq & 1][me]` of every peer's LL
//! area with flag `seq`, then reduces, word by word, its own input and the
//! slots `[seq & 1][p]` once both flags of a word read `seq`. Reuse is safe
//! with two parities: a rank writes parity `seq & 1` again only at call
//! `seq + 2`, after it received every peer's call `seq + 1`, which each
//! peer sent after it finished reading its call-`seq` slots.
//!
//! The numbers come from the caller (the host's
//! `Collectives::next_seq`, the same on every rank) or, with `seq == 0`,
//! from the device: the coop's leader counts this rank's such calls in its
//! scratch ([`next_count`]), so a launch captured into a CUDA graph
//! numbers each replay afresh. The two kinds have slots of their own: a
//! sequence only stays consecutive among calls numbered alike.

use super::element::Element;
use super::op::Reduction;
use super::pack::each_lane;
use super::{CollContext, CollError, Part};
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::wait::Deadline;
use core::mem::size_of;

/// Payload word `w` (8 bytes, zero-padded past `bytes`) of `src`.
///
/// # Safety
/// `src` valid for `bytes`, `8 * w < bytes`.
#[inline(always)]
pub(crate) unsafe fn read_word(src: *const u8, bytes: usize, w: usize) -> u64 {
    let at = w * 8;
    if at + 8 <= bytes && (src as usize) % 8 == 0 {
        // SAFETY: 8 bytes inside `src`, aligned (both `src` and `at` are
        // multiples of 8).
        unsafe { (src.add(at) as *const u64).read_volatile() }
    } else {
        let mut v = 0u64;
        for k in 0..(bytes - at).min(8) {
            // SAFETY: `at + k < bytes`.
            v |= (unsafe { src.add(at + k).read_volatile() } as u64) << (8 * k);
        }
        v
    }
}

/// Stores the valid bytes of payload word `w` to `dst`.
///
/// # Safety
/// `dst` valid for `bytes`, `8 * w < bytes`, the bytes the caller's alone.
#[inline(always)]
pub(crate) unsafe fn write_word(dst: *mut u8, bytes: usize, w: usize, v: u64) {
    let at = w * 8;
    if at + 8 <= bytes && (dst as usize) % 8 == 0 {
        // SAFETY: as in `read_word`.
        unsafe { (dst.add(at) as *mut u64).write_volatile(v) }
    } else {
        for k in 0..(bytes - at).min(8) {
            // SAFETY: `at + k < bytes`.
            unsafe { dst.add(at + k).write_volatile((v >> (8 * k)) as u8) };
        }
    }
}

/// Element `l` of an 8-byte payload word (by shifts).
#[inline(always)]
pub(crate) fn lane<T: Element>(v: u64, l: usize) -> T {
    T::from_bits64(v >> ((l * size_of::<T>() * 8) % 64))
}

/// Stores payload `v` with `flag` in both halves into the 16-byte LL word
/// pair at `at` (one store: the reader sees both flags or neither).
///
/// # Safety
/// `at` valid, 16-byte aligned, accessed only atomically.
#[inline(always)]
pub(crate) unsafe fn store_flagged(at: *mut u64, v: u64, flag: u32) {
    let f = (flag as u64) << 32;
    // SAFETY: the caller's contract.
    unsafe { atomic::store_pair_relaxed(at, [(v & 0xffff_ffff) | f, (v >> 32) | f], Scope::Sys) };
}

/// The payload of the LL word pair at `at` once both halves carry `flag`.
///
/// # Safety
/// As for [`store_flagged`].
#[inline(always)]
pub(crate) unsafe fn poll_flagged(at: *const u64, flag: u32) -> Option<u64> {
    let f = (flag as u64) << 32;
    // SAFETY: the caller's contract.
    let (lo, hi) = unsafe { (atomic::load_relaxed(at, Scope::Sys), atomic::load_relaxed(at.add(1), Scope::Sys)) };
    (lo & !0xffff_ffff == f && hi & !0xffff_ffff == f).then_some((lo & 0xffff_ffff) | (hi << 32))
}

/// Spins until the LL word pair at `at` carries `flag`; its payload.
///
/// # Safety
/// As for [`store_flagged`].
#[inline(always)]
pub(crate) unsafe fn wait_flagged(at: *const u64, flag: u32, deadline: &mut Deadline) -> Result<u64, CollError> {
    loop {
        // SAFETY: the caller's contract.
        if let Some(v) = unsafe { poll_flagged(at, flag) } {
            return Ok(v);
        }
        deadline.poll().map_err(CollError::Wait)?;
    }
}

/// The reduction of the 8-byte payload words `word(p)` of ranks `p < n`,
/// lane by lane in rank order (the same bits on every rank); the first
/// error of `word` ends it.
#[inline(always)]
pub(crate) fn reduce_word<T: Element>(
    red: &Reduction<T>,
    n: u32,
    mut word: impl FnMut(u32) -> Result<u64, CollError>,
) -> Result<u64, CollError> {
    let lanes = 8 / size_of::<T>();
    let mut acc = [red.first(lane::<T>(0, 0)); 16]; // 16: `each_lane!` covers up to 16 lanes (8 used at most)
    for p in 0..n {
        let v = word(p)?;
        each_lane!(lanes, |l| {
            let x = lane::<T>(v, l);
            acc[l] = if p == 0 { red.first(x) } else { red.step(acc[l], x) };
        });
    }
    let mut out = 0u64;
    each_lane!(lanes, |l| {
        let bits = red.finish(acc[l]).to_bits64();
        let width = size_of::<T>() * 8;
        let bits = if width == 64 { bits } else { bits & ((1u64 << width) - 1) };
        out |= bits << (l * width);
    });
    Ok(out)
}

/// The next value (one more, skipping 0) of this rank's counter at `at`,
/// to every thread of the coop: every thread reads the counter, the coop
/// synchronises (all have read), then the leader stores the value. One
/// barrier: handing a value out with `Coop::sync_max` took 33 on a CTA
/// (1.8 µs a call on an H200, `benches/results/2026-11-26-h200x2-graphs.md`).
/// The next call's reads come after this call's closing `agree`, a barrier
/// that orders the leader's store before them.
///
/// # Safety
/// `at` is a `u32` of this rank's scratch accessed only this way, by one
/// coop at a time.
#[inline(always)]
pub(crate) unsafe fn next_count<C: Coop>(coop: &C, at: *mut u32) -> u32 {
    // SAFETY: the caller's contract.
    let value = match unsafe { atomic::load_relaxed(at, Scope::Gpu) }.wrapping_add(1) {
        0 => 1,
        v => v,
    };
    coop.sync();
    if coop.is_leader() {
        // SAFETY: as above; every thread of the coop has read the counter.
        unsafe { atomic::store_relaxed(at, value, Scope::Gpu) };
    }
    value
}

/// The LL all-reduce (see the module docs).
///
/// # Safety
/// As for [`super::all_reduce`]; `src` and `dst` are local.
// The LL path is inlined into the kernels that call it: a call out
// of line would take the context by reference, and a kernel parameter
// whose address escapes is copied to local memory at the kernel's entry
// (see `devcomm-kernels`' `coll` module).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn all_reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
    seq: u32,
) -> Result<(), CollError> {
    let bytes = count * size_of::<T>();
    if bytes as u64 > ctx.ll_bytes() {
        return coop.agree(Err(CollError::TooLarge));
    }
    if seq == 0 && part.count != 1 {
        return coop.agree(Err(CollError::BadArgument));
    }
    let counted = seq == 0;
    let seq = if counted {
        // SAFETY: this rank's counted-call word (`ctx` live: the contract).
        unsafe { next_count(coop, ctx.scratch().local_ptr::<u32>(ctx.ll_counted_seq_offset())) }
    } else {
        seq
    };
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    let words = bytes.div_ceil(8);
    let (wb, we) = super::staging::piece(words, 1, part.count as usize, part.index as usize);
    let (src8, dst8) = (src as *const u8, dst as *mut u8);
    let slot = |peer: u32, from: u32| -> *mut u64 {
        let at = if counted { ctx.ll_counted_slot_offset(seq, from) } else { ctx.ll_slot_offset(seq, from) };
        ctx.scratch().lsa_ptr(at, peer)
    };
    // Send: word `w` of the input to every peer.
    let mut w = wb + t;
    while w < we {
        // SAFETY: `8w < bytes`: inside `src` (the contract).
        let v = unsafe { read_word(src8, bytes, w) };
        for k in 1..n {
            let peer = (me + k) % n;
            // SAFETY: slot `[seq & 1][me]` of `peer` holds `2 * ll_bytes
            // >= 2 * 8 * words` bytes (checked above), 16-byte aligned (the
            // context's contract); slots are accessed only atomically.
            unsafe { store_flagged(slot(peer, me).add(2 * w), v, seq) };
        }
        w += nt;
    }
    // Receive and reduce, in rank order (the same bits on every rank).
    let mut deadline = Deadline::new(&ctx.comm().abort());
    let mut result = Ok(());
    let mut w = wb + t;
    while w < we {
        let out = reduce_word(red, n, |p| {
            if p == me {
                // SAFETY: as for the send.
                Ok(unsafe { read_word(src8, bytes, w) })
            } else {
                // SAFETY: the caller's own slot `[seq & 1][p]`, word pair
                // `w` (in bounds as above), only accessed atomically.
                unsafe { wait_flagged(slot(me, p).wrapping_add(2 * w), seq, &mut deadline) }
            }
        });
        match out {
            // SAFETY: `8w < bytes`, inside `dst`; word `w` is this thread's.
            Ok(v) => unsafe { write_word(dst8, bytes, w, v) },
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        w += nt;
    }
    coop.agree(result)
}
