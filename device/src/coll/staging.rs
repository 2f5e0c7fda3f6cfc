//! How a collective splits its work and where peers find its data.
//!
//! The message is first split between the [`Part`](super::Part)s (CTAs),
//! in whole 16-byte units; each part then works through its range in
//! *chunks* that fit its own slice of a staging area (`stage_bytes /
//! ctx.parts()`, the same slice for part `b` in every call), or in one go when the input lies in a window and peers read it
//! in place. Every rank splits alike, so part `b` on one rank moves exactly
//! the bytes that part `b` on the others expects, in a slice no other part
//! touches: the part's own LSA barrier is all the synchronisation a chunk
//! needs, and parts never wait for each other.
//!
//! ## Which staging area: the barrier epoch's parity
//!
//! The scratch window has two staging areas. Data written into a part's
//! slice (its own, staged for peers to read, or a peer's, pushed there)
//! while the part's barrier stands at epoch `e` — after the wait for `e`,
//! before the arrival at `e + 1` — goes into area `e & 1` ([`area`]), and
//! is read only between the wait for `e + 1` and the reader's arrival at
//! `e + 2`. The next write into that area happens at epoch `e + 2` or
//! later, after every rank arrived at `e + 2`: after every read of the
//! earlier data. So a collective needs one barrier per chunk where it
//! writes in one step and reads in the next (pushes, then local reads), and
//! every collective may follow any other on the same part without a
//! closing barrier: the rule holds across calls and algorithms because the
//! epochs count on.

use crate::comm::WindowDesc;
use crate::lsa::LsaBarrierSession;

/// `[begin, end)` of piece `i` of `pieces` of `len` bytes, cut at
/// multiples of `unit` (the last piece takes the tail).
#[inline(always)]
pub(crate) fn piece(len: usize, unit: usize, pieces: usize, i: usize) -> (usize, usize) {
    let units = len.div_ceil(unit);
    let base = units / pieces;
    let rem = units % pieces;
    let ub = i * base + if i < rem { i } else { rem };
    let ue = ub + base + (i < rem) as usize;
    ((ub * unit).min(len), (ue * unit).min(len))
}

/// `[begin, end)` of piece `i < pieces` of `units` whole units ([`piece`]
/// with `unit` 1), in 32-bit arithmetic when `units` fits: where a
/// kernel's first loads wait for the cut, the 64-bit one's longer chain
/// delays them.
#[inline(always)]
pub(crate) fn unit_piece(units: usize, pieces: u32, i: u32) -> (usize, usize) {
    if units <= u32::MAX as usize {
        let u = units as u32;
        let (base, rem) = (u / pieces, u % pieces);
        // `i * base + min(i, rem) <= u`: no overflow.
        let ub = i * base + i.min(rem);
        (ub as usize, (ub + base + (i < rem) as u32) as usize)
    } else {
        piece(units, 1, pieces as usize, i as usize)
    }
}

/// `[begin, end)` of part `part`'s piece of `count` elements of `T`, cut
/// at whole 16-byte units (see [`piece`]).
#[inline(always)]
pub(crate) fn part_range<T>(count: usize, part: super::Part) -> (usize, usize) {
    piece(count, 16 / core::mem::size_of::<T>(), part.count as usize, part.index as usize)
}

/// Opens part `part`'s LSA barrier (`barrier_base + part.index` of the
/// context's device communicator), whose epochs order its staging.
///
/// # Safety
/// As for [`LsaBarrierSession::new`]: `ctx` is live and its barriers are
/// the collectives', used by this part's coop alone.
#[inline(always)]
pub(crate) unsafe fn part_barrier<'a, C: crate::coop::Coop>(
    coop: &C,
    ctx: &'a super::CollContext,
    part: super::Part,
) -> Result<LsaBarrierSession<'a>, crate::lsa::BarrierError> {
    // SAFETY: this function's contract.
    unsafe { LsaBarrierSession::new(coop, ctx.comm(), ctx.barrier_base() + part.index) }
}

/// The part's slice of each staging area: (offset from the area's start,
/// bytes), 256-byte aligned (16 when the slices are smaller), so parts
/// share no cache line.
///
/// Part `b` always gets the same slice, however many parts a call has
/// (`stage_bytes / ctx.parts()`): only barrier `b`'s epochs order its
/// writes and reads (see [the module docs](self)), so a slice shared by
/// parts of different indices in consecutive calls would let a writer of
/// the second call push into bytes a reader of the first still copies out.
#[inline(always)]
pub(crate) fn slice(ctx: &super::CollContext, part: super::Part) -> (u64, usize) {
    let raw = ctx.stage_bytes() as usize / ctx.parts().max(1) as usize;
    let bytes = if raw >= 256 { raw / 256 * 256 } else { raw / 16 * 16 };
    (part.index as u64 * bytes as u64, bytes)
}

/// Offset in the scratch window of the part's slice of the staging area
/// for data written at barrier epoch `epoch` (see [the module docs](self)).
#[inline(always)]
pub(crate) fn area(ctx: &super::CollContext, part: super::Part, epoch: u32) -> u64 {
    ctx.stage_area_offset(epoch) + slice(ctx, part).0
}

/// Where the peers find a chunk of input, by (peer, block, byte offset):
/// either the input's own window (zero copy) or the staging area of the
/// scratch window. `block` is the index of a per-destination or per-shard
/// block of the input (`block_stride` bytes apart).
#[derive(Clone, Copy)]
pub(crate) struct Staged {
    window: WindowDesc,
    base: u64,
    block_stride: u64,
}

impl Staged {
    /// The input in `window` at byte `base`, blocks `block_stride` apart.
    #[inline(always)]
    pub(crate) fn new(window: WindowDesc, base: u64, block_stride: u64) -> Self {
        Staged { window, base, block_stride }
    }

    /// Byte `off` of block `block` in LSA peer `peer`'s copy.
    #[inline(always)]
    pub(crate) fn at(&self, peer: u32, block: u32, off: usize) -> *mut u8 {
        self.window.lsa_ptr(self.base + block as u64 * self.block_stride + off as u64, peer)
    }
}
