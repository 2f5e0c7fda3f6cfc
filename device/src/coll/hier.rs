//! Collectives over the whole world when it spans several LSA teams
//! ("nodes"), callable from a kernel: LSA inside each team, GIN along the
//! rails between teams.
//!
//! The world is `T` LSA teams of `L` ranks (world rank `t * L + l` is LSA
//! rank `l` of team `t`; rail `l` holds LSA rank `l` of every team). An
//! all-reduce of `count` elements, `c = count / L`:
//!
//! 1. reduce-scatter inside the team ([`super::reduce_scatter`]): LSA rank
//!    `l` holds the team's reduction of shard `l` (`c` elements, at `dst +
//!    l * c`);
//! 2. all-reduce of the shard along the rail, over GIN (the **rail
//!    exchange**, below): every rank of rail `l` holds the world's
//!    reduction of shard `l`;
//! 3. all-gather inside the team ([`super::all_gather`]).
//!
//! The last `count % L` elements are all-reduced in the team (one-shot)
//! and then along the rail. GIN carries `(T - 1) * count / L` elements per
//! rank, where a flat all-reduce sends every off-node rank a copy:
//! `(T - 1) * L * count`.
//!
//! ## The rail exchange
//!
//! Part `b` of a collective ([`Part`]) moves its piece of the shard in
//! chunks of the context's rail slot size ([`CollContext::with_rail`]):
//! it copies the chunk into its outbox slot, puts it into slot `me` of
//! every rail peer's inbox with a `SignalInc` of its "arrived" signal,
//! waits until the `T - 1` peers' chunks have arrived, reduces the `T`
//! values of each element in rail order (every rank gets the same bits),
//! flushes (the outbox may be reused), bumps every peer's "consumed"
//! signal, and waits until the `T - 1` peers are done with its chunk
//! before sending the next. The waits count with the signals' shadows
//! ([`Gin::wait_signal_follow_shadow`]), so no state lives on the host
//! and successive calls continue where the last one stopped.
//!
//! Reductions run in two levels: `Sum`, `Prod`, `Min`, `Max` at both;
//! `PreMulSum` multiplies in the team and sums along the rail; `Avg` of
//! floats scales by `1/L` in the team and `1/T` along the rail, `Avg` of
//! integers sums in the team and divides the rail's (wrapping) sum by the
//! world's size, exactly NCCL's result. Narrow floats are rounded to their
//! type between the levels.

use super::element::Element;
use super::op::{RedOp, Reduction};
use super::staging::piece;
use super::{check_part, reduce_scatter, Algorithm, CollContext, CollError, Input, Part};
use crate::coop::Coop;
use crate::gin::{Gin, LocalAction, RemoteAction};
use crate::lsa::ops;
use core::mem::size_of;

/// The world's shape as the collectives see it: `(teams, lsa_size)`, or
/// an error when the world is not whole teams.
#[inline(always)]
fn shape(ctx: &CollContext) -> Result<(u32, u32), CollError> {
    let c = ctx.comm();
    let l = c.lsa_size();
    if l == 0 || c.nranks() % l != 0 || ctx.scratch().lsa_size() != l {
        return Err(CollError::BadArgument);
    }
    Ok((c.nranks() / l, l))
}

/// The two levels of `op`: (inside the team, along the rail).
#[inline(always)]
fn levels<T: Element>(op: RedOp, scalar: T, teams: u32, lsa: u32) -> (Reduction<T>, Reduction<T>) {
    match op {
        RedOp::PreMulSum => (Reduction::new(op, scalar, lsa), Reduction::new(RedOp::Sum, scalar, teams)),
        RedOp::Avg if T::DTYPE.is_float() => (Reduction::new(op, scalar, lsa), Reduction::new(op, scalar, teams)),
        RedOp::Avg => (Reduction::new(RedOp::Sum, scalar, lsa), Reduction::new(op, scalar, teams * lsa)),
        _ => (Reduction::new(op, scalar, lsa), Reduction::new(op, scalar, teams)),
    }
}

