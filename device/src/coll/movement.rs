//! The collectives that move data without reducing it: all-gather,
//! broadcast, gather, scatter, all-to-all. Each works on bytes; `T` only
//! sizes the counts.
//!
//! A local input is **pushed**: every chunk, each rank stores the block a
//! peer needs straight into that peer's staging slot (NVLink stores, which
//! need no round trip per load), meets the others at its barrier, and
//! copies what arrived in its own slots to the output. The staging area
//! alternates with the barrier epoch (`staging`), so one barrier per chunk
//! suffices. A window input is **pulled** in place (zero copy): each rank
//! reads the peers' windows between two barriers.

use super::staging::{area, part_barrier, piece, slice, Staged};
use super::{check_part, ll_rooted, relay, Algorithm, CollContext, CollError, Input, Part};
use crate::atomic::Order;
use crate::coop::Coop;
use crate::lsa::ops::copy_strided;
use core::mem::size_of;

/// The shape of one data movement: per rank, `blocks_in` blocks of `bytes`
/// each in the input (the block rank `r` receives from each source is
/// `read_block(r)`), and `bytes` per source rank in the output.
struct Movement {
    /// Bytes per block.
    bytes: usize,
    /// Which ranks' inputs are sent: `None` all, `Some(r)` only `r`'s.
    only_from: Option<u32>,
    /// Which rank receives: `None` all, `Some(r)` only `r`.
    only_to: Option<u32>,
}

impl Movement {
    fn sends(&self, r: u32) -> bool {
        self.only_from.is_none_or(|f| f == r)
    }
    fn receives(&self, r: u32) -> bool {
        self.only_to.is_none_or(|t| t == r)
    }
    /// Staging slots per receiver, and the slot source `q` fills.
    fn slots(&self, n: u32) -> u32 {
        if self.only_from.is_some() {
            1
        } else {
            n
        }
    }
    fn slot(&self, q: u32) -> u32 {
        if self.only_from.is_some() {
            0
        } else {
            q
        }
    }
}

/// Runs `mv`: every receiving rank `r` gets, from every sending rank `p`,
/// block `read_block(r)` of `p`'s input at `dst + out_offset(p)` (bytes).
///
/// # Safety
/// As for the collectives (ordering, sizes: `src` holds the blocks read,
/// `dst` what `out_offset` addresses); every rank passes the same shape.
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
    let n = ctx.scratch().lsa_size();
    if mv.only_from.is_some_and(|r| r >= n) || mv.only_to.is_some_and(|r| r >= n) {
        return Err(CollError::BadArgument);
    }
    if mv.bytes == 0 {
        return Ok(());
    }
    // SAFETY: this function's contract.
    unsafe {
        match src {
            Input::Local(p) => push(coop, ctx, part, p, dst, &mv, &read_block, &out_offset),
            Input::Window(s) => {
                let staged = Staged::new(s.window, s.offset, mv.bytes as u64);
                pull(coop, ctx, part, staged, src.local(), dst, &mv, &read_block, &out_offset)
            }
        }
    }
}

/// [`run`] for a local input: each chunk is pushed into the receivers'
/// staging slots, then copied out of them.
///
/// # Safety
/// As for [`run`].
#[allow(clippy::too_many_arguments)]
unsafe fn push<C: Coop>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const u8,
    dst: *mut u8,
    mv: &Movement,
    read_block: &impl Fn(u32) -> u32,
    out_offset: &impl Fn(u32) -> usize,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    let (pb, pe) = piece(mv.bytes, 16, part.count as usize, part.index as usize);
    let chunk = ((slice(ctx, part).1 / mv.slots(n) as usize) / 16 * 16).max(16);
    // SAFETY: `ctx` is live and its barriers are the collectives' (the contract).
    let mut bar = unsafe { part_barrier(coop, ctx, part) }?;
    let mut c0 = pb;
    while c0 < pe {
        let m = chunk.min(pe - c0);
        // Slot `s` of a receiver's slice: `m` bytes at `s * m`.
        let slots = Staged::new(ctx.scratch(), area(ctx, part, bar.epoch()), m as u64);
        if mv.sends(me) {
            for k in 0..n {
                // Start with the next rank, so ranks do not all store to rank 0 first.
                let p = (me + k + 1) % n;
                if !mv.receives(p) {
                    continue;
                }
                let block = src.wrapping_add(read_block(p) as usize * mv.bytes + c0);
                let to = if p == me { dst.wrapping_add(out_offset(me) + c0) } else { slots.at(p, mv.slot(me), 0) };
                // In place (the output range is the caller's own input): nothing to move.
                if !core::ptr::eq(block, to) {
                    // SAFETY: the input holds the block's chunk; the output
                    // range (the contract) or the receiver's slot (`m <=
                    // chunk` bytes of its slice, last read before the
                    // receiver arrived at this epoch: `staging`) holds `m`.
                    unsafe { copy_strided(t, nt, to, block, m) };
                }
            }
        }
        // SAFETY: as above.
        unsafe { bar.sync(coop, Order::AcqRel) }?;
        if mv.receives(me) {
            for k in 1..n {
                let q = (me + k) % n;
                if mv.sends(q) {
                    // SAFETY: sender `q` stored the chunk into this slot
                    // before the barrier; `dst` holds the output range.
                    unsafe {
                        copy_strided(t, nt, dst.wrapping_add(out_offset(q) + c0), slots.at(me, mv.slot(q), 0), m)
                    };
                }
            }
        }
        c0 += m;
    }
    Ok(())
}

