//! The collectives that move data without reducing it: all-gather,
//! broadcast, gather, scatter, all-to-all. Each works on bytes; `T` only
//! sizes the counts.
//!
//! Every chunk: the part stages its bytes (when the input is local),
//! meets the other ranks' same part at its barrier, copies what it needs
//! from the peers, and meets them again (so that nobody overwrites an input
//! or a staging area a peer still reads).

use super::staging::{piece, slice, stage_in, Staged};
use super::{check_part, CollContext, CollError, Input, Part};
use crate::atomic::Order;
use crate::coop::Coop;
use crate::lsa::{ops::copy_strided, LsaBarrierSession};
use core::mem::size_of;

/// The shape of one data movement: per rank, `blocks_in` blocks of `bytes`
/// each in the input (the block peer `r` reads is `read_block(r)`), and
/// `bytes` per source rank in the output.
struct Movement {
    /// Bytes per block.
    bytes: usize,
    /// Blocks in each rank's input (1 or `lsa_size`).
    blocks_in: u32,
    /// Which ranks' inputs are read: `None` all, `Some(r)` only `r`'s.
    only_from: Option<u32>,
    /// Whether this rank writes output.
    copy_out: bool,
}

/// Runs `mv`: rank `me` copies, for every source `p` it reads, block
/// `read_block(me)` of `p`'s input to `dst + out_offset(p)` (bytes).
///
/// # Safety
/// As for the collectives (ordering, sizes: `src` holds `blocks_in *
/// bytes`, `dst` what `out_offset` addresses); every rank passes the same
/// shape.
#[allow(clippy::too_many_arguments)]
unsafe fn run<C: Coop>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<u8>,
    dst: *mut u8,
    mv: Movement,
    read_block: impl Fn(u32) -> u32,
    out_offset: impl Fn(u32) -> usize,
) -> Result<(), CollError> {
    check_part(ctx, part)?;
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    if mv.only_from.is_some_and(|r| r >= n) {
        return Err(CollError::BadArgument);
    }
    if mv.bytes == 0 {
        return Ok(());
    }
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let stages = mv.only_from.is_none_or(|r| r == me);
    let (pb, pe) = piece(mv.bytes, 16, part.count as usize, part.index as usize);
    let chunk = match src {
        Input::Window(_) => (pe - pb).max(1),
        Input::Local(_) => ((slice(ctx, part).1 / mv.blocks_in as usize) / 16 * 16).max(16),
    };
    // SAFETY: `ctx` is live and its barriers are the collectives' (the contract).
    let mut bar = unsafe { LsaBarrierSession::new(coop, ctx.comm(), ctx.barrier_base() + part.index) }?;
    let mut c0 = pb;
    while c0 < pe {
        let m = chunk.min(pe - c0);
        let staged = match src {
            Input::Window(s) => Staged::new(s.window, s.offset + c0 as u64, mv.bytes as u64),
            Input::Local(p) => {
                let staged = Staged::new(ctx.scratch(), ctx.stage_in_offset() + slice(ctx, part).0, m as u64);
                if stages {
                    // SAFETY: the input holds `blocks_in` blocks of `bytes`;
                    // the part's slice holds `blocks_in * m` bytes.
                    unsafe { stage_in(t, nt, &staged, me, p.add(c0), mv.bytes, mv.blocks_in, 0, m) };
                }
                staged
            }
        };
        // SAFETY: as above.
        unsafe { bar.sync(coop, Order::AcqRel) }?;
        if mv.copy_out {
            for k in 0..n {
                // Start with the next rank, so ranks do not all read rank 0 first.
                let p = (me + k) % n;
                if mv.only_from.is_some_and(|r| r != p) {
                    continue;
                }
                let out = dst.wrapping_add(out_offset(p) + c0);
                // In place (the output range is the caller's own input):
                // nothing to move.
                if p == me && core::ptr::eq(src.local().wrapping_add(read_block(me) as usize * mv.bytes + c0), out) {
                    continue;
                }
                // SAFETY: peer `p` staged (or holds in its window) block
                // `read_block(me)`'s chunk before the barrier; `dst` holds
                // the output range (the contract).
                unsafe { copy_strided(t, nt, out, staged.at(p, read_block(me), 0), m) };
            }
        }
        // SAFETY: as above.
        unsafe { bar.sync(coop, Order::AcqRel) }?;
        c0 += m;
    }
    Ok(())
}

