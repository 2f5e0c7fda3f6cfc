//! Low-latency broadcast and reduce ([`Algorithm::Ll`](super::Algorithm::Ll)
//! for these two): no barrier. Each 8 bytes of payload travel with two
//! copies of a flag in one 16-byte store, as in the LL all-reduce, over
//! **channels**: the channel from rank `a` to rank `b` is `b`'s slot for
//! messages from `a` (one message at a time), with credit flow control.
//!
//! - Every rank counts its LL broadcasts and reduces (a word in its
//!   scratch); call `k` sends flag `k` (0 is never a flag: the slots start
//!   zeroed). Every rank makes the same calls, so a receiver knows the flag
//!   to wait for without being told.
//! - A sender remembers the flag it last sent on each channel, and the
//!   receiver acknowledges each message it consumed by storing its flag
//!   (with release, after its reads) into the sender's word for that
//!   channel. Before storing into a slot, the sender waits (acquire) until
//!   the acknowledgement equals what it last sent there: the slot is free.
//! - Broadcast: the root sends the message to every peer; reduce: every
//!   rank but the root sends its input to the root, which reduces the
//!   slots and its own input word by word in rank order.
//!
//! In steady state the acknowledgement arrived long before the next call
//! (it travels while the sender's next launch is queued), so a call should
//! cost the launch and one NVLink crossing, where a barrier-based one costs
//! a barrier round trip more. Measured on 2 × H200 in CUDA graphs, 8 bytes:
//! broadcast 2.7 µs against the direct algorithm's 4.3, reduce 5.3 against
//! 6.9 (`benches/results/2026-11-26-h200x2-one-barrier.md`; an earlier
//! measurement saw no gain while counting flags cost 33 barriers and every
//! launch copied its arguments to local memory), so
//! [`Algorithm::choose_rooted`](super::Algorithm::choose_rooted) picks it
//! for small single-part calls. The credit makes reuse safe whatever the order of roots
//! and calls: the slot of channel `a → b` is written again only after `b`
//! acknowledged the message in it.
//!
//! Part 0 of a grid moves the whole message (LL messages are small: at most
//! [`CollContext::ll_bytes`]); the other parts have nothing to do.

use super::element::Element;
use super::ll::{next_count, read_word, reduce_word, store_flagged, wait_flagged, write_word};
use super::op::Reduction;
use super::{check_part, CollContext, CollError, Part};
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::wait::{self, Deadline};
use core::mem::size_of;

/// The flag of this rank's next LL broadcast or reduce, to every thread
/// of the coop (this rank's count of them, one higher).
///
/// # Safety
/// `ctx` live.
#[inline(always)]
unsafe fn next_flag<C: Coop>(coop: &C, ctx: &CollContext) -> u32 {
    // SAFETY: this rank's own count word, touched only by leaders of this
    // context's LL broadcasts and reduces, one at a time.
    unsafe { next_count(coop, ctx.scratch().local_ptr::<u32>(ctx.ll_chan_word_offset(2, 0))) }
}

/// Waits (leader) until channel `me → to`'s slot is free: `to`
/// acknowledged the flag last sent on it; then records `flag` as sent.
///
/// # Safety
/// `ctx` live, `to` an LSA rank.
#[inline(always)]
unsafe fn take_credit(ctx: &CollContext, to: u32, flag: u32, deadline: &mut Deadline) -> Result<(), CollError> {
    let scratch = ctx.scratch();
    let sent = scratch.local_ptr::<u32>(ctx.ll_chan_word_offset(0, to));
    let acked = scratch.local_ptr::<u32>(ctx.ll_chan_word_offset(1, to)) as *const u32;
    // SAFETY: this rank's words about `to`: `sent` written only by this
    // rank's leader, `acked` by `to`'s with release; both only atomically.
    unsafe {
        let last = atomic::load_relaxed(sent, Scope::Gpu);
        wait::wait_until(acked, Scope::Sys, deadline, |a| a == last)?;
        atomic::store_relaxed(sent, flag, Scope::Gpu);
    }
    Ok(())
}

/// Acknowledges (leader, after the coop's reads of the slot) the message
/// with `flag` from `from`.
///
/// # Safety
/// `ctx` live, `from` an LSA rank other than this one.
#[inline(always)]
unsafe fn acknowledge(ctx: &CollContext, from: u32, flag: u32) {
    let me = ctx.scratch().lsa_rank();
    let at = ctx.scratch().lsa_ptr::<u32>(ctx.ll_chan_word_offset(1, me), from);
    // SAFETY: `from`'s word about this rank, written only by this rank
    // (atomically); the release orders the coop's reads before it (they
    // synced before this call).
    unsafe { atomic::store_release(at, flag, Scope::Sys) };
}

