//! Broadcast and reduce on three ranks or more, relayed by the ranks other
//! than the root ([`Algorithm::TwoShot`](super::Algorithm::TwoShot) for
//! these two collectives).
//!
//! Sent directly, a broadcast's root stores the message once per receiver
//! and a reduce's root receives it once per sender: the root's link
//! carries `n - 1` messages while the others' idle (on 4 × H200: 120 GB/s
//! where NCCL's ring gave 326, `benches/results/2026-11-26-h200x4-scale.md`).
//! Relayed, each chunk is cut into `n - 1` pieces, one per *helper* (every
//! rank but the root, helper `h` being rank `root + 1 + h`), and goes in
//! two steps:
//!
//! - broadcast: the root stores piece `h` into helper `h`'s slot; then
//!   helper `h` copies it out and stores it into every other helper's slot
//!   `h`, and they copy it out;
//! - reduce: every rank stores its piece `h` into helper `h`'s slot of that
//!   sender; then helper `h` reduces the piece from its input and those
//!   slots, in rank order, into the root's result slot `h`, and the root
//!   copies the results out.
//!
//! Every link then carries about one message each way, as a ring does, in
//! two steps instead of `n - 1` hops. The steps of consecutive chunks
//! overlap: in one barrier epoch a rank does the first step of chunk `c`,
//! the second of chunk `c - 1` and the copy out of chunk `c - 2`, so a part
//! of `k` chunks meets its barrier `k + 1` times. Data stored at epoch `e`
//! lands in staging area `e & 1` and is read at epoch `e + 1` (the rule of
//! [`staging`](super::staging)), so one barrier per epoch suffices.

use super::element::Element;
use super::op::Reduction;
use super::pack::reduce_into;
use super::staging::{area, part_barrier, piece};
use super::{chunk_elems, CollContext, CollError, Part};
use crate::atomic::Order;
use crate::coop::Coop;
use crate::lsa::ops::copy_strided;
use core::mem::size_of;

/// The shape of one relayed collective on a part: its range, its chunks,
/// and who helps.
struct Relay {
    /// This rank, the team's size and the root.
    me: u32,
    n: u32,
    root: u32,
    /// The part's range `[b, e)` (elements) and elements per chunk.
    b: usize,
    e: usize,
    chunk: usize,
    /// Elements per slot, the pieces' unit (16 bytes) and bytes per element.
    slot: usize,
    unit: usize,
    size: usize,
}

impl Relay {
    /// For a part's `[b, e)` of elements of `T`, with `slots` slots per
    /// rank in the part's staging slice.
    fn new<T>(ctx: &CollContext, part: Part, b: usize, e: usize, root: u32, slots: u32) -> Relay {
        let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
        let slot = chunk_elems::<T>(ctx, part, slots);
        let size = size_of::<T>();
        Relay { me, n, root, b, e, chunk: slot * (n as usize - 1), slot, unit: 16 / size, size }
    }
    fn chunks(&self) -> usize {
        (self.e - self.b).div_ceil(self.chunk)
    }
    /// Chunk `c`'s first element and length.
    fn range(&self, c: usize) -> (usize, usize) {
        let c0 = self.b + c * self.chunk;
        (c0, self.chunk.min(self.e - c0))
    }
    /// Helper `h`'s piece `[b, e)` of a chunk of `m` elements (offsets in the chunk).
    fn piece(&self, m: usize, h: u32) -> (usize, usize) {
        piece(m, self.unit, self.n as usize - 1, h as usize)
    }
    fn rank_of(&self, h: u32) -> u32 {
        (self.root + 1 + h) % self.n
    }
    /// This rank's helper index (`None` on the root).
    fn helper(&self) -> Option<u32> {
        (self.me != self.root).then(|| (self.me + self.n - self.root - 1) % self.n)
    }
    /// Slot `s` of `peer`'s slice of the staging area at `area`.
    fn at<P>(&self, ctx: &CollContext, area: u64, peer: u32, s: u32) -> *mut P {
        ctx.scratch().lsa_ptr::<P>(area + (s as usize * self.slot * self.size) as u64, peer)
    }
}

/// Runs `step(i, cur, prev)` for the epochs `i` of a relay of `chunks`
/// chunks (`0..chunks + 2`; none when `chunks` is 0), `cur` the offset of
/// the part's staging slice for data stored in this epoch and `prev` that
/// of the data stored in the one before; the part's LSA barrier after each
/// epoch but the last, which only reads what the one before stored.
///
/// # Safety
/// `ctx` live, its barrier for `part` used by the collectives alone; every
/// thread of `coop` and every rank call with the same `chunks`.
unsafe fn epochs<C: Coop>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    chunks: usize,
    mut step: impl FnMut(usize, u64, u64),
) -> Result<(), CollError> {
    if chunks == 0 {
        return Ok(());
    }
    // SAFETY: the contract.
    let mut bar = unsafe { part_barrier(coop, ctx, part) }?;
    for i in 0..chunks + 2 {
        step(i, area(ctx, part, bar.epoch()), area(ctx, part, bar.epoch().wrapping_sub(1)));
        if i <= chunks {
            // SAFETY: as above.
            unsafe { bar.sync(coop, Order::AcqRel) }?;
        }
    }
    Ok(())
}

