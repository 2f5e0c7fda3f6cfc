//! Point-to-point channels: `send` and `recv` between two ranks of the LSA
//! team (`ncclSend` / `ncclRecv`), callable by one CTA or shared by
//! several ([`Part`]).
//!
//! Each ordered pair of ranks (sender → receiver) has a channel: a ring
//! of `p2p_slots` slots of `p2p_chunk` bytes in the **receiver's** scratch
//! (the context's point-to-point area), a flag and a length word per slot
//! beside them, and one credit word per slot in the **sender's** scratch.
//! A message travels as chunks numbered `first_seq, first_seq + 1, …`
//! ([`P2pOp::first_seq`]), chunk `s` in slot `s % p2p_slots`:
//!
//! * the sender waits until the slot's credit reads `s - p2p_slots` (the
//!   receiver is done with the slot's previous chunk), pushes the chunk
//!   into the slot with NVLink stores, writes the message length, joins
//!   its coop, and stores `s` into the slot's flag with release;
//! * the receiver waits (acquire) until the flag reads `s`, checks the
//!   length against its own (a mismatch is [`CollError::CountMismatch`]
//!   on the receiver), copies the chunk out, joins its coop, and stores
//!   `s` into the sender's credit word with release.
//!
//! A send therefore returns once its data sits in the receiver's slots:
//! messages of up to `p2p_slots` chunks complete without the receiver
//! running (eager); longer ones wait for the receive (rendezvous), so two
//! ranks that both send a long message to each other before receiving
//! deadlock unless the sends and receives run at once (one group, one
//! launch: what `devcomm::coll::Group` does). Chunk `i` of a message is
//! done by part `i % part.count`; parts of the two ends need not match.
//! Every message takes at least one chunk (a 0-byte message carries its
//! length), so mismatched counts are reported, not hung on.

use super::{CollContext, CollError, P2pOp, Part};
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::lsa::ops::copy_strided;
use crate::wait::{self, Deadline};

/// Chunks of a `bytes`-byte message on `ctx`'s channels (at least one).
#[inline(always)]
pub const fn p2p_chunks(ctx: &CollContext, bytes: u64) -> u64 {
    if ctx.p2p_chunk() == 0 || bytes == 0 {
        1
    } else {
        bytes.div_ceil(ctx.p2p_chunk())
    }
}

/// Checks the context, part and peer (the same answer on every thread).
#[inline(always)]
fn check(ctx: &CollContext, part: Part, op: &P2pOp) -> Result<(), CollError> {
    if part.count == 0 || part.index >= part.count {
        Err(CollError::PartOutOfRange)
    } else if ctx.p2p_slots() == 0 || op.peer >= ctx.scratch().lsa_size() || op.first_seq == 0 {
        Err(CollError::BadArgument)
    } else {
        Ok(())
    }
}

/// Sends `op.bytes` bytes from local `op.ptr` to LSA rank `op.peer`, which
/// receives them with [`recv`] (see the [module docs](self)). Returns once
/// the coop's chunks sit in the receiver's slots: `op.ptr` may be reused.
///
/// # Safety
/// `ctx` is live with point-to-point channels; `op.ptr` is valid for
/// `op.bytes`; `op.first_seq` follows the channel's earlier chunks, and
/// the receiver's matching [`recv`] uses the same numbers; no other send to
/// `op.peer` runs at the same time (one channel per pair and direction);
/// every thread of `coop` calls with the same arguments.
#[doc(alias = "ncclSend")]
pub unsafe fn send<C: Coop>(coop: &C, ctx: &CollContext, part: Part, op: &P2pOp) -> Result<(), CollError> {
    coop.agree(check(ctx, part, op))?;
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let me = ctx.scratch().lsa_rank();
    let (chunk, slots) = (ctx.p2p_chunk(), ctx.p2p_slots() as u64);
    let chunks = p2p_chunks(ctx, op.bytes);
    let mut deadline = Deadline::new(&ctx.comm().abort());
    let mut i = part.index as u64;
    while i < chunks {
        let s = op.first_seq.wrapping_add(i);
        let slot = (s % slots) as u32;
        let mut r = Ok(());
        if coop.is_leader() {
            let credit = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(2, op.peer, slot), me);
            // SAFETY: credit word `[peer][slot]` of the caller's own area
            // (`peer < lsa_size`, `slot < p2p_slots`: the context's
            // contract), aligned, written by the receiver atomically only.
            r = unsafe { wait::wait_ge_u64(credit, s.wrapping_sub(slots), Scope::Sys, &mut deadline) }
                .map(|_| ())
                .map_err(CollError::from);
        }
        // Everyone starts writing the slot after the leader saw it free.
        coop.agree(r)?;
        let begin = i * chunk;
        let m = op.bytes.saturating_sub(begin).min(chunk) as usize;
        let data = ctx.scratch().lsa_ptr::<u8>(ctx.p2p_data_offset(me, slot), op.peer);
        // SAFETY: slot `[me][slot]` of the peer's area holds `chunk >= m`
        // bytes, free (the credit above); the source holds `begin + m <=
        // bytes` (the contract); the two do not overlap (scratch is the
        // library's own).
        unsafe { copy_strided(t, nt, data, (op.ptr as *const u8).wrapping_add(begin as usize), m) };
        if coop.is_leader() {
            let len = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(1, me, slot), op.peer);
            // SAFETY: length word `[me][slot]` of the peer's area, aligned,
            // read by the receiver after it acquires the flag below.
            unsafe { atomic::store_relaxed(len, op.bytes, Scope::Sys) };
        }
        coop.sync();
        if coop.is_leader() {
            let flag = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(0, me, slot), op.peer);
            // SAFETY: flag word `[me][slot]` of the peer's area, aligned,
            // accessed atomically only; the release publishes the coop's
            // stores (ordered before it by the join above).
            unsafe { atomic::store_release(flag, s, Scope::Sys) };
        }
        i += part.count as u64;
    }
    Ok(())
}

