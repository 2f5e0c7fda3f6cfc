//! Collectives over the whole world when it spans several LSA teams
//! ("nodes"), callable from a kernel: LSA inside each team, GIN along the
//! rails between teams.
//!
//! The world is `T` LSA teams of `L` ranks (world rank `t * L + l` is LSA
//! rank `l` of team `t`; rail `l` holds LSA rank `l` of every team).
//!
//! | call | steps | elements a rank sends over GIN |
//! |---|---|---|
//! | [`all_reduce`] | team reduce-scatter → rail all-reduce of the shard → team all-gather | `(T-1)·count/L` |
//! | [`reduce_scatter`] | per destination team: its blocks reduce-scattered in the team into the outbox → rail → reduced with the own team's partial | `(T-1)·count` |
//! | [`all_gather`] | rail exchange of the own block → team all-gather of every team's blocks | `(T-1)·count` |
//! | [`broadcast`] | root → its rail → team broadcast from each team's rank on that rail | root: `(T-1)·count` |
//! | [`reduce`] | team reduce to the rank on the root's rail → rail → root | `count` (root receives `(T-1)·count`) |
//!
//! A flat collective sends `L` times more (every off-team rank its copy).
//! In detail, an all-reduce of `count` elements, `c = count / L`:
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
//! That is the all-reduce's exchange (every rail rank to every other, the
//! same chunk to each). Broadcast sends from one rail rank only, reduce to
//! one; reduce-scatter sends each peer its own chunk, one destination at a
//! time through the one outbox (filled by a team reduce-scatter, put, then
//! flushed before the next fill). A rank waits for as many arrivals as
//! ranks send to it, and for as many "consumed" as it sent to.
//!
//! Reductions run in two levels: `Sum`, `Prod`, `Min`, `Max` at both;
//! `PreMulSum` multiplies in the team and sums along the rail; `Avg` of
//! floats scales by `1/L` in the team and `1/T` along the rail, `Avg` of
//! integers sums in the team and divides the rail's (wrapping) sum by the
//! world's size, exactly NCCL's result. Narrow floats are rounded to their
//! type between the levels.

use super::element::Element;
use super::op::{RedOp, Reduction};
use super::reduce::reduce_range;
use super::staging::{part_range, piece};
use super::{check_part, Algorithm, CollContext, CollError, Input, Part};
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