/// `dst[i] = src_root[i]` for the part's bytes `[b, e)`, relayed (see the
/// [module docs](self)). Slots: 0 the root's piece, `1 + g` helper `g`'s.
///
/// # Safety
/// As for [`super::broadcast`] on a team of three or more, `src` local (read
/// on the root); every rank calls with the same `b`, `e`, `root` and part.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn broadcast<C: Coop>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const u8,
    dst: *mut u8,
    b: usize,
    e: usize,
    root: u32,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let r = Relay::new::<u8>(ctx, part, b, e, root, ctx.scratch().lsa_size());
    let helpers = r.n - 1;
    let chunks = r.chunks();
    let step = |i: usize, cur: u64, prev: u64| {
        match r.helper() {
            None if i < chunks => {
                let (c0, m) = r.range(i);
                for h in 0..helpers {
                    let (pb, pe) = r.piece(m, h);
                    // SAFETY: the root's input holds the chunk; helper `h`'s
                    // slot 0 holds a piece (`slot` elements) and was last
                    // read at the previous epoch (`staging`).
                    unsafe { copy_strided(t, nt, r.at(ctx, cur, r.rank_of(h), 0), src.add(c0 + pb), pe - pb) };
                }
                if !core::ptr::eq(src, dst) {
                    // SAFETY: `dst` holds the range (the contract).
                    unsafe { copy_strided(t, nt, dst.add(c0), src.add(c0), m) };
                }
            }
            None => {}
            Some(h) => {
                if (1..=chunks).contains(&i) {
                    let (c0, m) = r.range(i - 1);
                    let (pb, pe) = r.piece(m, h);
                    let mine = r.at::<u8>(ctx, prev, r.me, 0);
                    // SAFETY: the root stored this piece into the caller's
                    // slot 0 before the barrier; `dst` holds the range; the
                    // other helpers' slots `1 + h` were last read at the
                    // previous epoch.
                    unsafe {
                        copy_strided(t, nt, dst.add(c0 + pb), mine, pe - pb);
                        for g in (0..helpers).filter(|&g| g != h) {
                            copy_strided(t, nt, r.at(ctx, cur, r.rank_of(g), 1 + h), mine, pe - pb);
                        }
                    }
                }
                if i >= 2 {
                    let (c0, m) = r.range(i - 2);
                    for g in (0..helpers).filter(|&g| g != h) {
                        let (pb, pe) = r.piece(m, g);
                        // SAFETY: helper `g` stored its piece into the
                        // caller's slot `1 + g` before the barrier.
                        unsafe { copy_strided(t, nt, dst.add(c0 + pb), r.at(ctx, prev, r.me, 1 + g), pe - pb) };
                    }
                }
            }
        }
    };
    // SAFETY: the contract (a live context whose barriers are the collectives').
    unsafe { epochs(coop, ctx, part, chunks, step) }
}

/// `dst[i - b] = red over the LSA ranks of src[i]` for the part's elements
/// `[b, e)`, on `root` only, relayed (see the [module docs](self)). Slots:
/// `p` sender `p`'s piece, `n + h` helper `h`'s result (on the root).
///
/// # Safety
/// As for [`super::reduce`] on a team of three or more, `src` local; `dst`
/// (the root's) holds `e - b` elements and is `src + b` or does not overlap
/// `src`; every rank calls with the same `b`, `e`, `root` and part.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    dst: *mut T,
    b: usize,
    e: usize,
    red: &Reduction<T>,
    root: u32,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let size = size_of::<T>();
    let n = ctx.scratch().lsa_size();
    let r = Relay::new::<T>(ctx, part, b, e, root, 2 * n - 1);
    let chunks = r.chunks();
    let step = |i: usize, cur: u64, prev: u64| {
        if i < chunks {
            let (c0, m) = r.range(i);
            for h in (0..n - 1).filter(|&h| r.rank_of(h) != r.me) {
                let (pb, pe) = r.piece(m, h);
                // SAFETY: the input holds the chunk; helper `h`'s slot `me`
                // holds a piece and was last read at the previous epoch.
                unsafe {
                    copy_strided(
                        t,
                        nt,
                        r.at::<u8>(ctx, cur, r.rank_of(h), r.me),
                        src.add(c0 + pb) as *const u8,
                        (pe - pb) * size,
                    )
                };
            }
        }
        match r.helper() {
            Some(h) if (1..=chunks).contains(&i) => {
                let (c0, m) = r.range(i - 1);
                let (pb, pe) = r.piece(m, h);
                let from = |p: u32| {
                    if p == r.me {
                        src.wrapping_add(c0 + pb)
                    } else {
                        r.at::<T>(ctx, prev, r.me, p) as *const T
                    }
                };
                let to = r.at::<T>(ctx, cur, root, n + h);
                // SAFETY: every other rank stored its piece into the
                // caller's slots before the barrier; the caller's own is its
                // input; the root's result slot was last read at the
                // previous epoch.
                unsafe { reduce_into(t, nt, n, &from, 1, &|_| to, 0, pe - pb, red) };
            }
            None if i >= 2 => {
                let (c0, m) = r.range(i - 2);
                for h in 0..n - 1 {
                    let (pb, pe) = r.piece(m, h);
                    let out = dst.wrapping_add(c0 + pb - b) as *mut u8;
                    // SAFETY: helper `h` stored its result into the caller's
                    // slot `n + h` before the barrier; `dst` holds the range.
                    unsafe { copy_strided(t, nt, out, r.at::<u8>(ctx, prev, r.me, n + h), (pe - pb) * size) };
                }
            }
            _ => {}
        }
    };
    // SAFETY: the contract (a live context whose barriers are the collectives').
    unsafe { epochs(coop, ctx, part, chunks, step) }
}
