//! Point-to-point channels: `send` and `recv` between two ranks
//! (`ncclSend` / `ncclRecv`), callable by one CTA or shared by several
//! ([`Part`]). Inside the LSA team a channel moves chunks with NVLink
//! stores and flag words (below); to a rank outside it, with GIN puts and
//! signals (when the context has them: [`CollContext::with_p2p_gin`]):
//! the sender stages a chunk into its outbox slot, puts its length and
//! then the chunk into the receiver's inbox slot with a strong `SignalInc`
//! of that slot's arrival signal; the receiver waits for the signal, copies
//! out and signals the slot's credit back. Per-slot signals, because chunks
//! of one channel may be consumed out of order by different parts.
//!
//! Each ordered pair of ranks (sender → receiver) has a channel: a ring
//! of `p2p_slots` slots of `p2p_chunk` bytes in the **receiver's** scratch
//! (the context's point-to-point area), a flag and a length word per slot
//! beside them, and one credit word per slot in the **sender's** scratch.
//! A message travels as chunks numbered `first_seq, first_seq + 1, …`
//! ([`P2pOp::first_seq`]), chunk `s` in slot `(s - 1) % p2p_slots`:
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
//! Channels to ranks outside the LSA team have their own chunk size and
//! slot count ([`CollContext::p2p_gin_chunk`], [`CollContext::p2p_gin_slots`]).
//! Every message takes at least one chunk (a 0-byte message carries its
//! length), so mismatched counts are reported, not hung on.

use super::{CollContext, CollError, P2pOp, Part};
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::gin::{Gin, LocalAction, RemoteAction};
use crate::lsa::ops::copy_strided;
use crate::wait::{self, Deadline};

/// How a channel reaches its peer.
#[derive(Clone, Copy)]
enum Route {
    /// LSA stores; the peer's LSA rank.
    Lsa(u32),
    /// GIN puts and signals.
    Gin,
}

/// Where world rank `peer` is reached from, checked.
#[inline(always)]
fn route(ctx: &CollContext, peer: u32) -> Result<Route, CollError> {
    let c = ctx.comm();
    if peer >= c.nranks() {
        return Err(CollError::BadArgument);
    }
    match c.lsa().world_to_rank(c.rank(), peer) {
        Some(l) if l < ctx.scratch().lsa_size() => Ok(Route::Lsa(l)),
        Some(_) => Err(CollError::BadArgument),
        None if ctx.has_p2p_gin() => Ok(Route::Gin),
        None => Err(CollError::BadArgument),
    }
}

/// One chunk of a message on its channel.
#[derive(Clone, Copy)]
struct Chunk {
    /// Sequence number on the channel (from 1).
    seq: u64,
    /// Slot: `(seq - 1) % p2p_slots`.
    slot: u32,
    /// How many chunks used the slot before this one.
    used: u64,
    /// Offset in the message.
    begin: u64,
    /// Bytes.
    len: usize,
}

/// Bytes per chunk and slots per channel on `route`: NVLink channels'
/// ([`CollContext::p2p_chunk`]) or GIN channels' (larger: each chunk costs
/// the proxy a fixed time).
#[inline(always)]
fn geometry(ctx: &CollContext, route: Route) -> (u64, u64) {
    match route {
        Route::Lsa(_) => (ctx.p2p_chunk(), ctx.p2p_slots() as u64),
        Route::Gin => (ctx.p2p_gin_chunk(), ctx.p2p_gin_slots() as u64),
    }
}

/// The chunks of `op` (on `route`) that `part` moves, in order: chunk `i`
/// of the message for every `i ≡ part.index (mod part.count)`.
#[inline(always)]
fn chunks_of(ctx: &CollContext, part: Part, op: &P2pOp, route: Route) -> impl Iterator<Item = Chunk> {
    let (chunk, slots) = geometry(ctx, route);
    let (slots, bytes, first) = (slots.max(1), op.bytes, op.first_seq);
    (part.index as u64..chunks(chunk, bytes)).step_by(part.count.max(1) as usize).map(move |i| {
        let seq = first.wrapping_add(i);
        let z = seq.wrapping_sub(1);
        let begin = i * chunk;
        Chunk {
            seq,
            slot: (z % slots) as u32,
            used: z / slots,
            begin,
            len: bytes.saturating_sub(begin).min(chunk) as usize,
        }
    })
}

/// Chunks of `chunk` bytes in a `bytes`-byte message (at least one).
#[inline(always)]
const fn chunks(chunk: u64, bytes: u64) -> u64 {
    if chunk == 0 || bytes == 0 {
        1
    } else {
        bytes.div_ceil(chunk)
    }
}

/// Chunks of a `bytes`-byte message on `ctx`'s channel to (or from) world
/// rank `peer` (at least one): what the message advances the channel's
/// sequence numbers by. Channels to ranks outside the LSA team (GIN) cut
/// larger chunks than those inside it.
#[inline(always)]
pub fn p2p_chunks(ctx: &CollContext, peer: u32, bytes: u64) -> u64 {
    let route = route(ctx, peer).unwrap_or(Route::Lsa(0));
    chunks(geometry(ctx, route).0, bytes)
}

