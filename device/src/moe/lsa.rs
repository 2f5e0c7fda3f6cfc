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
//! The library's kernel for such a group takes the streamed receive below.
//!
//!
//! **The streamed receive** ([`dispatch_recv_token`], the library's
//! single-node kernel) packs each token as soon as its own slot is in,
//! with no wait for every source's tokens and no scan of the headers: each
//! source tells every expert's rank up front how many of its tokens the
//! expert gets ([`dispatch_send_count`], a word per (local expert,
//! source)) and, in each token's header, the token's position among its
//! tokens for each expert ([`dispatch_send_token_streamed`]). The row of
//! source `s`'s token in local expert `l`'s packed output is then its
//! position plus the counts of the sources before `s` for `l`, known
//! before the token arrives. Any warp can take any token (or a piece of
//! one), so the copies spread evenly over the grid however unevenly the
//! experts are loaded, and overlap the sends still under way (on one H200
//! a plain-CUDA floor of the two structures, `benches/gpu/moe_floor.cu`
//! `pe` and `stream`: 14.3 against 9.5 µs a dispatch). The output, rows
//! and counts are the per-expert pack's, row for row.
//!
//! Each checks its precondition once and returns
//! [`MoeError::BadArgument`] (on every thread of the coop) when the
//! context does not meet it.

use super::{
    count_of, gin_ranks, is_one_of, local_ptr, pack_expert, peer_ptr, send_token, tokens_naming, word, MoeContext,
    MoeError, PackPart, COPY_UNROLL,
};
use crate::arch::{self, lane_id, WARP_SIZE};
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::lsa::ops::CopyAhead;
use crate::wait::{self, Deadline};

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
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the contract; the dispatch is not fp8 (checked above).
    unsafe { send_token::<C, false, false>(coop, ctx, t, x, topk_idx, topk_weights, num_tokens, seq) }
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

/// [`dispatch_send_token`] for the streamed receive: also writes, for each
/// top-k entry of token `t`, the token's position among this rank's tokens
/// for the entry's expert (how many tokens before `t` name it) into the
/// header on the expert's rank, before the word. Warp `j % W` of the
/// coop's `W` warps scans the routing for entry `j`. `BadArgument` for an
/// fp8 dispatch.
///
/// # Safety
/// As for [`super::dispatch_send_token`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn dispatch_send_token_streamed<C: Coop>(
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
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the contract; the dispatch is not fp8 (checked above).
    unsafe { send_token::<C, false, true>(coop, ctx, t, x, topk_idx, topk_weights, num_tokens, seq) }
}

