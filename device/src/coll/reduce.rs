//! The reducing collectives: all-reduce (LL, one-shot, two-shot), reduce,
//! reduce-scatter.

use super::element::Element;
use super::op::{ReducerKind, Reduction, SumOf};
use super::pack::{each_lane, reduce_into, reduce_packs};
use super::staging::{self, area, part_barrier, part_range, piece, unit_piece, Staged};
use super::{check_part, chunk_elems, ll, ll_rooted, relay, Algorithm, CollContext, CollError, CollStage, Input, Part};
use crate::arch::{load16, store16};
use crate::atomic::Order;
use crate::coop::Coop;
use crate::lsa::{
    ops::{copy_strided, UNROLL},
    LsaBarrierSession,
};
use core::mem::size_of;

/// Whether `count` elements at `a` and at `b` share a byte.
#[inline(always)]
fn overlaps<T>(a: *const T, b: *const T, count: usize) -> bool {
    let bytes = count * size_of::<T>();
    (a as usize) < b as usize + bytes && (b as usize) < a as usize + bytes
}

/// `dst[i] = red over the LSA ranks of src[i]` for `i < count`, on every
/// rank (`ncclAllReduce`). In place when `dst` is `src`'s local address.
///
/// `seq` numbers the LL calls made with `ctx` (LL uses it as its flag):
/// either the host's numbers (`Collectives::next_seq` /
/// `reserve_seq`: non-zero, one more per call, the same on every rank), or
/// 0 for numbers the device counts itself, which a kernel captured into a
/// CUDA graph needs (each replay then numbers its calls afresh). 0 needs a
/// single-part call (`part.count == 1`): parts counting on their own could
/// disagree; with more parts it is [`CollError::BadArgument`].
///
/// # Safety
/// `ctx` is live; `src` holds `count` elements on every rank (in a window:
/// at the same offset), `dst` `count` elements; the ordering of the
/// [module docs](super); every thread of `coop` calls with the same
/// arguments, and every rank with the same `count`, parts, `algorithm` and
/// `seq`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
    algorithm: Algorithm,
    seq: u32,
) -> Result<(), CollError> {
    check_part(ctx, part)?;
    if count == 0 {
        return Ok(());
    }
    let algorithm = algorithm.resolve((count * size_of::<T>()) as u64, ctx);
    // One-shot reads the peers' inputs while writing its output: an output
    // that overlaps a window input (in place) would change what the peers
    // still read, so such an input goes through the staging area.
    let src = match src {
        Input::Window(s) if algorithm == Algorithm::OneShot && overlaps(s.local(), dst, count) => {
            Input::Local(s.local())
        }
        s => s,
    };
    // SAFETY: this function's contract.
    unsafe {
        match algorithm {
            Algorithm::Ll => ll::all_reduce(coop, ctx, part, src.local(), dst, count, red, seq),
            Algorithm::TwoShot => two_shot(coop, ctx, part, src.local(), dst, count, red),
            _ => one_shot(coop, ctx, part, src, dst, count, red, None),
        }
    }
}

/// One-shot: every rank (or only `root`) reduces the part's range: a
/// reduction of one block ([`reduce_range`] with blocks 0 elements apart).
/// A local input is pushed (one barrier per chunk), a window input read
/// in place. On 2 ranks that moves the same NVLink bytes as the two-shot in
/// one phase instead of two.
///
/// # Safety
/// As for [`all_reduce`].
#[allow(clippy::too_many_arguments)]
unsafe fn one_shot<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
    root: Option<u32>,
) -> Result<(), CollError> {
    let (pb, pe) = part_range::<T>(count, part);
    // SAFETY: this function's contract; the part's piece of the one block.
    unsafe { reduce_range(coop, ctx, part, src, 0, pb, pe, dst.wrapping_add(pb), red, root) }
}