/// Checks the context, part and peer (the same answer on every thread).
#[inline(always)]
fn check(ctx: &CollContext, part: Part, op: &P2pOp) -> Result<Route, CollError> {
    if part.count == 0 || part.index >= part.count {
        Err(CollError::PartOutOfRange)
    } else if ctx.p2p_slots() == 0 || op.first_seq == 0 {
        Err(CollError::BadArgument)
    } else {
        match route(ctx, op.peer)? {
            Route::Gin if ctx.p2p_gin_slots() == 0 || ctx.p2p_gin_chunk() == 0 => Err(CollError::BadArgument),
            r => Ok(r),
        }
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
    match coop.agree(check(ctx, part, op))? {
        // SAFETY: this function's contract; `peer` is the LSA rank of `op.peer`.
        Route::Lsa(peer) => unsafe { send_lsa(coop, ctx, part, op, peer) },
        // SAFETY: this function's contract; the context has GIN channels.
        Route::Gin => unsafe { send_gin(coop, ctx, part, op) },
    }
}

/// [`send`] to LSA rank `peer`.
///
/// # Safety
/// As for [`send`].
unsafe fn send_lsa<C: Coop>(coop: &C, ctx: &CollContext, part: Part, op: &P2pOp, peer: u32) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let me = ctx.scratch().lsa_rank();
    let slots = ctx.p2p_slots() as u64;
    let mut deadline = Deadline::new(&ctx.comm().abort());
    for Chunk { seq: s, slot, begin, len: m, .. } in chunks_of(ctx, part, op, Route::Lsa(peer)) {
        let mut r = Ok(());
        if coop.is_leader() {
            let credit = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(2, peer, slot), me);
            // SAFETY: credit word `[peer][slot]` of the caller's own area
            // (`peer < lsa_size`, `slot < p2p_slots`: the context's
            // contract), aligned, written by the receiver atomically only.
            r = unsafe { wait::wait_ge_u64(credit, s.wrapping_sub(slots), Scope::Sys, &mut deadline) }
                .map(|_| ())
                .map_err(CollError::from);
        }
        // Everyone starts writing the slot after the leader saw it free.
        coop.agree(r)?;
        let data = ctx.scratch().lsa_ptr::<u8>(ctx.p2p_data_offset(me, slot), peer);
        // SAFETY: slot `[me][slot]` of the peer's area holds `chunk >= m`
        // bytes, free (the credit above); the source holds `begin + m <=
        // bytes` (the contract); the two do not overlap (scratch is the
        // library's own).
        unsafe { copy_strided(t, nt, data, (op.ptr as *const u8).wrapping_add(begin as usize), m) };
        if coop.is_leader() {
            let len = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(1, me, slot), peer);
            // SAFETY: length word `[me][slot]` of the peer's area, aligned,
            // read by the receiver after it acquires the flag below.
            unsafe { atomic::store_relaxed(len, op.bytes, Scope::Sys) };
        }
        coop.sync();
        if coop.is_leader() {
            let flag = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(0, me, slot), peer);
            // SAFETY: flag word `[me][slot]` of the peer's area, aligned,
            // accessed atomically only; the release publishes the coop's
            // stores (ordered before it by the join above).
            unsafe { atomic::store_release(flag, s, Scope::Sys) };
        }
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
    match coop.agree(check(ctx, part, op))? {
        // SAFETY: this function's contract; `peer` is the LSA rank of `op.peer`.
        Route::Lsa(peer) => unsafe { recv_lsa(coop, ctx, part, op, peer) },
        // SAFETY: this function's contract; the context has GIN channels.
        Route::Gin => unsafe { recv_gin(coop, ctx, part, op) },
    }
}

/// [`recv`] from LSA rank `peer`.
///
/// # Safety
/// As for [`recv`].
unsafe fn recv_lsa<C: Coop>(coop: &C, ctx: &CollContext, part: Part, op: &P2pOp, peer: u32) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let me = ctx.scratch().lsa_rank();
    let mut deadline = Deadline::new(&ctx.comm().abort());
    for Chunk { seq: s, slot, begin, len: m, .. } in chunks_of(ctx, part, op, Route::Lsa(peer)) {
        let mut r = Ok(());
        if coop.is_leader() {
            let flag = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(0, peer, slot), me);
            // SAFETY: flag word `[peer][slot]` of the caller's own area,
            // aligned, written by the sender atomically only.
            r = unsafe { wait::wait_ge_u64(flag, s, Scope::Sys, &mut deadline) }.map_err(CollError::from).and_then(
                |_| {
                    let len = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(1, peer, slot), me);
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
        let data = ctx.scratch().lsa_ptr::<u8>(ctx.p2p_data_offset(peer, slot), me);
        // SAFETY: the caller's slot `[peer][slot]` holds the chunk's `m`
        // bytes (published by the flag acquired above); the destination
        // holds `begin + m <= bytes` (the contract).
        unsafe { copy_strided(t, nt, (op.ptr as *mut u8).wrapping_add(begin as usize), data, m) };
        coop.sync();
        if coop.is_leader() {
            let credit = ctx.scratch().lsa_ptr::<u64>(ctx.p2p_word_offset(2, me, slot), peer);
            // SAFETY: credit word `[me][slot]` of the sender's area,
            // aligned, accessed atomically only; the release orders the
            // coop's reads of the slot (joined above) before the sender's
            // next writes.
            unsafe { atomic::store_release(credit, s, Scope::Sys) };
        }
    }
    Ok(())
}