/// Tells global expert `expert`'s rank how many of this rank's
/// `num_tokens` tokens name it (each token once): a relaxed system-scope
/// store of `(seq << 32) | count` into that rank's count word `(expert %
/// L, this rank)`, the word [`dispatch_recv_token`] and
/// [`dispatch_recv_count`] wait for. Every expert must be counted by
/// exactly one coop in each dispatch, best before the tokens are sent (a
/// receiver's rows of a later source wait for it). The coop is whole
/// warps (each scans alike). Returns the count. `BadArgument` when the
/// expert's rank is outside the LSA team.
///
/// # Safety
/// `ctx` live; `topk_idx` holds `num_tokens * top_k` entries; every thread
/// of the coop calls with the same arguments; the previous dispatch's
/// combine is done on every rank.
#[inline(always)]
pub unsafe fn dispatch_send_count<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    expert: u32,
    topk_idx: *const i32,
    num_tokens: u32,
    seq: u32,
) -> Result<u32, MoeError> {
    let (l, me) = (ctx.local_experts(), ctx.comm().rank());
    if num_tokens > ctx.max_tokens() || expert >= ctx.num_experts() || l == 0 || coop.size() % WARP_SIZE != 0 {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let p = peer_ptr(ctx, expert / l, ctx.recv_count_offset(expert % l, me)) as *mut u64;
    if p.is_null() {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: `topk_idx` holds `num_tokens * top_k` entries (the contract).
    let c = unsafe { tokens_naming(topk_idx, ctx.top_k() as usize, num_tokens, expert) };
    if coop.is_leader() {
        // SAFETY: the expert's rank's count word for this source, written
        // only atomically (by this coop alone in this dispatch).
        unsafe { atomic::store_relaxed(p, word(seq, c), Scope::Sys) };
    }
    Ok(c)
}

/// Waits for source `src`'s count word `(local, src)` of dispatch `seq`
/// ([`dispatch_send_count`]) and returns the count.
///
/// # Safety
/// `ctx` live, `local < L`, `src < N`.
#[inline(always)]
unsafe fn wait_count(
    ctx: &MoeContext,
    local: u32,
    src: u32,
    seq: u32,
    deadline: &mut Deadline,
) -> Result<u32, MoeError> {
    let p = local_ptr(ctx, ctx.recv_count_offset(local, src)) as *const u64;
    // SAFETY: this rank's count word, written only atomically (the
    // contract); relaxed: the word is its own data.
    let w = unsafe { wait::wait_ge_u64_relaxed(p, word(seq, 0), Scope::Sys, deadline) }?;
    count_of(ctx, w, seq)
}

/// The streamed receive of LSA source `src`'s token slot `t` (see the
/// [module docs](self)): waits for that slot's word alone; when it holds a
/// token, gives each of its entries naming a local expert `l` its row
/// `l * N * M + (the counts of sources 0..src for l) + (its position)`
/// (waiting for those count words), records the rows in the header (part
/// 0; the combine reads them), and copies piece `part.index` of
/// `part.count` of the token's bytes (16-byte multiples) from the slot
/// once to each such row of `out` (an expert named twice gets one row).
/// The parts of one slot may run on any coops, in any order. The coop is
/// whole warps. `BadArgument` for an fp8 dispatch, a group with ranks
/// outside the LSA team, more than 32 header entries, or a part outside
/// its count; `OutOfStep` for a word or count of another dispatch.
///
/// # Safety
/// `ctx` live; `out` holds `L * N * M` rows of `token_bytes`; every
/// source sends with [`dispatch_send_token_streamed`] and counts with
/// [`dispatch_send_count`] in this dispatch; every thread of the coop calls
/// with the same arguments; no other coop takes the same (`src`, `t`,
/// part) in this dispatch; the rows are read by other coops only after a
/// grid barrier or the kernel's end.
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_recv_token<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    t: u32,
    part: PackPart,
    out: *mut u8,
    seq: u32,
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, me, l, m) = (comm.nranks(), comm.rank(), ctx.local_experts(), ctx.max_tokens());
    let ids = ctx.ll_header_ids() as usize;
    if src >= n
        || t >= m
        || part.index >= part.count
        || coop.size() % WARP_SIZE != 0
        || ctx.fp8_dispatch()
        || gin_ranks(ctx) > 0
        || ids > WARP_SIZE as usize
    {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let mut deadline = Deadline::new(&comm.abort());
    // Every thread acquires the slot's word itself (a warp's lanes in one
    // load): no barrier after it, and its value says whether a token came.
    let p = local_ptr(ctx, ctx.ll_meta_offset(src, t)) as *const u64;
    // SAFETY: this rank's header word `(src, t)`, written only atomically.
    let w = unsafe { wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline) }
        .map_err(MoeError::from)
        .and_then(|w| if (w >> 32) as u32 == seq { Ok(w) } else { Err(MoeError::OutOfStep) });
    let w = coop.agree(w)?;
    if w & 1 == 0 {
        return Ok(());
    }
    // The piece's bytes and the header's ids and positions, loaded at
    // once (the slot and header of dispatch `seq`: the word acquired).
    let bytes = ctx.token_bytes() as usize;
    // A 32-bit division when the token fits (a 64-bit one is a call).
    let piece = match u32::try_from(bytes) {
        Ok(b) => b.div_ceil(part.count) as usize,
        Err(_) => bytes.div_ceil(part.count as usize),
    }
    .next_multiple_of(16);
    let off = (part.index as usize * piece).min(bytes);
    let len = piece.min(bytes - off);
    let slot = local_ptr(ctx, ctx.ll_token_slot_offset(src, t)) as *const u8;
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    // SAFETY: bytes `off..off + len <= token_bytes` of the slot.
    let ahead = unsafe { CopyAhead::<COPY_UNROLL>::load(tr, nt, slot.add(off), len) };
    // Lane `j < I`: entry `j`'s row (`u32::MAX`: none, or an earlier entry
    // names the same expert).
    let lane = lane_id() as usize;
    let hdr = local_ptr(ctx, ctx.ll_ids_offset(src, t)) as *mut u32;
    // SAFETY: id and position `lane < I` of the header, written before the word.
    let (e, pos) = if lane < ids { unsafe { (*hdr.add(lane) as i32, *hdr.add(3 * ids + lane)) } } else { (-1, 0) };
    // Whether no lower lane holds the same id (lanes past `I` hold -1, no
    // expert): one `match.any` where a shuffle per entry had taken ~90
    // instructions each warp ran once (session 38).
    let same = arch::match_any(u32::MAX, e as u32 as u64);
    let first = same & ((1u32 << lane) - 1) == 0;
    let mut row = u32::MAX;
    let mut r = Ok(());
    if lane < ids && is_one_of(e, me * l, l) {
        let local = e as u32 - me * l;
        let mut prefix = 0u32;
        for s in 0..src {
            // SAFETY: `local < L`, `s < N`.
            match unsafe { wait_count(ctx, local, s, seq, &mut deadline) } {
                Ok(c) => prefix += c,
                Err(err) => r = Err(err),
            }
        }
        if pos >= m {
            r = Err(MoeError::OutOfStep);
        }
        // Below `(local + 1) * N * M`: `src` counts of at most `M`, a
        // position below `M`.
        let at = local * n * m + prefix + pos;
        if r.is_ok() {
            if part.index == 0 {
                // SAFETY: row `lane < I` of the header: this rank's, entry
                // `lane` written by this slot's part 0 alone.
                unsafe { *hdr.add(2 * ids + lane) = at };
            }
            if first {
                row = at;
            }
        }
    }
    coop.agree(r)?;
    let dst = |j: usize| -> Option<*mut u8> {
        let r = arch::shfl(u32::MAX, row as u64, j as u32) as u32;
        (r != u32::MAX).then(|| out.wrapping_add(r as usize * bytes + off))
    };
    // Every destination `out + row * bytes + off` is 16-byte aligned when
    // `out` and `bytes` are (`off` is a multiple of 16).
    let aligned = (out as usize | bytes) % 16 == 0;
    // SAFETY: each destination is bytes `off..off + len` of a row below `L
    // * N * M` of `out`, this token's alone (one per local expert it
    // names, its position among its source's tokens for it); vector `i` of
    // each this thread's; all 16-byte aligned when `aligned` (above).
    unsafe { ahead.store_to(ids, dst, aligned) };
    Ok(())
}