/// Two-shot, pushed: for each chunk of the part's range, every rank stores
/// shard `p` of its input into rank `p`'s staging slot (barrier); rank `r`
/// reduces shard `r` from its own input and those slots, and stores the
/// result into its output and every peer's result slot (barrier); each
/// copies the others' shards out. Only stores cross NVLink.
///
/// # Safety
/// As for [`all_reduce`].
unsafe fn two_shot<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    let unit = 16 / size_of::<T>();
    let size = size_of::<T>();
    let (pb, pe) = part_range::<T>(count, part);
    // A slot holds one shard: `n` of them fill the part's slice.
    let shard = chunk_elems::<T>(ctx, part, n);
    let chunk = shard * n as usize;
    // SAFETY: `ctx` is live and its barriers are the collectives' (the contract).
    let mut bar = unsafe { part_barrier(coop, ctx, part) }?;
    ctx.stamp(coop, part, CollStage::Ready);
    let mut c0 = pb;
    while c0 < pe {
        let m = chunk.min(pe - c0);
        let shard_of = |p: u32| piece(m, unit, n as usize, p as usize);
        // Slot `q` of a rank's slice: shard `q`'s sender (inputs) or owner
        // (results), `shard` elements apart.
        let inputs = Staged::new(ctx.scratch(), area(ctx, part, bar.epoch()), (shard * size) as u64);
        for k in 1..n {
            let p = (me + k) % n;
            let (b, e) = shard_of(p);
            // SAFETY: the input holds the chunk (the contract); peer `p`'s
            // slot holds `shard >= e - b` elements and was last read before
            // `p` arrived at this epoch (`staging`).
            unsafe { copy_strided(t, nt, inputs.at(p, me, 0), src.add(c0 + b) as *const u8, (e - b) * size) };
        }
        ctx.stamp(coop, part, CollStage::Sent);
        // SAFETY: as above.
        unsafe { bar.sync(coop, Order::AcqRel) }?;
        ctx.stamp(coop, part, CollStage::Synced);
        let results = Staged::new(ctx.scratch(), area(ctx, part, bar.epoch()), (shard * size) as u64);
        let (b, e) = shard_of(me);
        let from = |p: u32| if p == me { src.wrapping_add(c0 + b) } else { inputs.at(me, p, 0) as *const T };
        let to = |q: u32| if q == me { dst.wrapping_add(c0 + b) } else { results.at(q, me, 0) as *mut T };
        // SAFETY: every peer stored its shard `me` into the caller's slots
        // before the barrier; the caller's own shard is its input; the
        // peers' result slots (last read before they arrived at this
        // epoch) and `dst` hold the shard.
        unsafe { reduce_into(t, nt, n, &from, n, &to, 0, e - b, red) };
        // SAFETY: as above.
        unsafe { bar.sync(coop, Order::AcqRel) }?;
        for k in 1..n {
            let q = (me + k) % n;
            let (b, e) = shard_of(q);
            // SAFETY: shard `q`'s owner stored it into the caller's slot
            // before the barrier; `dst` holds the chunk.
            unsafe { copy_strided(t, nt, dst.add(c0 + b) as *mut u8, results.at(me, q, 0), (e - b) * size) };
        }
        c0 += m;
    }
    Ok(())
}

/// `dst[i] = red over the LSA ranks of src[i]` on `root` only
/// (`ncclReduce`); other ranks' `dst` is not touched (may be null).
///
/// `algorithm`: `Ll` sends every rank's input with flags in the same
/// stores to the root (no barrier; up to [`CollContext::ll_bytes`], part 0
/// of a grid moves all of it), `OneShot` sends every rank's input to the
/// root, `TwoShot` relays it (a reduce-scatter over the other ranks, then
/// a gather to the root; teams of three or more, the same as `OneShot` on
/// two), `Auto` picks ([`Algorithm::choose_rooted`]).
///
/// # Safety
/// As for [`all_reduce`], with `root < lsa_size` and `algorithm` the same
/// on every rank.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
    root: u32,
    algorithm: Algorithm,
) -> Result<(), CollError> {
    check_part(ctx, part)?;
    let n = ctx.scratch().lsa_size();
    if root >= n {
        return Err(CollError::BadArgument);
    }
    let algorithm = algorithm.resolve_rooted((count * size_of::<T>()) as u64, ctx, part.count);
    if algorithm == Algorithm::Ll {
        // SAFETY: this function's contract.
        return unsafe { ll_rooted::reduce(coop, ctx, part, src.local(), dst, count, red, root) };
    }
    if count == 0 {
        return Ok(());
    }
    if algorithm == Algorithm::TwoShot && n >= 3 {
        let (pb, pe) = part_range::<T>(count, part);
        // SAFETY: this function's contract; the part's piece of the input.
        return unsafe { relay::reduce(coop, ctx, part, src.local(), dst.wrapping_add(pb), pb, pe, red, root) };
    }
    // SAFETY: this function's contract.
    unsafe { one_shot(coop, ctx, part, src, dst, count, red, Some(root)) }
}