/// `dst[i] = op over every rank of the world of src[i]` for `i < count`
/// (`ncclAllReduce` over the world), when the world spans several LSA
/// teams: see the [module docs](self). With one team it is
/// [`super::all_reduce`]. In place when `dst` is `src`'s local address.
///
/// The context needs the GIN channels and the rail exchange
/// ([`CollContext::has_rail`]; `devcomm`'s `Collectives::context` has
/// them whenever the communicator spans several LSA teams), else
/// [`CollError::BadArgument`]. GIN failures (a dead peer: the ring failed;
/// timeouts) come back as [`CollError::Gin`], the same on every thread.
///
/// # Safety
/// As for [`super::all_reduce`], over every rank of the world: every rank
/// calls it with the same `count`, `op`, parts and `seq`; `dst` holds
/// `count` elements; the context's GIN window, signals and barriers are
/// used by nothing else meanwhile.
#[doc(alias = "ncclAllReduce")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    op: RedOp,
    scalar: T,
    seq: u32,
) -> Result<(), CollError> {
    check_part(ctx, part)?;
    let (teams, lsa) = shape(ctx)?;
    let (team_red, rail_red) = levels(op, scalar, teams, lsa);
    if teams == 1 {
        // SAFETY: this function's contract is the team all-reduce's.
        return unsafe { super::all_reduce(coop, ctx, part, src, dst, count, &team_red, Algorithm::Auto, seq) };
    }
    if !ctx.has_rail() {
        return Err(CollError::BadArgument);
    }
    let c = count / lsa as usize;
    let main = c * lsa as usize;
    if c > 0 {
        let shard = dst.wrapping_add(ctx.scratch().lsa_rank() as usize * c);
        // SAFETY: this function's contract: `src` holds `count >= lsa * c`
        // elements, `dst` `count`, the shard is `dst`'s block `lsa_rank`
        // (in place when `dst` is `src`); the context has the rail
        // exchange (checked).
        unsafe {
            reduce_scatter(coop, ctx, part, src, shard, c, &team_red)?;
            rail_all_reduce(coop, ctx, part, shard, c, &rail_red)?;
            super::all_gather(coop, ctx, part, Input::Local(shard as *const T), dst, c)?;
        }
    }
    if main < count {
        let tail = match src {
            Input::Local(p) => Input::Local(p.wrapping_add(main)),
            Input::Window(s) => Input::Window(s.add(main as u64)),
        };
        let rest = count - main;
        // One-shot: its parts' pieces are the rail exchange's (16-byte units).
        // SAFETY: as above, for the last `rest` elements.
        unsafe {
            super::all_reduce(coop, ctx, part, tail, dst.wrapping_add(main), rest, &team_red, Algorithm::OneShot, seq)?;
            rail_all_reduce(coop, ctx, part, dst.wrapping_add(main), rest, &rail_red)?;
        }
    }
    Ok(())
}

/// `dst[w * count + i] = src_w[i]` for every world rank `w`, `i <
/// count` (`ncclAllGather` over the world), when the world spans several
/// LSA teams: the rail exchange first (rank `t·L + l` receives the blocks
/// of rail `l`, one per team: `(T - 1) · count` elements over GIN), then
/// an all-gather inside the team for each team's blocks
/// ([`super::all_gather`], in place). With one team it is
/// [`super::all_gather`]. In place when `src` is `dst + rank * count`.
///
/// Needs the context's rail exchange like [`all_reduce`].
///
/// # Safety
/// As for [`super::all_gather`], over every rank of the world: `dst`
/// holds `nranks * count` elements; every rank calls with the same
/// `count` and parts; the context's GIN window, signals and barriers are
/// used by nothing else meanwhile.
#[doc(alias = "ncclAllGather")]
pub unsafe fn all_gather<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
) -> Result<(), CollError> {
    check_part(ctx, part)?;
    let (teams, lsa) = shape(ctx)?;
    if teams == 1 {
        // SAFETY: this function's contract is the team all-gather's.
        return unsafe { super::all_gather(coop, ctx, part, src, dst, count) };
    }
    if !ctx.has_rail() {
        return Err(CollError::BadArgument);
    }
    let (l, t_me) = (ctx.scratch().lsa_rank() as usize, ctx.comm().rail().rank);
    // Rail `l`'s block of team `t` lies at world rank `t * lsa + l`.
    let block = |t: u32| dst.wrapping_add((t as usize * lsa as usize + l) * count);
    let mine = src.local();
    // As bytes: the parts' pieces are 16-byte units in the rail exchange
    // and in the team all-gathers alike, so each part reads only what it
    // wrote.
    let bytes = count * size_of::<T>();
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    // SAFETY: this function's contract: `src` holds `count` elements,
    // `dst` `nranks * count`; the consumer writes the arrived chunks into
    // the blocks of the other teams (never `src`, which is at most our
    // own block); the context has the rail exchange (checked).
    unsafe {
        rail_exchange(coop, ctx, part, mine as *const u8, bytes, |k, len, inbox| {
            for from in (0..teams).filter(|&f| f != t_me) {
                ops::copy_strided(t, nt, (block(from) as *mut u8).add(k), inbox(from), len);
            }
        })?;
        // Our own block, unless in place; then every team's blocks inside
        // the team, in place. The part's own piece only (16-byte units).
        let (pb, pe) = piece(bytes, 16, part.count as usize, part.index as usize);
        if !core::ptr::eq(mine, block(t_me)) && pe > pb {
            ops::copy_strided(t, nt, (block(t_me) as *mut u8).add(pb), (mine as *const u8).add(pb), pe - pb);
        }
        coop.sync();
        for team in 0..teams {
            let base = dst.wrapping_add(team as usize * lsa as usize * count);
            super::all_gather(coop, ctx, part, Input::Local(block(team) as *const T), base, count)?;
        }
    }
    Ok(())
}