/// The world's shape `(teams, lsa_size)` after the checks every
/// hierarchical collective makes: the part, whole teams and, with several
/// teams, the rail exchange in the context ([`CollError::BadArgument`]
/// without it).
#[inline(always)]
fn world(ctx: &CollContext, part: Part) -> Result<(u32, u32), CollError> {
    check_part(ctx, part)?;
    let (teams, lsa) = shape(ctx)?;
    if teams > 1 && !ctx.has_rail() {
        return Err(CollError::BadArgument);
    }
    Ok((teams, lsa))
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
    let (teams, lsa) = world(ctx, part)?;
    let (team_red, rail_red) = levels(op, scalar, teams, lsa);
    if teams == 1 {
        // SAFETY: this function's contract is the team all-reduce's.
        return unsafe { super::all_reduce(coop, ctx, part, src, dst, count, &team_red, Algorithm::Auto, seq) };
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
            super::reduce_scatter(coop, ctx, part, src, shard, c, &team_red)?;
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
    let (teams, lsa) = world(ctx, part)?;
    if teams == 1 {
        // SAFETY: this function's contract is the team all-gather's.
        return unsafe { super::all_gather(coop, ctx, part, src, dst, count) };
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
        rail_exchange(coop, ctx, part, bytes, Flow::All, Fill::Same(mine as *const u8), |k, len, inbox| {
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

/// `dst[i] = op over every world rank r of src_r[rank * count + i]` for
/// `i < count` (`ncclReduceScatter` over the world), when the world spans
/// several LSA teams. Team `t`'s blocks (`t·L .. t·L + L`) are
/// reduce-scattered inside each team, chunk by chunk, straight into the
/// GIN outbox and put to rail rank `t`; every rank reduces its own team's
/// partial and the `T - 1` arrived ones in rail order: `(T - 1) · count`
/// elements over GIN per rank, as the host's hierarchical path. With one
/// team it is [`super::reduce_scatter`]. In place when `dst` is `src +
/// rank * count`.
///
/// Needs the context's rail exchange like [`all_reduce`].
///
/// # Safety
/// As for [`super::reduce_scatter`], over every rank of the world: `src`
/// holds `nranks * count` elements, `dst` `count`; every rank calls with
/// the same `count`, `op` and parts; the context's GIN window, signals
/// and barriers are used by nothing else meanwhile.
#[doc(alias = "ncclReduceScatter")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_scatter<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    op: RedOp,
    scalar: T,
) -> Result<(), CollError> {
    let (teams, lsa) = world(ctx, part)?;
    let (team_red, rail_red) = levels(op, scalar, teams, lsa);
    if teams == 1 {
        // SAFETY: this function's contract is the team reduce-scatter's.
        return unsafe { super::reduce_scatter(coop, ctx, part, src, dst, count, &team_red) };
    }
    let me = ctx.comm().rail().rank;
    let blocks_of = |team: u32| src.advance(team as usize * lsa as usize * count);
    let (pb, pe) = part_range::<T>(count, part);
    // SAFETY: this function's contract: team `t`'s blocks are `lsa`
    // blocks of `count` at `blocks_of(t)`; our own team's partial lands
    // in `dst` (in place: our own block, which no peer reads); the other
    // teams' go through the outbox (`len <= rail_chunk` elements); the
    // consumer writes this part's piece of `dst`, which no later chunk
    // sends; the context has the rail exchange (checked).
    unsafe {
        if pe > pb {
            reduce_range(coop, ctx, part, blocks_of(me), count, pb, pe, dst.add(pb), &team_red, None)?;
        }
        let fill = |peer: u32, k: usize, len: usize, outbox: *mut T| {
            reduce_range(coop, ctx, part, blocks_of(peer), count, k, k + len, outbox, &team_red, None)
        };
        rail_exchange(coop, ctx, part, count, Flow::All, Fill::PerPeer(&fill), |k, len, inbox| {
            rail_reduce(coop, ctx, dst, k, len, inbox, &rail_red)
        })
    }
}

/// `dst[i] = src_root[i]` on every world rank (`ncclBroadcast` over the
/// world; `root` a world rank), when the world spans several LSA teams:
/// the root's rail first (its input to its LSA rank in every team over
/// GIN, `(T - 1) · count` elements from the root), then a broadcast
/// inside each team from that rank ([`super::broadcast`]). With one team
/// it is [`super::broadcast`]. In place when the root's `src` is `dst`.
///
/// Needs the context's rail exchange like [`all_reduce`].
///
/// # Safety
/// As for [`super::broadcast`], over every rank of the world: `src` holds
/// `count` elements on the root (its kind, local or window, the same on
/// every rank of the root's team), `dst` `count` on every rank; every
/// rank calls with the same `count`, `root` and parts; the context's GIN
/// window, signals and barriers are used by nothing else meanwhile.
#[doc(alias = "ncclBroadcast")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn broadcast<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    root: u32,
) -> Result<(), CollError> {
    let (teams, lsa) = world(ctx, part)?;
    if root >= teams * lsa {
        return Err(CollError::BadArgument);
    }
    if teams == 1 {
        // SAFETY: this function's contract is the team broadcast's.
        return unsafe { super::broadcast(coop, ctx, part, src, dst, count, root, Algorithm::Auto) };
    }
    let (root_team, root_lsa) = (root / lsa, root % lsa);
    let (l, me) = (ctx.scratch().lsa_rank(), ctx.comm().rail().rank);
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let bytes = count * size_of::<T>();
    // SAFETY: this function's contract: the root's `src` holds `count`
    // elements, every `dst` `count`; the consumer writes this part's
    // piece of `dst` on ranks that send nothing; the context has the rail
    // exchange (checked).
    unsafe {
        if l == root_lsa {
            let mine = src.local() as *const u8;
            rail_exchange(coop, ctx, part, bytes, Flow::From(root_team), Fill::Same(mine), |k, len, inbox| {
                if me != root_team {
                    ops::copy_strided(t, nt, (dst as *mut u8).add(k), inbox(root_team), len);
                }
            })?;
            // The team broadcast reads `dst` in its own thread layout.
            coop.sync();
        }
        // The root's team from the root's input; the others from what
        // arrived at their rank `root_lsa` (in place there).
        let from = if me == root_team { src } else { Input::Local(dst as *const T) };
        super::broadcast(coop, ctx, part, from, dst, count, root_lsa, Algorithm::Auto)
    }
}

/// `dst[i] = op over every world rank r of src_r[i]` on `root` (a world
/// rank; `ncclReduce` over the world), when the world spans several LSA
/// teams: a reduce inside each team to the rank with the root's LSA rank
/// ([`super::reduce`]; the team's partial lands in that rank's `dst`),
/// then those ranks' partials along the root's rail to the root over GIN
/// (`count` elements from each, reduced in rail order). With one team it
/// is [`super::reduce`]. In place when `dst` is `src`'s local address.
///
/// Needs the context's rail exchange like [`all_reduce`].
///
/// # Safety
/// As for [`super::reduce`], over every rank of the world: `src` holds
/// `count` elements on every rank; `dst` holds `count` elements on every
/// rank whose LSA rank is the root's (scratch there, the result on the
/// root) and is not touched elsewhere (may be null); every rank calls
/// with the same `count`, `op`, `root` and parts; the context's GIN
/// window, signals and barriers are used by nothing else meanwhile.
#[doc(alias = "ncclReduce")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    op: RedOp,
    scalar: T,
    root: u32,
) -> Result<(), CollError> {
    let (teams, lsa) = world(ctx, part)?;
    if root >= teams * lsa {
        return Err(CollError::BadArgument);
    }
    let (team_red, rail_red) = levels(op, scalar, teams, lsa);
    if teams == 1 {
        // SAFETY: this function's contract is the team reduce's.
        return unsafe { super::reduce(coop, ctx, part, src, dst, count, &team_red, root, Algorithm::Auto) };
    }
    let (root_team, root_lsa) = (root / lsa, root % lsa);
    let (l, me) = (ctx.scratch().lsa_rank(), ctx.comm().rail().rank);
    // SAFETY: this function's contract: `dst` holds `count` elements on
    // the ranks of the root's rail, where the team reduce leaves its
    // partial (this part's piece, in the rail exchange's 16-byte units)
    // and the root's consumer writes this part's piece, which it never
    // sends; the context has the rail exchange (checked).
    unsafe {
        super::reduce(coop, ctx, part, src, dst, count, &team_red, root_lsa, Algorithm::Auto)?;
        if l == root_lsa {
            rail_exchange(
                coop,
                ctx,
                part,
                count,
                Flow::To(root_team),
                Fill::Same(dst as *const T),
                |k, len, inbox| {
                    if me == root_team {
                        rail_reduce(coop, ctx, dst, k, len, inbox, &rail_red)
                    }
                },
            )?;
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
    // SAFETY: this function's contract is `rail_exchange`'s; the
    // consumer reads `len` elements of each arrived chunk and writes
    // this part's piece of `buf` only.
    unsafe {
        rail_exchange(coop, ctx, part, count, Flow::All, Fill::Same(buf as *const T), |k, len, inbox| {
            rail_reduce(coop, ctx, buf, k, len, inbox, red)
        })
    }
}

/// `buf[k + i] = red over the rail ranks, in rail order, of (buf[k + i]
/// for this rank, inbox(from)[i] for the others)`, `i < len`: the
/// consumer of a rail exchange whose every peer sent to this rank.
///
/// # Safety
/// `buf` holds `k + len` elements; every other rail rank's chunk has
/// arrived in its inbox slot.
unsafe fn rail_reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    buf: *mut T,
    k: usize,
    len: usize,
    inbox: &dyn Fn(u32) -> *const T,
    red: &Reduction<T>,
) {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (teams, me) = (ctx.comm().rail().nranks, ctx.comm().rail().rank);
    let mut i = t;
    while i < len {
        // SAFETY: the contract: `buf` holds element `k + i`, each inbox
        // slot `len` elements.
        let at = |from: u32| unsafe {
            ops::get_value(if from == me { buf.add(k + i) as *const T } else { inbox(from).add(i) })
        };
        let mut acc = red.first(at(0));
        for from in 1..teams {
            acc = red.step(acc, at(from));
        }
        // SAFETY: as above.
        unsafe { ops::put_value(buf.add(k + i), red.finish(acc)) };
        i += nt;
    }
}

/// Who sends along the rail in a [`rail_exchange`] (rail ranks = teams).
#[derive(Clone, Copy)]
enum Flow {
    /// Every rail rank to every other (all-reduce, reduce-scatter,
    /// all-gather).
    All,
    /// Rail rank `r` to every other (broadcast).
    From(u32),
    /// Every other rail rank to rail rank `r` (reduce).
    To(u32),
}

impl Flow {
    /// Whether rail rank `from` sends to rail rank `to`.
    #[inline(always)]
    fn sends(self, from: u32, to: u32) -> bool {
        from != to
            && match self {
                Flow::All => true,
                Flow::From(r) => from == r,
                Flow::To(r) => to == r,
            }
    }
}

/// What a rank puts into its outbox for a chunk.
#[derive(Clone, Copy)]
enum Fill<'a, T> {
    /// The chunk of `src` (this part's piece), the same for every
    /// destination: copied once, put to each.
    Same(*const T),
    /// `fill(peer, k, len, outbox)` writes what goes to rail rank `peer`
    /// (elements `k .. k + len` of its data); one destination at a time,
    /// each put flushed before the next fill.
    PerPeer(&'a dyn Fn(u32, usize, usize, *mut T) -> Result<(), CollError>),
}

/// The rail exchange (see the [module docs](self#the-rail-exchange)):
/// this part's piece of `count` elements goes, chunk by chunk, from the
/// senders to the receivers `flow` names, filled as `fill` says; once the
/// chunks `k .. k + len` this rank receives have arrived, every thread of
/// the coop calls `consume(k, len, inbox)` (`inbox(from)`: rail rank
/// `from`'s chunk, `len` elements, valid for the ranks that sent to this
/// one), then the next chunk goes. Every rank of the rail runs every
/// chunk, sending or not.
///
/// # Safety
/// What `fill` reads holds the piece, written by this part (or before the
/// call), and `consume` does not write what a later chunk still sends;
/// the context has the rail exchange; every rank of the rail calls with
/// the same `count`, element size, `flow` and parts.
unsafe fn rail_exchange<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    count: usize,
    flow: Flow,
    fill: Fill<'_, T>,
    consume: impl Fn(usize, usize, &dyn Fn(u32) -> *const T),
) -> Result<(), CollError> {
    let comm = ctx.comm();
    let rail = comm.rail();
    let (teams, me) = (rail.nranks, rail.rank);
    let (pb, pe) = part_range::<T>(count, part);
    if teams <= 1 || pb >= pe {
        return Ok(());
    }
    let gin = coop.agree(Gin::new(comm, ctx.gin_context()))?;
    let win = *ctx.gin_scratch();
    let per_chunk = (ctx.rail_chunk() as usize / size_of::<T>()).max(1);
    let (arrived, consumed) = (ctx.rail_signal(part.index, false), ctx.rail_signal(part.index, true));
    let outbox = ctx.rail_slot_offset(part.index, teams);
    let inbox = |from: u32| win.local_ptr::<T>(ctx.rail_slot_offset(part.index, from)) as *const T;
    // Destinations start with the next rail rank (the same order on every
    // rank of a team: `fill` may run team collectives), sources likewise.
    let dests = || (1..teams).map(move |j| (me + j) % teams).filter(move |&p| flow.sends(me, p));
    let sources = || (1..teams).map(move |j| (me + j) % teams).filter(move |&p| flow.sends(p, me));
    let (n_dests, n_sources) = (dests().count() as u64, sources().count() as u64);
    let put = |peer: u32, bytes: usize| {
        let arrival = RemoteAction::SignalInc { signal: arrived, strong: true };
        let to = ctx.rail_slot_offset(part.index, me);
        // SAFETY: the GIN window belongs to this communicator
        // (`with_p2p_gin`'s contract); `put` joins the coop first, so the
        // outbox is complete, and fences before posting.
        unsafe { gin.put(coop, &rail, peer, &win, to, &win, outbox, bytes as u64, arrival, LocalAction::None) }
    };
    // The piece was written by this part's threads in another layout.
    coop.sync();
    let mut k = pb;
    while k < pe {
        let len = per_chunk.min(pe - k);
        let bytes = len * size_of::<T>();
        match fill {
            Fill::Same(src) if n_dests > 0 => {
                // SAFETY: the outbox slot is this part's, `rail_chunk >=
                // bytes` bytes inside the GIN window (`with_rail`'s
                // contract); `src` holds the piece (this function's
                // contract); no overlap.
                unsafe { ops::copy(coop, win.local_ptr::<u8>(outbox), src.add(k) as *const u8, bytes) };
                dests().try_for_each(|peer| put(peer, bytes))?;
            }
            Fill::Same(_) => {}
            Fill::PerPeer(f) => {
                for peer in dests() {
                    f(peer, k, len, win.local_ptr::<T>(outbox))?;
                    put(peer, bytes)?;
                    // The next fill overwrites the outbox: the proxy must
                    // have read it. SAFETY: the GIN window belongs to this
                    // communicator.
                    unsafe { gin.flush(coop) }?;
                }
            }
        }
        // The wait acquires the sources' chunks (and joins the coop).
        if n_sources > 0 {
            gin.wait_signal_follow_shadow(coop, arrived, n_sources)?;
        }
        consume(k, len, &inbox);
        if matches!(fill, Fill::Same(_)) && n_dests > 0 {
            // The outbox may be overwritten once the proxy has read it; the
            // flush also joins the coop, so every thread is done with the inbox.
            // SAFETY: the GIN window belongs to this communicator.
            unsafe { gin.flush(coop) }?;
        } else {
            coop.sync();
        }
        let r = if coop.is_leader() {
            sources().try_for_each(|peer| {
                // SAFETY: as for the puts.
                unsafe { gin.signal(&rail, peer, RemoteAction::SignalInc { signal: consumed, strong: true }) }
            })
        } else {
            Ok(())
        };
        coop.agree(r)?;
        if n_dests > 0 {
            gin.wait_signal_follow_shadow(coop, consumed, n_dests)?;
        }
        k += len;
    }
    Ok(())
}