/// `dst[i] = red over the LSA ranks r of src_r[me * count + i]` for `i <
/// count` (`ncclReduceScatter`): `src` holds `lsa_size * count` elements,
/// `dst` `count`.
///
/// # Safety
/// As for [`all_reduce`] (no LL), with those sizes; `dst` does not overlap
/// `src` except as `src`'s own shard (`src + me * count`, in place).
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_scatter<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
) -> Result<(), CollError> {
    check_part(ctx, part)?;
    if count == 0 {
        return Ok(());
    }
    let (pb, pe) = part_range::<T>(count, part);
    // SAFETY: this function's contract; the part's piece of the blocks.
    unsafe { reduce_range(coop, ctx, part, src, count, pb, pe, dst.wrapping_add(pb), red, None) }
}

/// Elements `b..e` of the reduction over the LSA ranks of each rank's
/// block `me`, input blocks `stride` elements apart: `dst[i - b] = red over
/// the LSA ranks r of src_r[me * stride + i]` for `b <= i < e`, on every
/// rank or only on `root`. A reduce-scatter's range (`stride` its count),
/// or with `stride` 0 a one-shot all-reduce's or reduce's (every rank's
/// one block). The part does all of `b..e`; its LSA barrier and staging
/// slice carry it.
///
/// A window input is read in place from the peers' windows between two
/// barriers. A local input is **pushed**: each rank stores its block for
/// `p` into slot `me` of receiver `p`'s staging slice, meets the others at
/// its barrier once, and reduces its own block with its slots (local loads
/// only; the staging area alternates with the barrier epoch, so one
/// barrier per chunk suffices).
///
/// # Safety
/// As for [`reduce_scatter`]: `src` holds `lsa_size` blocks of `stride`
/// elements (`stride` 0: one block) of at least `e` elements on every rank
/// (a window: at the same offset); `dst` holds `e - b` elements where it
/// receives (in place: each element is read before it is written, by one
/// thread); every rank calls with the same `stride`, `b`, `e`, `root` and
/// part.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn reduce_range<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    stride: usize,
    b: usize,
    e: usize,
    dst: *mut T,
    red: &Reduction<T>,
    root: Option<u32>,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    let size = size_of::<T>();
    let receives = |r: u32| root.is_none_or(|root| root == r);
    // SAFETY: `ctx` is live and its barriers are the collectives' (the contract).
    let mut bar = unsafe { part_barrier(coop, ctx, part) }?;
    ctx.stamp(coop, part, CollStage::Ready);
    match src {
        Input::Window(s) => {
            let staged = Staged::new(s.window, s.offset, (stride * size) as u64);
            // SAFETY: the contract: the windows hold the input, complete
            // before the barrier; `dst` holds the range; nobody leaves
            // before every peer is done reading its window.
            unsafe {
                bar.sync(coop, Order::AcqRel)?;
                ctx.stamp(coop, part, CollStage::Synced);
                if receives(me) && e > b {
                    let from = |p: u32| staged.at(p, me, b * size) as *const T;
                    reduce_into(t, nt, n, &from, 1, &|_| dst, 0, e - b, red);
                }
                bar.sync(coop, Order::AcqRel)?;
            }
        }
        // SAFETY: this function's contract, the session just made.
        Input::Local(src) => unsafe { pushed_range(coop, ctx, part, &mut bar, src, stride, b, e, dst, red, root) }?,
    }
    Ok(())
}

/// [`reduce_range`]'s pushed path (a local input), on the part's barrier
/// session `bar`: for each chunk, each rank stores its block for `p` into
/// slot `me` of receiver `p`'s staging slice, meets the others at the
/// barrier once, and reduces its own block with its slots. Compiled into
/// its caller: the host's pushed one-shot kernels run it without a call
/// (see [`all_reduce_pushed`]).
///
/// # Safety
/// As for [`reduce_range`] with a local input; `bar` is `part`'s barrier
/// session of `ctx`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pushed_range<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    bar: &mut LsaBarrierSession<'_>,
    src: *const T,
    stride: usize,
    b: usize,
    e: usize,
    dst: *mut T,
    red: &Reduction<T>,
    root: Option<u32>,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    let size = size_of::<T>();
    let receives = |r: u32| root.is_none_or(|root| root == r);
    // Slot `p` of a receiver's slice: sender `p`'s chunk.
    let chunk = chunk_elems::<T>(ctx, part, n);
    let mut c0 = b;
    while c0 < e {
        let m = chunk.min(e - c0);
        let slots = Staged::new(ctx.scratch(), area(ctx, part, bar.epoch()), (m * size) as u64);
        for k in 1..n {
            let p = (me + k) % n;
            if receives(p) {
                // SAFETY: the input holds block `p`'s chunk; receiver `p`'s
                // slot holds `m <= chunk` elements and was last read before
                // `p` arrived at this epoch (`staging`).
                unsafe {
                    copy_strided(t, nt, slots.at(p, me, 0), src.add(p as usize * stride + c0) as *const u8, m * size)
                };
            }
        }
        ctx.stamp(coop, part, CollStage::Sent);
        // SAFETY: as above.
        unsafe { bar.sync(coop, Order::AcqRel) }?;
        ctx.stamp(coop, part, CollStage::Synced);
        if receives(me) {
            let from = |p: u32| {
                if p == me {
                    src.wrapping_add(me as usize * stride + c0)
                } else {
                    slots.at(me, p, 0) as *const T
                }
            };
            // SAFETY: every sender stored its chunk of block `me` into the
            // caller's slots before the barrier; the caller's own is its
            // input; `dst` holds the range.
            unsafe { reduce_into(t, nt, n, &from, 1, &|_| dst.add(c0 - b), 0, m, red) };
        }
        c0 += m;
    }
    Ok(())
}