/// `buf[i] = red over the rail of buf[i]` for this part's piece of
/// `count` elements (see the [module docs](self#the-rail-exchange)).
///
/// # Safety
/// `buf` holds `count` elements of this rank, the piece written by this
/// part (or before the call); the context has the rail exchange; every
/// rank of the rail calls with the same `count` and parts.
unsafe fn rail_all_reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    buf: *mut T,
    count: usize,
    red: &Reduction<T>,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let me = ctx.comm().rail().rank;
    let teams = ctx.comm().rail().nranks;
    // SAFETY: this function's contract is `rail_exchange`'s; the
    // consumer reads `len` elements of each arrived chunk and writes
    // this part's piece of `buf` only.
    unsafe {
        rail_exchange(coop, ctx, part, buf as *const T, count, |k, len, inbox| {
            let mut i = t;
            while i < len {
                let at = |from: u32| {
                    ops::get_value(if from == me { buf.add(k + i) as *const T } else { inbox(from).add(i) })
                };
                let mut acc = red.first(at(0));
                for from in 1..teams {
                    acc = red.step(acc, at(from));
                }
                ops::put_value(buf.add(k + i), red.finish(acc));
                i += nt;
            }
        })
    }
}

/// The rail exchange (see the [module docs](self#the-rail-exchange)):
/// this part's piece of the `count` elements at `src` goes, chunk by
/// chunk, to every rail peer; once the peers' chunks `k .. k + len` have
/// arrived, every thread of the coop calls `consume(k, len, inbox)`
/// (`inbox(from)`: rail rank `from`'s chunk, `len` elements; for `from ==
/// me` it is not valid: use `src`), then the next chunk goes.
///
/// # Safety
/// `src` holds `count` elements of this rank, the piece written by this
/// part (or before the call), and `consume` does not write what a later
/// chunk still sends; the context has the rail exchange; every rank of
/// the rail calls with the same `count`, element size and parts.
unsafe fn rail_exchange<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    count: usize,
    consume: impl Fn(usize, usize, &dyn Fn(u32) -> *const T),
) -> Result<(), CollError> {
    let comm = ctx.comm();
    let rail = comm.rail();
    let (teams, me) = (rail.nranks, rail.rank);
    let (pb, pe) = piece(count, 16 / size_of::<T>(), part.count as usize, part.index as usize);
    if teams <= 1 || pb >= pe {
        return Ok(());
    }
    let gin = coop.agree(Gin::new(comm, ctx.gin_context()))?;
    let win = *ctx.gin_scratch();
    let per_chunk = (ctx.rail_chunk() as usize / size_of::<T>()).max(1);
    let (arrived, consumed) = (ctx.rail_signal(part.index, false), ctx.rail_signal(part.index, true));
    let outbox = ctx.rail_slot_offset(part.index, teams);
    let inbox = |from: u32| win.local_ptr::<T>(ctx.rail_slot_offset(part.index, from)) as *const T;
    // The piece was written by this part's threads in another layout.
    coop.sync();
    let mut k = pb;
    while k < pe {
        let len = per_chunk.min(pe - k);
        let bytes = len * size_of::<T>();
        // SAFETY: the outbox slot is this part's, `rail_chunk >= bytes`
        // bytes inside the GIN window (`with_rail`'s contract); `src`
        // holds the piece (this function's contract); no overlap.
        unsafe { ops::copy(coop, win.local_ptr::<u8>(outbox), src.add(k) as *const u8, bytes) };
        for peer in (0..teams).filter(|&p| p != me) {
            let arrival = RemoteAction::SignalInc { signal: arrived, strong: true };
            let to = ctx.rail_slot_offset(part.index, me);
            // SAFETY: the GIN window belongs to this communicator
            // (`with_p2p_gin`'s contract); `put` joins the coop first, so the
            // outbox copy is complete, and fences before posting.
            unsafe { gin.put(coop, &rail, peer, &win, to, &win, outbox, bytes as u64, arrival, LocalAction::None) }?;
        }
        // The wait acquires the peers' chunks (and joins the coop).
        gin.wait_signal_follow_shadow(coop, arrived, teams as u64 - 1)?;
        consume(k, len, &inbox);
        // The outbox may be overwritten once the proxy has read it; the
        // flush also joins the coop, so every thread is done with the inbox.
        // SAFETY: the GIN window belongs to this communicator.
        unsafe { gin.flush(coop) }?;
        let r = if coop.is_leader() {
            (0..teams).filter(|&p| p != me).try_for_each(|peer| {
                // SAFETY: as for the puts.
                unsafe { gin.signal(&rail, peer, RemoteAction::SignalInc { signal: consumed, strong: true }) }
            })
        } else {
            Ok(())
        };
        coop.agree(r)?;
        gin.wait_signal_follow_shadow(coop, consumed, teams as u64 - 1)?;
        k += len;
    }
    Ok(())
}