/// Bytes of `count` elements of `T`, and the input as bytes.
#[inline(always)]
fn as_bytes<T>(src: Input<T>, count: usize) -> (Input<u8>, usize) {
    let src = match src {
        Input::Local(p) => Input::Local(p as *const u8),
        Input::Window(s) => Input::Window(crate::comm::SymPtr::new(s.window, s.offset)),
    };
    (src, count * size_of::<T>())
}

/// `dst[r * count + i] = src_r[i]` for every LSA rank `r`, `i < count`, on
/// every rank (`ncclAllGather`). In place when `src` is `dst + me * count`.
///
/// # Safety
/// `ctx` live; `src` holds `count` elements on every rank, `dst`
/// `lsa_size * count`; the ordering of the [module docs](super); every
/// thread of `coop` and every rank call with the same `count`.
pub unsafe fn all_gather<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
) -> Result<(), CollError> {
    let (src, bytes) = as_bytes(src, count);
    let mv = Movement { bytes, blocks_in: 1, only_from: None, copy_out: true };
    // SAFETY: this function's contract.
    unsafe { run(coop, ctx, part, src, dst as *mut u8, mv, |_| 0, |p| p as usize * bytes) }
}

/// `dst[i] = src_root[i]` for `i < count` on every rank (`ncclBroadcast`);
/// only the root's `src` is read. In place when `dst` is `src`.
///
/// # Safety
/// As for [`all_gather`], `dst` holding `count` elements; `root <
/// lsa_size` the same on every rank.
pub unsafe fn broadcast<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    root: u32,
) -> Result<(), CollError> {
    let (src, bytes) = as_bytes(src, count);
    let mv = Movement { bytes, blocks_in: 1, only_from: Some(root), copy_out: true };
    // SAFETY: this function's contract.
    unsafe { run(coop, ctx, part, src, dst as *mut u8, mv, |_| 0, |_| 0) }
}

/// `dst[r * count + i] = src_r[i]` on `root` (`ncclGather`); other ranks'
/// `dst` is not touched.
///
/// # Safety
/// As for [`all_gather`] (`dst` on the root), `root < lsa_size`.
pub unsafe fn gather<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    root: u32,
) -> Result<(), CollError> {
    let (src, bytes) = as_bytes(src, count);
    if root >= ctx.scratch().lsa_size() {
        return Err(CollError::BadArgument);
    }
    let mv = Movement { bytes, blocks_in: 1, only_from: None, copy_out: ctx.scratch().lsa_rank() == root };
    // SAFETY: this function's contract.
    unsafe { run(coop, ctx, part, src, dst as *mut u8, mv, |_| 0, |p| p as usize * bytes) }
}

/// `dst[i] = src_root[me * count + i]` for `i < count` (`ncclScatter`):
/// the root's `src` holds `lsa_size * count` elements.
///
/// # Safety
/// As for [`all_gather`] with those sizes, `root < lsa_size`.
pub unsafe fn scatter<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    root: u32,
) -> Result<(), CollError> {
    let n = ctx.scratch().lsa_size();
    let (src, bytes) = as_bytes(src, count);
    let mv = Movement { bytes, blocks_in: n, only_from: Some(root), copy_out: true };
    // SAFETY: this function's contract.
    unsafe { run(coop, ctx, part, src, dst as *mut u8, mv, |me| me, |_| 0) }
}

/// `dst[r * count + i] = src_r[me * count + i]` for every rank `r`, `i <
/// count` (`ncclAllToAll`): `src` and `dst` hold `lsa_size * count`
/// elements and do not overlap.
///
/// # Safety
/// As for [`all_gather`] with those sizes.
pub unsafe fn all_to_all<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
) -> Result<(), CollError> {
    let n = ctx.scratch().lsa_size();
    let (src, bytes) = as_bytes(src, count);
    let mv = Movement { bytes, blocks_in: n, only_from: None, copy_out: true };
    // SAFETY: this function's contract.
    unsafe { run(coop, ctx, part, src, dst as *mut u8, mv, |me| me, |p| p as usize * bytes) }
}