/// [`run`] for a window input: every receiver reads the senders' windows
/// in place between two barriers.
///
/// # Safety
/// As for [`run`]; `staged` is the input's window (`local` its address on
/// the caller), blocks `bytes` apart.
#[allow(clippy::too_many_arguments)]
unsafe fn pull<C: Coop>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    staged: Staged,
    local: *const u8,
    dst: *mut u8,
    mv: &Movement,
    read_block: &impl Fn(u32) -> u32,
    out_offset: &impl Fn(u32) -> usize,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
    let (pb, pe) = piece(mv.bytes, 16, part.count as usize, part.index as usize);
    // SAFETY: `ctx` is live and its barriers are the collectives' (the contract).
    let mut bar = unsafe { part_barrier(coop, ctx, part) }?;
    // SAFETY: as above.
    unsafe { bar.sync(coop, Order::AcqRel) }?;
    if mv.receives(me) && pe > pb {
        for k in 0..n {
            // Start with the next rank, so ranks do not all read rank 0 first.
            let p = (me + k) % n;
            if !mv.sends(p) {
                continue;
            }
            let out = dst.wrapping_add(out_offset(p) + pb);
            let from = staged.at(p, read_block(me), pb);
            // In place (the output range is the caller's own input): nothing to move.
            if p == me && core::ptr::eq(local.wrapping_add(read_block(me) as usize * mv.bytes + pb), out) {
                continue;
            }
            // SAFETY: peer `p`'s window holds the input (the contract),
            // complete before the barrier; `dst` holds the output range.
            unsafe { copy_strided(t, nt, out, from, pe - pb) };
        }
    }
    // Nobody leaves before every peer is done reading its window.
    // SAFETY: as above.
    unsafe { bar.sync(coop, Order::AcqRel) }?;
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
    let mv = Movement { bytes, only_from: None, only_to: None };
    // SAFETY: this function's contract.
    unsafe { run(coop, ctx, part, src, dst as *mut u8, mv, |_| 0, |p| p as usize * bytes) }
}

/// `dst[i] = src_root[i]` for `i < count` on every rank (`ncclBroadcast`);
/// only the root's `src` is read. In place when `dst` is `src`.
///
/// `algorithm`: `Ll` sends the root's data and flags in the same stores
/// (no barrier; up to [`CollContext::ll_bytes`], part 0 of a grid moves
/// all of it), `OneShot` sends directly from the root, `TwoShot` relays
/// through the other ranks (teams of three or more; the same as `OneShot`
/// on two), `Auto` picks ([`Algorithm::choose_rooted`]).
///
/// # Safety
/// As for [`all_gather`], `dst` holding `count` elements; `root <
/// lsa_size` and `algorithm` the same on every rank.
#[allow(clippy::too_many_arguments)]
pub unsafe fn broadcast<C: Coop, T: Copy>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: Input<T>,
    dst: *mut T,
    count: usize,
    root: u32,
    algorithm: Algorithm,
) -> Result<(), CollError> {
    let (src, bytes) = as_bytes(src, count);
    let n = ctx.scratch().lsa_size();
    let algorithm = algorithm.resolve_rooted(bytes as u64, ctx, part.count);
    if algorithm == Algorithm::Ll {
        // SAFETY: this function's contract.
        return unsafe { ll_rooted::broadcast(coop, ctx, part, src.local(), dst as *mut u8, bytes, root) };
    }
    if algorithm == Algorithm::TwoShot && n >= 3 {
        check_part(ctx, part)?;
        if root >= n {
            return Err(CollError::BadArgument);
        }
        let (pb, pe) = piece(bytes, 16, part.count as usize, part.index as usize);
        // SAFETY: this function's contract; the part's piece of the message.
        return unsafe { relay::broadcast(coop, ctx, part, src.local(), dst as *mut u8, pb, pe, root) };
    }
    let mv = Movement { bytes, only_from: Some(root), only_to: None };
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
    let mv = Movement { bytes, only_from: None, only_to: Some(root) };
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
    let (src, bytes) = as_bytes(src, count);
    let mv = Movement { bytes, only_from: Some(root), only_to: None };
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
    let (src, bytes) = as_bytes(src, count);
    let mv = Movement { bytes, only_from: None, only_to: None };
    // SAFETY: this function's contract.
    unsafe { run(coop, ctx, part, src, dst as *mut u8, mv, |me| me, |p| p as usize * bytes) }
}