/// [`all_reduce`] with [`Algorithm::OneShot`] of a local input (pushed
/// through the staging area: one barrier per chunk), compiled into the
/// caller with no call inside: what the host collectives launch for
/// all-reduces up to [`super::ONE_SHOT_MAX_BYTES`]
/// ([`super::ONE_SHOT_MAX_BYTES_2_RANKS`] on two ranks). A kernel of its
/// own reads its arguments in one go and keeps its state in registers: on
/// 2 × H200 the graphed 2 MiB all-reduce's kernel spent 1.5 µs from its
/// start to its first push, and 1.7 after its barrier, through the
/// general kernel's calls (`benches/results/`, session 18).
///
/// When the part's piece fits one chunk as whole 16-byte packs at aligned
/// addresses (every part of a 2 MiB all-reduce on two ranks), it moves
/// them by *packs*: the barrier's epoch load and the first step's input
/// loads go out first (only the pushes' addresses wait for the epoch),
/// the reduce's addresses are known before the barrier, and
/// nothing else (no division, no per-peer alignment check, no tail loop)
/// stands between the barrier and the loads. Its data movement is the
/// general path's (the same slots, one barrier, the same reduction
/// order), so ranks that take different paths for a part (different
/// alignments) still work together. Both paths share the loop and its one
/// barrier call: a second call site made LLVM compile the barrier's wait
/// out of line, and the kernels copy their whole parameter to local memory
/// for such a call (`entry_copy` test).
///
/// # Safety
/// As for [`all_reduce`], with `src` local device memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_reduce_pushed<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
) -> Result<(), CollError> {
    // SAFETY: this function's contract.
    unsafe { all_reduce_pushed_by(coop, ctx, part, src, dst, count, || Ok(*red)) }
}