/// Receives a message of `op.bytes` bytes from LSA rank `op.peer` into
/// local `op.ptr` (see the [module docs](self)). Returns once the coop's
/// chunks are in `op.ptr`; a sender's different length is
/// [`CollError::CountMismatch`] (nothing is written past `op.bytes`).
///
/// # Safety
/// As for [`send`], `op.ptr` valid for writes of `op.bytes`.
#[doc(alias = "ncclRecv")]
pub unsafe fn recv<C: Coop>(coop: &C, ctx: &CollContext, part: Part, op: &P2pOp) -> Result<(), CollError> {
    coop.agree(check(ctx, part, op))?;
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let me = ctx.scratch().lsa_rank();
    let (chunk, slots) = (ctx.p2p_chunk(), ctx.p2p_slots() as u64);
    let chunks = p2p_chunks(ctx, op.bytes);
    let mut deadline = Deadline::new(&ctx.comm().abort());
    let mut i = part.index as u64;
    while i < chunks {
        let s = op.first_seq.wrapping_add(i);
        let slot = (s % slots) as u32;
        let mut r = Ok(());
        if coop.is_leader() {
            let flag = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(0, op.peer, slot), me);
            // SAFETY: flag word `[peer][slot]` of the caller's own area,
            // aligned, written by the sender atomically only.
            r = unsafe { wait::wait_ge_u64(flag, s, Scope::Sys, &mut deadline) }.map_err(CollError::from).and_then(
                |_| {
                    let len = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(1, op.peer, slot), me);
                    // SAFETY: the length word beside it, written before the
                    // flag's release that the wait acquired.
                    let sent = unsafe { atomic::load_relaxed(len, Scope::Sys) };
                    if sent == op.bytes {
                        Ok(())
                    } else {
                        Err(CollError::CountMismatch)
                    }
                },
            );
        }
        // Everyone reads the slot after the leader acquired its flag.
        coop.agree(r)?;
        let begin = i * chunk;
        let m = op.bytes.saturating_sub(begin).min(chunk) as usize;
        let data = ctx.scratch().lsa_ptr::<u8>(ctx.p2p_data_offset(op.peer, slot), me);
        // SAFETY: the caller's slot `[peer][slot]` holds the chunk's `m`
        // bytes (published by the flag acquired above); the destination
        // holds `begin + m <= bytes` (the contract).
        unsafe { copy_strided(t, nt, (op.ptr as *mut u8).wrapping_add(begin as usize), data, m) };
        coop.sync();
        if coop.is_leader() {
            let credit = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(2, me, slot), op.peer);
            // SAFETY: credit word `[me][slot]` of the sender's area,
            // aligned, accessed atomically only; the release orders the
            // coop's reads of the slot (joined above) before the sender's
            // next writes.
            unsafe { atomic::store_release(credit, s, Scope::Sys) };
        }
        i += part.count as u64;
    }
    Ok(())
}
