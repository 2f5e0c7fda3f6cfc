//! The pushed one-shot all-reduce with a flag per warp: no barrier.
//!
//! The barrier path ([`super::reduce`]'s `pushed_range`) stores a part's
//! range into every peer's staging slot, meets the peers at the part's
//! barrier, then reduces: every warp waits for the slowest store of the
//! whole part, and the reduce starts only when the last byte has drained
//! over NVLink. Here each warp of the part pushes a share of the range of
//! its own (its threads only), and its lanes release the call's number
//! into that warp's flag on every peer (`st.release.sys` after
//! `__syncwarp`); the same warp on each peer acquires those flags and
//! reduces its share at once, while other warps' stores still drain.
//!
//! ## Why two areas by the call's parity suffice
//!
//! Part `b` counts its calls on each rank (every rank makes the same
//! calls, so the counts agree); call `c` pushes into the area of parity
//! `c & 1`. A sender writes area `c & 1` of receiver `R` again in call
//! `c + 2`. Before that, in call `c + 1`, the sender acquired flags `R`
//! released in call `c + 1`; `R` released them after the coop-wide barrier
//! that ends its call `c` ([`Coop::agree`]), so after every read `R` made
//! of call `c`'s area. Any one flag carries that, so the warps' shares may
//! differ from call to call (another coop size, another count). The flags
//! only grow: a waiting warp accepts any count at or past its call's (a
//! sender may already be one call ahead, never two: its next call needs
//! this rank's flags of this call).
//!
//! Each warp's share is a contiguous piece of the part's range, in whole
//! 16-byte units; the slot holds the range in the input's layout, so a
//! share's bytes sit at the same offset in every slot.

use super::element::Element;
use super::op::Reduction;
use super::pack::reduce_into;
use super::staging::piece;
use super::{CollContext, CollError, CollStage, Part};
use crate::arch::WARP_SIZE;
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::lsa::ops::copy_strided;
use crate::wait::{self, Deadline};
use core::mem::size_of;

/// Elements `b..e` of the one-shot all-reduce of the local input `src`
/// into `dst` (which holds the range from `dst[0]`), with a flag per warp
/// (see the [module docs](self)).
///
/// # Safety
/// As for [`super::all_reduce_pushed`]; `b < e`, and the part's range of
/// `(e - b) * size_of::<T>()` bytes fits its slots
/// ([`CollContext::warp_flags_fit`]) on every rank, whose coops have the
/// same size.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn all_reduce<C: Coop, T: Element>(
    coop: &C,
    ctx: &CollContext,
    part: Part,
    src: *const T,
    b: usize,
    e: usize,
    dst: *mut T,
    red: &Reduction<T>,
) -> Result<(), CollError> {
    let (t, nt) = (coop.thread_rank(), coop.size());
    let warp = t / WARP_SIZE;
    let warps = nt.div_ceil(WARP_SIZE).min(crate::abi::coll::WARP_FLAG_WARPS);
    let scratch = ctx.scratch();
    let (me, n) = (scratch.lsa_rank(), scratch.lsa_size());
    let size = size_of::<T>();
    let count_ptr = scratch.local_ptr::<u32>(ctx.warp_flag_count_offset(part.index));
    // SAFETY: `with_warp_flags`' contract: the part's count is an aligned
    // `u32` of this rank's scratch that only this part's coop touches (the
    // caller's contract), atomically.
    let call = unsafe { atomic::load_relaxed(count_ptr, Scope::Gpu) }.wrapping_add(1);
    ctx.stamp(coop, part, CollStage::Ready);
    // A coop of more than 1024 threads (its own `sync_warp` then joins
    // the whole coop): the warps past the flags' count share the last's.
    let w = warp.min(warps - 1);
    let lanes = if w + 1 < warps { WARP_SIZE } else { nt - w * WARP_SIZE };
    let lane = t - w * WARP_SIZE;
    let (wb, we) = piece(e - b, 16 / size, warps as usize, w as usize);
    let slot = |peer: u32, from: u32| scratch.lsa_ptr::<u8>(ctx.warp_flag_slot_offset(call, part.index, from), peer);
    // Push this warp's piece into slot `me` of every peer.
    for k in 1..n {
        let p = (me + k) % n;
        // SAFETY: the input holds the part's range; receiver `p`'s slot
        // holds `e - b` elements (it fits) and was last read before `p`
        // released a flag this rank acquired (the module docs).
        unsafe {
            copy_strided(
                lane as usize,
                lanes as usize,
                slot(p, me).add(wb * size),
                src.add(b + wb) as *const u8,
                (we - wb) * size,
            )
        };
    }
    coop.sync_warp();
    // Lane `l` releases the call into flag `[part][w][me]` of peer `me + 1 + l`.
    let mut l = lane;
    while l + 1 < n {
        let p = (me + 1 + l) % n;
        let flag = scratch.lsa_ptr::<u32>(ctx.warp_flag_offset(part.index, w, me), p);
        // SAFETY: `with_warp_flags`' contract: an aligned `u32` of peer
        // `p`'s scratch written only by this rank, read atomically; the
        // warp's pushes precede it (`sync_warp`, release cumulativity).
        unsafe { atomic::store_release(flag, call, Scope::Sys) };
        l += lanes;
    }
    ctx.stamp(coop, part, CollStage::Sent);
    // Lane `l` waits for source `me + 1 + l`'s flag of this warp.
    let mut deadline = Deadline::new(&ctx.comm().abort);
    let mut result = Ok(());
    let mut l = lane;
    while l + 1 < n && result.is_ok() {
        let from = (me + 1 + l) % n;
        let flag = scratch.local_ptr::<u32>(ctx.warp_flag_offset(part.index, w, from));
        // SAFETY: as above, this rank's own flag from `from`.
        result = unsafe { wait::wait_ge_u32(flag, call, Scope::Sys, &mut deadline) }.map(|_| ());
        l += lanes;
    }
    coop.sync_warp();
    ctx.stamp(coop, part, CollStage::Synced);
    if result.is_ok() {
        let from = |p: u32| {
            if p == me {
                src.wrapping_add(b)
            } else {
                scratch.local_ptr::<u8>(ctx.warp_flag_slot_offset(call, part.index, p)) as *const T
            }
        };
        // SAFETY: every peer's warp `w` stored this piece into its slot
        // before releasing the flag acquired above (and `sync_warp` passed
        // it to the warp); the input is local; `dst` holds the range.
        unsafe { reduce_into(lane as usize, lanes as usize, n, &from, 1, &|_| dst, wb, we, red) };
    }
    let result = coop.agree(result.map_err(CollError::from));
    // SAFETY: as for the load; every thread stores the same count.
    unsafe { atomic::store_relaxed(count_ptr, call, Scope::Gpu) };
    result
}