/// [`all_reduce_pushed`] with its reduction made by `make`, once, after the
/// part's first pushes are issued and before its barrier (an error then
/// returns on every rank before anyone arrives, when every rank gets it,
/// as with the host's arguments: nobody waits). The host collectives'
/// kernels decode the operator and read a device scalar from their
/// parameter there, off the way of the first loads and pushes: at entry,
/// every instruction before the first push delays it (see
/// `benches/results/2026-11-28-h200x2-allreduce-packs.md`).
///
/// # Safety
/// As for [`all_reduce_pushed`]; `make` gives every rank the same result.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_reduce_pushed_by<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    dst: *mut T,
    count: usize,
    make: impl Fn() -> Result<Reduction<T>, CollError>,
) -> Result<(), CollError> {
    let mut reduction: Option<Reduction<T>> = None;
    check_part(ctx, part)?;
    if count == 0 {
        return Ok(());
    }
    // The barrier's epoch load goes out first: the pushes' addresses wait
    // for it, and nothing else does.
    // SAFETY: `ctx` is live and its barriers are the collectives' (the contract).
    let mut bar = unsafe { part_barrier(coop, ctx, part) }?;
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let scratch = ctx.scratch();
    let (me, n) = (scratch.lsa_rank(), scratch.lsa_size());
    let size = size_of::<T>();
    // The part's piece in 16-byte units, `[ub, ue)` (`part_range`'s cut):
    // all whole but a last partial one. `whole` and `packs` come from the
    // units; the element bounds are clamped to `count`.
    let unit = 16 / size;
    let (ub, ue) = unit_piece(count.div_ceil(unit), part.count, part.index);
    let (pb, pe) = ((ub * unit).min(count), (ue * unit).min(count));
    let (from, to) = (src.wrapping_add(pb), dst.wrapping_add(pb));
    // Whole aligned packs (none partial, `src` and `dst` 16-byte aligned,
    // so `from` and `to` are): the first step's loads go out at once;
    // whether the packs fit one chunk is asked after.
    let whole = ue * unit <= count && (src as usize | dst as usize) % 16 == 0;
    let packs = if whole { ue - ub } else { 0 };
    let step = nt * UNROLL;
    // Step `base`'s packs of the input (those below `packs`).
    let load_step = |base: usize| {
        let mut v = [[0u32; 4]; UNROLL];
        each_lane!(UNROLL, |u| {
            let i = base + u * nt;
            if i < packs {
                // SAFETY: pack `i < packs` lies in the part's piece of the
                // input (valid: the contract; 16-byte aligned: `whole`).
                v[u] = unsafe { load16((from as *const u8).add(i * 16)) };
            }
        });
        v
    };
    let first = load_step(t);
    ctx.stamp(coop, part, CollStage::Ready);
    // The part's slice, once (a division). Whole packs fit one chunk when
    // `n` copies of them fit the slice: `packs * 16 <= chunk_elems * size`
    // for a multiple of 16, without `chunk_elems`' divisions.
    let (slice_at, slice_bytes) = staging::slice(ctx, part);
    let packed = whole && packs * 16 * n as usize <= slice_bytes;
    let chunk = if packed { pe - pb } else { chunk_elems::<T>(ctx, part, n) };
    let mut c0 = pb;
    while c0 < pe {
        let m = chunk.min(pe - c0);
        // Slot `p` of a receiver's slice: sender `p`'s chunk (at `area`).
        let at = ctx.stage_area_offset(bar.epoch()) + slice_at;
        let slots = Staged::new(scratch, at, (m * size) as u64);
        if packed {
            // Step `base`'s packs `v` into the caller's slot of every other
            // rank's slice.
            let push = |base: usize, v: &[[u32; 4]; UNROLL]| {
                for k in 1..n {
                    let slot = slots.at((me + k) % n, me, 0);
                    each_lane!(UNROLL, |u| {
                        let i = base + u * nt;
                        if i < packs {
                            // SAFETY: pack `i < packs` of the slot (one
                            // chunk: `packed`), last read before that rank
                            // arrived at this epoch (`staging`); this
                            // thread's alone.
                            unsafe { store16(slot.add(i * 16), v[u]) };
                        }
                    });
                }
            };
            push(t, &first);
            let mut base = t + step;
            while base < packs {
                push(base, &load_step(base));
                base += step;
            }
        } else {
            for k in 1..n {
                // SAFETY: the input holds the chunk; receiver `p`'s slot
                // holds `m <= chunk` elements and was last read before `p`
                // arrived at this epoch (`staging`).
                unsafe { copy_strided(t, nt, slots.at((me + k) % n, me, 0), src.add(c0) as *const u8, m * size) };
            }
        }
        ctx.stamp(coop, part, CollStage::Sent);
        // The reduction is needed from here on only: made after the first
        // pushes are out, off their way. An error returns before the
        // barrier on every rank alike (`make`'s contract), so nobody waits.
        let red = &match reduction {
            Some(r) => r,
            None => {
                let r = make()?;
                reduction = Some(r);
                r
            }
        };
        // SAFETY: as above.
        unsafe { bar.sync(coop, Order::AcqRel) }?;
        ctx.stamp(coop, part, CollStage::Synced);
        let input = |p: u32| if p == me { src.wrapping_add(c0) } else { slots.at(me, p, 0) as *const T };
        // Every sender stored its chunk into the caller's slots before the
        // barrier; the caller's own is its input; `dst` holds the range
        // (and may be `src`: each element is read before it is written,
        // by the same thread).
        if packed {
            let input = |p: u32| input(p) as *const u8;
            match red.kind() {
                // SAFETY: as just said; whole aligned packs (`packed`).
                ReducerKind::Sum => unsafe { reduce_packs(t, nt, n, &input, to as *mut u8, packs, &SumOf::<T>::new()) },
                // SAFETY: as above.
                ReducerKind::Any => unsafe { reduce_packs(t, nt, n, &input, to as *mut u8, packs, red) },
            }
        } else {
            // SAFETY: as just said.
            unsafe { reduce_into(t, nt, n, &input, 1, &|_| dst.add(c0), 0, m, red) };
        }
        c0 += m;
    }
    Ok(())
}