/// `dst = src_root` (`bytes` bytes) on every rank over the LL channels (see
/// the module docs).
///
/// # Safety
/// As for [`super::broadcast`]; `src` (on the root) and `dst` local, `dst`
/// equal to `src` or not overlapping it.
// The LL path is inlined into the kernels that call it: a call out
// of line would take the context by reference, and a kernel parameter
// whose address escapes is copied to local memory at the kernel's entry
// (see `devcomm-kernels`' `coll` module).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn broadcast<C: Coop>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const u8,
    dst: *mut u8,
    bytes: usize,
    root: u32,
) -> Result<(), CollError> {
    check_part(ctx, part)?;
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    if root >= n {
        return Err(CollError::BadArgument);
    }
    if bytes as u64 > ctx.ll_bytes() {
        return Err(CollError::TooLarge);
    }
    if bytes == 0 || part.index != 0 {
        return Ok(());
    }
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let words = bytes.div_ceil(8);
    let mut deadline = Deadline::new(&ctx.comm().abort());
    // SAFETY: `ctx` live (the contract).
    let flag = unsafe { next_flag(coop, ctx) };
    let result = if me == root {
        let mut credit = Ok(());
        if coop.is_leader() {
            for k in 1..n {
                // SAFETY: `(me + k) % n` is an LSA rank.
                credit = credit.and_then(|()| unsafe { take_credit(ctx, (me + k) % n, flag, &mut deadline) });
            }
        }
        coop.agree(credit)?;
        let mut w = t;
        while w < words {
            // SAFETY: `8w < bytes`: inside `src`.
            let v = unsafe { read_word(src, bytes, w) };
            for k in 1..n {
                let peer = (me + k) % n;
                let slot = ctx.scratch().lsa_ptr::<u64>(ctx.ll_chan_slot_offset(me), peer);
                // SAFETY: `peer`'s slot for this rank holds `2 * ll_bytes >=
                // 16 * words` bytes (checked above), 16-byte aligned, only
                // accessed atomically; free (the credit above).
                unsafe { store_flagged(slot.add(2 * w), v, flag) };
            }
            if !core::ptr::eq(dst as *const u8, src) {
                // SAFETY: `8w < bytes`: inside `dst`; word `w` is this thread's.
                unsafe { write_word(dst, bytes, w, v) };
            }
            w += nt;
        }
        Ok(())
    } else {
        let slot = ctx.scratch().local_ptr::<u64>(ctx.ll_chan_slot_offset(root)) as *const u64;
        let mut r = Ok(());
        let mut w = t;
        while w < words {
            // SAFETY: this rank's slot for the root, word pair `w` (in
            // bounds as above), only accessed atomically.
            match unsafe { wait_flagged(slot.add(2 * w), flag, &mut deadline) } {
                // SAFETY: `8w < bytes`: inside `dst`; word `w` is this thread's.
                Ok(v) => unsafe { write_word(dst, bytes, w, v) },
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
            w += nt;
        }
        r
    };
    let result = coop.agree(result);
    if result.is_ok() && me != root && coop.is_leader() {
        // SAFETY: `root` is another LSA rank; the coop's reads of the slot
        // are done (the sync above).
        unsafe { acknowledge(ctx, root, flag) };
    }
    result
}

/// `dst = red over the LSA ranks of src` (`count` elements) on the root,
/// over the LL channels (see the module docs).
///
/// # Safety
/// As for [`super::reduce`], which checked `part` and `root`; `src` and (on
/// the root) `dst` local, `dst` equal to `src` or not overlapping it.
// The LL path is inlined into the kernels that call it: a call out
// of line would take the context by reference, and a kernel parameter
// whose address escapes is copied to local memory at the kernel's entry
// (see `devcomm-kernels`' `coll` module).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
    root: u32,
) -> Result<(), CollError> {
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    let bytes = count * size_of::<T>();
    if bytes as u64 > ctx.ll_bytes() {
        return Err(CollError::TooLarge);
    }
    if bytes == 0 || part.index != 0 {
        return Ok(());
    }
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let words = bytes.div_ceil(8);
    let (src8, dst8) = (src as *const u8, dst as *mut u8);
    let mut deadline = Deadline::new(&ctx.comm().abort());
    // SAFETY: `ctx` live (the contract).
    let flag = unsafe { next_flag(coop, ctx) };
    let result = if me != root {
        let credit = if coop.is_leader() {
            // SAFETY: `root` is an LSA rank.
            unsafe { take_credit(ctx, root, flag, &mut deadline) }
        } else {
            Ok(())
        };
        coop.agree(credit)?;
        let slot = ctx.scratch().lsa_ptr::<u64>(ctx.ll_chan_slot_offset(me), root);
        let mut w = t;
        while w < words {
            // SAFETY: `8w < bytes`: inside `src`; the root's slot for this
            // rank as in `broadcast`, free (the credit above).
            unsafe { store_flagged(slot.add(2 * w), read_word(src8, bytes, w), flag) };
            w += nt;
        }
        Ok(())
    } else {
        let mut r = Ok(());
        let mut w = t;
        while w < words {
            let out = reduce_word(red, n, |p| {
                if p == me {
                    // SAFETY: `8w < bytes`: inside `src`.
                    Ok(unsafe { read_word(src8, bytes, w) })
                } else {
                    let slot = ctx.scratch().local_ptr::<u64>(ctx.ll_chan_slot_offset(p)) as *const u64;
                    // SAFETY: this rank's slot for `p`, word pair `w` (in
                    // bounds as above), only accessed atomically.
                    unsafe { wait_flagged(slot.add(2 * w), flag, &mut deadline) }
                }
            });
            match out {
                // SAFETY: `8w < bytes`: inside `dst`; word `w` is this
                // thread's (and read from `src` by this thread alone, in
                // place).
                Ok(v) => unsafe { write_word(dst8, bytes, w, v) },
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
            w += nt;
        }
        r
    };
    let result = coop.agree(result);
    if result.is_ok() && me == root && coop.is_leader() {
        for k in 1..n {
            // SAFETY: `(me + k) % n` is another LSA rank; the coop's reads
            // of its slot are done (the sync above).
            unsafe { acknowledge(ctx, (me + k) % n, flag) };
        }
    }
    result
}
