//! The low-latency dispatch's steps for a group whose dispatch is not
//! quantized and, for the receive, whose ranks are all in this rank's LSA
//! team (NVLink only, the single-node case): the same work as
//! [`super::dispatch_send_token`] and [`super::dispatch_pack_expert`],
//! compiled without the fp8 quantisation and the GIN sources' waits and
//! copies. Both steps run straight through once per token and per expert,
//! so their code is fetched as it runs: on one H200 instruction fetch was
//! the largest stall of the general dispatch (30 % of its warps' samples,
//! `benches/results/2026-11-29-h200-moe-ll-combine-by-token.md` §4), and
//! every path compiled in spreads the one that runs over more cache lines.
//! The library's kernel takes these when the group allows them.
//!
//! Each checks its precondition once and returns
//! [`MoeError::BadArgument`] (on every thread of the coop) when the
//! context does not meet it.

use super::{gin_ranks, pack_expert, send_token, MoeContext, MoeError, PackPart};
use crate::coop::Coop;

/// [`super::dispatch_send_token`] for a context whose dispatch is not fp8
/// (`BadArgument` otherwise). Tokens for ranks outside the LSA team still
/// go by [`super::dispatch_send_expert`], as with the general step.
///
/// # Safety
/// As for [`super::dispatch_send_token`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn dispatch_send_token<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    t: u32,
    x: *const u8,
    topk_idx: *const i32,
    topk_weights: *const f32,
    num_tokens: u32,
    seq: u32,
) -> Result<(), MoeError> {
    if ctx.fp8_dispatch() {
        return Err(MoeError::BadArgument);
    }
    // SAFETY: the contract; the dispatch is not fp8 (checked above).
    unsafe { send_token::<C, false>(coop, ctx, t, x, topk_idx, topk_weights, num_tokens, seq) }
}

/// [`super::dispatch_pack_expert`] for a context whose ranks are all in
/// this rank's LSA team and whose dispatch is not fp8 (`BadArgument`
/// otherwise): packs local expert `local`'s rows into `out` and stores
/// their count in `out_count[local]`. There are no scales to write.
///
/// # Safety
/// As for [`super::dispatch_pack_expert`] (without `scales`).
#[inline(always)]
pub unsafe fn dispatch_pack_expert<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    out: *mut u8,
    out_count: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    // SAFETY: the contract.
    unsafe { dispatch_pack_expert_part(coop, ctx, local, PackPart::WHOLE, out, out_count, seq) }
}

/// [`super::dispatch_pack_expert_part`] for such a context (`BadArgument`
/// otherwise): this coop's share `part` of local expert `local`'s rows.
///
/// # Safety
/// As for [`super::dispatch_pack_expert_part`] (without `scales`).
#[inline(always)]
pub unsafe fn dispatch_pack_expert_part<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    part: PackPart,
    out: *mut u8,
    out_count: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    if ctx.fp8_dispatch() || gin_ranks(ctx) > 0 {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the contract; every rank is in the LSA team and the dispatch
    // is not fp8 (checked above), so no scales are written.
    unsafe { pack_expert::<C, false, false>(coop, ctx, local, part, out, core::ptr::null_mut(), out_count, seq, true) }
}