/// Waits for every source's count word for local expert `local`
/// ([`dispatch_send_count`]) and stores their sum, the expert's row count
/// after a streamed receive, in `out_count[local]` (the leader). Returns
/// the sum (on every thread). The words need no acquire: each is its own
/// data. A warp is the natural coop (the library's kernel gives each
/// CTA's first warp its experts, before the tokens).
///
/// # Safety
/// `ctx` live; `out_count` holds `L` `u32`s; every thread of the coop
/// calls with the same arguments; no other coop takes `local` in this
/// dispatch.
pub unsafe fn dispatch_recv_count<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    out_count: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    if local >= ctx.local_experts() || gin_ranks(ctx) > 0 {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // Every thread reads the words itself (a warp's lanes in one load
    // each), so the sum needs no exchange (a CTA's `sync_max` of a value
    // is 33 barriers).
    let mut total = 0u32;
    let mut r = Ok(());
    let mut deadline = Deadline::new(&ctx.comm().abort());
    for s in 0..ctx.comm().nranks() {
        // SAFETY: `local < L`, `s < N`.
        match unsafe { wait_count(ctx, local, s, seq, &mut deadline) } {
            Ok(c) => total += c,
            Err(e) => r = Err(e),
        }
    }
    let r = coop.agree(r.map(|_| total));
    if r.is_ok() && coop.is_leader() {
        // SAFETY: `local < L` (checked above).
        unsafe { *out_count.add(local as usize) = total };
    }
    r
}
