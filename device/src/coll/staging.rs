//! How a collective splits its work and where peers find its input.
//!
//! The message is first split between the [`Part`](super::Part)s (CTAs),
//! in whole 16-byte units; each part then works through its range in
//! *chunks* that fit its own slice of the staging areas (`stage_bytes /
//! parts`), or in one go when the input lies in a window. Every rank splits
//! alike, so part `b` on one rank stages exactly the bytes that part `b` on
//! the others reads, in a slice no other part touches: the part's own LSA
//! barrier is all the synchronisation a chunk needs, and parts never wait
//! for each other.

use crate::comm::WindowDesc;
use crate::lsa;

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

/// The part's slice of each staging area: (offset from the area's start,
/// bytes), 16-byte aligned.
#[inline(always)]
pub(crate) fn slice(ctx: &super::CollContext, part: super::Part) -> (u64, usize) {
    let bytes = (ctx.stage_bytes() as usize / part.count as usize) / 16 * 16;
    (part.index as u64 * bytes as u64, bytes)
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

/// Copies bytes `[begin, end)` of each of `blocks` blocks of a local input
/// (`src`, blocks `src_stride` bytes apart) into the same places of
/// `staged`'s blocks on the caller (thread `t` of `nt`).
///
/// # Safety
/// `src` valid for the bytes read; the staged blocks are the caller's
/// scratch, large enough, not read by anyone until the next barrier.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn stage_in(
    t: usize,
    nt: usize,
    staged: &Staged,
    me: u32,
    src: *const u8,
    src_stride: usize,
    blocks: u32,
    begin: usize,
    end: usize,
) {
    for q in 0..blocks {
        // SAFETY: the caller's contract: `src` block `q` holds bytes
        // `begin..end`, and so does the caller's staging block `q`; the two
        // do not overlap (scratch is the library's own memory).
        unsafe {
            lsa::ops::copy_strided(
                t,
                nt,
                staged.at(me, q, begin),
                src.add(q as usize * src_stride + begin),
                end - begin,
            )
        };
    }
}