/// [`send`] to a rank outside the LSA team, over GIN.
///
/// # Safety
/// As for [`send`].
unsafe fn send_gin<C: Coop>(coop: &C, ctx: &CollContext, part: Part, op: &P2pOp) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let me = ctx.comm().rank();
    let world = ctx.comm().world();
    let win = ctx.gin_scratch();
    let gin = coop.agree(Gin::new(ctx.comm(), ctx.gin_context()).map_err(CollError::from))?;
    for Chunk { slot, used, begin, len, .. } in chunks_of(ctx, part, op, Route::Gin) {
        let m = len as u64;
        if used > 0 {
            // The receiver consumed the slot's previous chunk (so its put
            // also finished reading the outbox slot).
            gin.wait_signal(coop, ctx.p2p_gin_signal(op.peer, slot, true), used)?;
        }
        let outbox = ctx.p2p_gin_offset(op.peer, slot, 1);
        // SAFETY: outbox slot `[peer][slot]` of the caller's GIN window
        // holds `chunk >= m` bytes, free (above); the source holds `begin +
        // m <= bytes` (the contract).
        unsafe {
            copy_strided(
                t,
                nt,
                win.local_ptr::<u8>(outbox),
                (op.ptr as *const u8).wrapping_add(begin as usize),
                m as usize,
            )
        };
        let mut r = Ok(());
        if coop.is_leader() {
            // SAFETY: the GIN window is registered for GIN on every rank
            // (the context's contract); the length word lies inside it.
            r = unsafe {
                gin.put_value(
                    &world,
                    op.peer,
                    win,
                    ctx.p2p_gin_offset(me, slot, 2),
                    op.bytes,
                    RemoteAction::None,
                    LocalAction::None,
                )
            };
        }
        coop.agree(r.map_err(CollError::from))?;
        let arrived = RemoteAction::SignalInc { signal: ctx.p2p_gin_signal(me, slot, false), strong: true };
        if m == 0 {
            let mut r = Ok(());
            if coop.is_leader() {
                // SAFETY: as above.
                r = unsafe { gin.signal(&world, op.peer, arrived) };
            }
            coop.agree(r.map_err(CollError::from))?;
        } else {
            // SAFETY: as above; inbox slot `[me][slot]` of the peer and the
            // outbox slot hold `m` bytes. `put` joins the coop (the staged
            // bytes) and fences before posting.
            unsafe {
                gin.put(
                    coop,
                    &world,
                    op.peer,
                    win,
                    ctx.p2p_gin_offset(me, slot, 0),
                    win,
                    outbox,
                    m,
                    arrived,
                    LocalAction::None,
                )
            }?;
        }
    }
    Ok(())
}

/// [`recv`] from a rank outside the LSA team, over GIN.
///
/// # Safety
/// As for [`recv`].
unsafe fn recv_gin<C: Coop>(coop: &C, ctx: &CollContext, part: Part, op: &P2pOp) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let me = ctx.comm().rank();
    let world = ctx.comm().world();
    let win = ctx.gin_scratch();
    let gin = coop.agree(Gin::new(ctx.comm(), ctx.gin_context()).map_err(CollError::from))?;
    for Chunk { slot, used, begin, len: m, .. } in chunks_of(ctx, part, op, Route::Gin) {
        gin.wait_signal(coop, ctx.p2p_gin_signal(op.peer, slot, false), used + 1)?;
        let mut r = Ok(());
        if coop.is_leader() {
            // SAFETY: the length word of inbox slot `[peer][slot]` in the
            // caller's GIN window, landed before the signal acquired above.
            let sent =
                unsafe { atomic::load_relaxed(win.local_ptr::<u64>(ctx.p2p_gin_offset(op.peer, slot, 2)), Scope::Sys) };
            if sent != op.bytes {
                r = Err(CollError::CountMismatch);
            }
        }
        coop.agree(r)?;
        // SAFETY: inbox slot `[peer][slot]` holds the chunk's `m` bytes
        // (landed before the signal); the destination holds `begin + m`.
        unsafe {
            copy_strided(
                t,
                nt,
                (op.ptr as *mut u8).wrapping_add(begin as usize),
                win.local_ptr::<u8>(ctx.p2p_gin_offset(op.peer, slot, 0)),
                m,
            )
        };
        coop.sync();
        let mut r = Ok(());
        if coop.is_leader() {
            let credit = RemoteAction::SignalInc { signal: ctx.p2p_gin_signal(me, slot, true), strong: false };
            // SAFETY: the GIN window's contract; the coop's reads of the
            // slot are done (joined above).
            r = unsafe { gin.signal(&world, op.peer, credit) };
        }
        coop.agree(r.map_err(CollError::from))?;
    }
    Ok(())
}
