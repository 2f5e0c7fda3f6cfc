//! MoE dispatch and combine in high-throughput mode (DeepEP's "normal"
//! kernels' idea), callable from a kernel, on a context made with
//! [`MoeContext::new_high_throughput`].
//!
//! **Layout.** A token goes to a rank once, however many of that rank's
//! experts its top-k names (deduplicated per destination rank). Each
//! destination's tokens are split over `G` channels ([`channel_tokens`]:
//! channel `c` takes a contiguous range of the source's tokens); the
//! channel's coop counts the tokens before its range that go to the
//! destination (its first position) and gives each of its own the next
//! position, written to the handle's `rank_pos[token][rank]`
//! ([`dispatch_send_channel`]).
//!
//! **Dispatch.** The channel streams its tokens with their routing rows
//! (`K` expert ids, `K` weights) into the destination's receive slots
//! `(source, position)`: stores through the LSA mapping to LSA peers, or
//! staged in this rank's window and put by GIN in pieces of at most
//! [`PUT_BYTES`] while the next tokens are staged. Then one word per
//! channel, `(seq << 32) | tokens` (the layout exchange, done by the
//! GPUs): a release store over LSA, a put with a signal over GIN. The
//! receiver waits for every source's words ([`dispatch_wait`]) and packs
//! per local expert ([`dispatch_pack`]: a token lands once in each local
//! expert its top-k names, in (source rank, source token) order, the same
//! `[L][N·M][hidden]` layout and counts as the low-latency mode), recording
//! each received top-k entry's packed row (`recv_rows`).
//! [`dispatch_recv_expert`] does both for one local expert (the
//! per-expert receive hook).
//!
//! **Per-source layout** ([`MoeContext::HT_PER_SOURCE`], DeepEP's
//! output): no pack. [`dispatch_recv_channel`] waits for one (source,
//! channel) and copies its tokens to rows `(source, position)` of the
//! output with their top-k entries as local expert indices, so the
//! receive of a channel overlaps the sends of the others; combine takes
//! one row per received token (this rank's experts already summed by the
//! caller) and sends it back as it is ([`combine_send_rows`]). With `out`
//! the receive slots themselves ([`window_rows`]) nothing is copied: the
//! output is the window (valid until the next dispatch). The in-window
//! combine then reads the LSA ranks' rows there: each rank announces its
//! rows ([`combine_rows_ready`]) and [`combine_reduce_channel`] with
//! `PULL` loads them over NVLink (GIN ranks still push theirs).
//!
//! **Combine.** For each received token the rank sums its local experts'
//! gate-weighted outputs in f32 (top-k order, rounded once to the element
//! type) and sends that one partial back per (token, rank) into the
//! source's send slot `(rank, position)`, with one word per channel
//! ([`combine_send_channel`]); the source waits for every rank's words
//! ([`combine_wait`]) and adds the partials in f32 in rank order, writing
//! each token in its original order ([`combine_reduce`]).
//!
//! Signals (GIN): [`DISPATCH_SIGNAL`] counts dispatch words,
//! [`COMBINE_SIGNAL`] combine words, from ranks outside the LSA team.
//! Ordering between calls and `seq` as in the [low-latency mode](super).

use super::{
    gin_ranks, is_lsa, is_one_of, local_ptr, peer_ptr, routing_hits, warp_scan, weighted_rows, word, MoeContext,
    MoeError, COPY_UNROLL, NO_POS, SCAN_GROUPS,
};
use crate::arch::{self, lane_id, load16, store16, WARP_SIZE};
use crate::atomic::{self, Scope};
use crate::coll::Element;
use crate::coop::{Coop, ThreadCoop};
use crate::gin::{Gin, LocalAction, RemoteAction};
use crate::lsa::ops::{copy_rows_strided_by, copy_strided, copy_strided_by};
use crate::wait::{self, Deadline};

/// The GIN signal dispatch words increment.
pub const DISPATCH_SIGNAL: u32 = 0;
/// The GIN signal combine words increment.
pub const COMBINE_SIGNAL: u32 = 1;
/// GIN sends go out in pieces of about this many bytes (at least one
/// warp's 32 tokens), so the proxy moves one piece while the coop stages
/// the next.
pub const PUT_BYTES: u64 = 256 * 1024;

/// Tokens `first..end` of channel `channel` of `channels` over `num_tokens` tokens.
#[inline(always)]
pub const fn channel_tokens(num_tokens: u32, channels: u32, channel: u32) -> (u32, u32) {
    let g = if channels == 0 { 1 } else { channels } as u64;
    let n = num_tokens as u64;
    ((n * channel as u64 / g) as u32, (n * (channel as u64 + 1) / g) as u32)
}

/// This rank's receive slots as a per-source output (`[ranks * max_tokens]`
/// rows of `token_bytes`, `(source, position)`), for
/// [`dispatch_send_channel`]'s `own_out` and [`dispatch_recv_channel`]'s
/// `out`: the tokens are then left where they land, no copy out (the
/// output is valid until the next dispatch's tokens arrive). Null unless
/// `ctx` is a per-source high-throughput context whose slots are the
/// tokens' size (`token_bytes` a multiple of 16).
pub fn window_rows(ctx: &MoeContext) -> *mut u8 {
    if !ctx.high_throughput() || !ctx.ht_per_source() || ctx.slot_bytes() != ctx.token_bytes() {
        return core::ptr::null_mut();
    }
    local_ptr(ctx, ctx.ht_recv_slot_offset(0, 0))
}

/// The channel words of source (or rank) `s` below channel `upto`, at
/// `off(s, c)` of this rank's window, checked against `seq` and the
/// maximum: returns (tokens of the channels before `channel`, tokens of
/// `channel`, tokens of all `c < upto`), and every thread of `coop` may
/// then read what those words cover. Every thread of `coop` calls it with
/// the same arguments, once the words are in. A thread reads its words
/// with relaxed loads (no branch on the values: the loads overlap) and
/// then acquires them all with one system-scope fence: a chain of acquire
/// loads costs a round trip each (one thread walking 256 channels that
/// way, a branch after each, was ~100 µs of a 4096-token dispatch on
/// 2 × H200). Above 32 words each lane of a whole-warp coop reads every
/// 32nd word, a warp sums them by shuffles and the coop syncs, which
/// orders every thread's reads after the lanes' fences; up to 32 words
/// (and in coops of partial warps) every thread reads them all itself.
fn channel_sums<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    s: u32,
    seq: u32,
    channel: u32,
    upto: u32,
    off: impl Fn(u32, u32) -> u64,
) -> Result<(u32, u32, u32), MoeError> {
    let m = ctx.max_tokens() as u64;
    // Up to a warp's worth of words every thread reads them all itself
    // (no shuffles, no sync; the emulator runs each of those as a meeting
    // of 32 threads).
    let whole = coop.size() % WARP_SIZE == 0 && upto > WARP_SIZE;
    let (mut c, step) = if whole { (lane_id(), WARP_SIZE) } else { (0, 1) };
    let (mut before, mut own, mut total, mut bad) = (0u64, 0u64, 0u64, 0u64);
    while c < upto {
        // SAFETY: a word of this rank's window, written only atomically
        // (the release that stored it is acquired by the fence below).
        let w = unsafe { atomic::load_relaxed(local_ptr(ctx, off(s, c)) as *const u64, Scope::Sys) };
        let n = w & u32::MAX as u64;
        bad |= ((w >> 32) as u32 != seq || n > m) as u64;
        before += if c < channel { n } else { 0 };
        own += if c == channel { n } else { 0 };
        total += n;
        c += step;
    }
    // The acquire of every word this thread read: what their releases
    // covered is visible to this thread's reads after it.
    atomic::fence_acq_rel(Scope::Sys);
    if whole {
        // A butterfly over the warp: every lane ends with the sums.
        let mut d = 1;
        while d < WARP_SIZE {
            let from = lane_id() ^ d;
            before += arch::shfl(u32::MAX, before, from);
            own += arch::shfl(u32::MAX, own, from);
            total += arch::shfl(u32::MAX, total, from);
            bad |= arch::shfl(u32::MAX, bad, from);
            d *= 2;
        }
        coop.sync();
    }
    if bad != 0 || total > m || before + own > m {
        return Err(MoeError::OutOfStep);
    }
    Ok((before as u32, own as u32, total as u32))
}

/// A warp's scan of `count` routing rows (`k` expert ids each, rows
/// `stride` `i32`s apart from `idx`) for the tokens naming one of experts
/// `lo..lo + l`, a group of 32 rows at a time in order: [`RowHits::group`]
/// loads the ids of [`SCAN_GROUPS`] groups at once (one round trip for
/// them, where a group at a time cost one each: the high-throughput
/// send's and pack's scans).
struct RowHits {
    idx: *const i32,
    stride: usize,
    k: usize,
    count: u32,
    lo: u32,
    l: u32,
    bits: u32,
}

impl RowHits {
    /// # Safety
    /// `idx` holds `count` rows of `stride >= k` `i32`s, not written
    /// while the scan reads them.
    #[inline(always)]
    unsafe fn new(idx: *const i32, stride: usize, k: usize, count: u32, lo: u32, l: u32) -> Self {
        RowHits { idx, stride, k, count, lo, l, bits: 0 }
    }

    /// Whether the calling lane's row of group `g` (row `g * 32 + lane`)
    /// names one of the experts (false past `count`); every lane of the
    /// warp calls it, for `g = 0, 1, 2, ...` in order.
    #[inline(always)]
    fn group(&mut self, g: u32) -> bool {
        if g % SCAN_GROUPS == 0 {
            // SAFETY: the rows `new`'s contract names.
            self.bits = unsafe { routing_hits(self.idx, self.stride, self.k, self.count, self.lo, self.l, g) };
        }
        (self.bits >> (g % SCAN_GROUPS)) & 1 != 0
    }

    /// How many of the rows name one of the experts (every lane alike).
    #[inline(always)]
    fn count(mut self) -> u32 {
        let mut c = 0;
        let mut g = 0;
        while g * WARP_SIZE < self.count {
            c += arch::ballot(u32::MAX, self.group(g)).count_ones();
            g += 1;
        }
        c
    }
}

/// The GIN handle of a coop that sends to `peer` (None: an LSA peer).
fn gin_for<'a, C: Coop>(coop: &C, ctx: &'a MoeContext, peer: u32) -> Result<Option<Gin<'a>>, MoeError> {
    if is_lsa(ctx, peer) {
        return Ok(None);
    }
    let g = coop.agree(Gin::new(ctx.comm(), 0))?;
    Ok(Some(g.with_given_release(Scope::Sys)))
}

/// Puts `bytes` at `src_off` of this rank's window to `dst_off` of
/// `peer`'s (every thread of the coop, after its stores to the source).
///
/// # Safety
/// `ctx` live, both ranges inside the window.
unsafe fn put_range<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    gin: &Gin,
    peer: u32,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> Result<(), MoeError> {
    if bytes == 0 {
        return Ok(());
    }
    coop.sync();
    if coop.is_leader() {
        atomic::fence_acq_rel(Scope::Sys);
    }
    let win = ctx.window();
    // SAFETY: the group's window is in the GIN window table (the context's
    // contract); both ranges inside it (the caller's).
    unsafe {
        gin.put(
            coop,
            &ctx.comm().world(),
            peer,
            &win,
            dst_off,
            &win,
            src_off,
            bytes,
            RemoteAction::None,
            LocalAction::None,
        )
    }?;
    Ok(())
}

/// Publishes word `w` at `off` of `peer`'s window after the coop's
/// stores (LSA: a release store by the leader after a barrier) or puts
/// (GIN: a put with a strong increment of `signal`).
///
/// # Safety
/// `ctx` live; `off` a word of the window written only this way.
unsafe fn publish<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    gin: Option<&Gin>,
    peer: u32,
    off: u64,
    w: u64,
    signal: u32,
) -> Result<(), MoeError> {
    coop.sync();
    let Some(gin) = gin else {
        if coop.is_leader() {
            // SAFETY: the contract: an LSA peer's word, written only atomically.
            unsafe { atomic::store_release(peer_ptr(ctx, peer, off) as *mut u64, w, Scope::Sys) };
        }
        return Ok(());
    };
    let r = if coop.is_leader() {
        let action = RemoteAction::SignalInc { signal, strong: true };
        // SAFETY: the window is in the GIN window table; `off` inside it.
        unsafe { gin.put_value(&ctx.comm().world(), peer, &ctx.window(), off, w, action, LocalAction::None) }
    } else {
        Ok(())
    };
    coop.agree(r)?;
    Ok(())
}

/// Sends channel `channel` of this rank's tokens to rank `dest` (every
/// thread of `coop`, whole warps, calls it): scans `topk_idx` (each warp
/// alike), gives each token of the channel's range whose top-k names an
/// expert of `dest` its position among the tokens sent to `dest`
/// (`rank_pos[t * nranks + dest]`, [`NO_POS`] for the others of the
/// range), stores or puts the tokens and their routing rows into `dest`'s
/// receive slots, then publishes the channel's word (to an LSA `dest`,
/// after its first position: [`MoeContext::ht_dispatch_pos_offset`]).
/// Returns the tokens sent.
///
/// `own_out`: null, or (the per-source layout) the output
/// [`dispatch_recv_channel`] fills: the tokens this rank sends itself go
/// straight to its rows `me * M + p` there (their routing rows still to
/// the window), and that receive copies only the others'.
///
/// # Safety
/// `ctx` a live high-throughput context; `x` holds `num_tokens` tokens,
/// `topk_idx`/`topk_weights` `num_tokens * top_k` entries, `rank_pos`
/// `num_tokens * nranks`; `own_out` null or `nranks * max_tokens` rows
/// of `token_bytes` (on a per-source context); every thread of the coop
/// calls with the same arguments; no other coop sends (`dest`,
/// `channel`) in this dispatch; every (`dest`, `channel`) is sent once on
/// every rank; the previous dispatch's combine is done on every rank.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn dispatch_send_channel<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    dest: u32,
    channel: u32,
    x: *const u8,
    topk_idx: *const i32,
    topk_weights: *const f32,
    num_tokens: u32,
    rank_pos: *mut u32,
    own_out: *mut u8,
    seq: u32,
) -> Result<u32, MoeError> {
    let comm = ctx.comm();
    let (n, me, l) = (comm.nranks(), comm.rank(), ctx.local_experts());
    if !ctx.high_throughput() || num_tokens > ctx.max_tokens() || dest >= n || channel >= ctx.channels() {
        return Err(MoeError::BadArgument);
    }
    let k = ctx.top_k() as usize;
    let (lo, row, mb) = (dest * l, ctx.token_bytes() as usize, ctx.ht_meta_bytes() as usize);
    let (first, end) = channel_tokens(num_tokens, ctx.channels(), channel);
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let wi = coop.thread_rank() / WARP_SIZE;
    // SAFETY: rows `0..first` and `first..end` of `topk_idx` (`end <=
    // num_tokens`), the caller's routing.
    let (start, mut goes) = unsafe {
        (
            RowHits::new(topk_idx, k, k, first, lo, l).count(),
            RowHits::new(topk_idx.add(first as usize * k), k, k, end - first, lo, l),
        )
    };
    let gin = gin_for(coop, ctx, dest)?;
    if gin.is_none() && coop.is_leader() {
        let at = peer_ptr(ctx, dest, ctx.ht_dispatch_pos_offset(me, channel)) as *mut u64;
        // SAFETY: this channel's position word at `dest`, written only by
        // this coop's leader, atomically; its release of the channel's word
        // (`publish`) comes after, so a receiver that acquires the word
        // reads this position (`wait_dispatch_channel`).
        unsafe { atomic::store_relaxed(at, word(seq, start), Scope::Sys) };
    }
    // Where position `p`'s token and routing row go: the own output (the
    // per-source layout's own tokens), the LSA peer's receive slots, or
    // the GIN staging area. Positions are consecutive in each.
    let to_own = dest == me && !own_out.is_null();
    let slot = |p: u32| {
        if to_own {
            own_out.wrapping_add((me as usize * ctx.max_tokens() as usize + p as usize) * row)
        } else if gin.is_none() {
            peer_ptr(ctx, dest, ctx.ht_recv_slot_offset(me, p))
        } else {
            local_ptr(ctx, ctx.ht_send_slot_offset(dest, p))
        }
    };
    let meta_row = |p: u32| {
        if to_own {
            local_ptr(ctx, ctx.ht_meta_offset(me, p))
        } else if gin.is_none() {
            peer_ptr(ctx, dest, ctx.ht_meta_offset(me, p))
        } else {
            local_ptr(ctx, ctx.ht_send_meta_offset(dest, p))
        }
    };
    // A group's routing rows go as one block of whole vectors (ids, then
    // weights, 16 bytes each) when both halves are: rows one at a time by
    // two threads each cost the 2 x H200 in-window dispatch ~7 us.
    let meta_vectors = k % 4 == 0 && (topk_idx as usize | topk_weights as usize) % 16 == 0;
    let mut base = start;
    let mut pending = start;
    let mut c0 = first;
    while c0 < end {
        let t = c0 + lane_id();
        let h = goes.group((c0 - first) / WARP_SIZE) as u32;
        let incl = warp_scan(h);
        let p = base + incl - h;
        if wi == 0 && t < end {
            // SAFETY: `t < num_tokens`, `dest < nranks`: inside `rank_pos`;
            // entry (t, dest) is this coop's alone.
            unsafe { *rank_pos.add(t as usize * n as usize + dest as usize) = if h != 0 { p } else { NO_POS } };
        }
        if meta_vectors {
            let hits = arch::ballot(u32::MAX, h != 0);
            let half = k / 4;
            let mut v = tr;
            while v < hits.count_ones() as usize * 2 * half {
                let (r, part) = (v / (2 * half), v % (2 * half));
                let tj = (c0 + nth_set_bit(hits, r as u32)) as usize;
                let from = if part < half {
                    topk_idx.wrapping_add(tj * k + 4 * part) as *const u8
                } else {
                    topk_weights.wrapping_add(tj * k + 4 * (part - half)) as *const u8
                };
                // SAFETY: token `tj < num_tokens`'s routing rows (16-byte
                // aligned: `meta_vectors`); routing row `base + r` (`8 * k`
                // bytes, position `< num_tokens <= max_tokens`) is this
                // coop's alone in this dispatch; vector `v` this thread's.
                unsafe { store16(meta_row(base + r as u32).add(16 * part), load16(from)) };
                v += nt;
            }
        }
        let mut src_lane = 0;
        while src_lane < WARP_SIZE {
            let hj = arch::shfl(u32::MAX, h as u64, src_lane) as u32;
            let pj = arch::shfl(u32::MAX, p as u64, src_lane) as u32;
            if hj != 0 {
                let tj = (c0 + src_lane) as usize;
                // SAFETY: token `tj < num_tokens` of `x` and its routing
                // rows; the slot (`slot_bytes >= row`, or `own_out`'s row:
                // the caller's contract) and the routing row (`8 * k` bytes)
                // at position `pj < num_tokens <= max_tokens` are this
                // coop's alone in this dispatch.
                unsafe {
                    copy_strided_by::<BLOCK_UNROLL>(tr, nt, slot(pj), x.add(tj * row), row);
                    if !meta_vectors {
                        let meta = meta_row(pj);
                        copy_strided(tr, nt, meta, topk_idx.add(tj * k) as *const u8, 4 * k);
                        copy_strided(tr, nt, meta.add(4 * k), topk_weights.add(tj * k) as *const u8, 4 * k);
                    }
                }
            }
            src_lane += 1;
        }
        base += arch::shfl(u32::MAX, incl as u64, WARP_SIZE - 1) as u32;
        c0 += WARP_SIZE;
        if let Some(gin) = &gin {
            let ready = base - pending;
            if ready > 0 && (c0 >= end || ready as u64 * ctx.slot_bytes() >= PUT_BYTES) {
                // SAFETY: positions `pending..base` of both areas, staged above.
                unsafe {
                    let bytes = ready as u64 * ctx.slot_bytes();
                    let (d, s) = (ctx.ht_recv_slot_offset(me, pending), ctx.ht_send_slot_offset(dest, pending));
                    put_range(coop, ctx, gin, dest, d, s, bytes)?;
                    let (d, s) = (ctx.ht_meta_offset(me, pending), ctx.ht_send_meta_offset(dest, pending));
                    put_range(coop, ctx, gin, dest, d, s, ready as u64 * mb as u64)?;
                }
                pending = base;
            }
        }
    }
    let sent = base - start;
    let off = ctx.ht_dispatch_word_offset(me, channel);
    // SAFETY: the channel's word, written only by this coop (LSA or GIN).
    unsafe { publish(coop, ctx, gin.as_ref(), dest, off, word(seq, sent), DISPATCH_SIGNAL) }?;
    Ok(sent)
}

/// Waits until every word `off(rank, channel)` of this rank's window
/// carries `seq` (LSA ranks) and signal `signal` counts every GIN rank's
/// channels, then checks every word.
///
/// # Safety
/// `ctx` a live high-throughput context; every thread of `coop` calls it.
unsafe fn wait_words<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    seq: u32,
    signal: u32,
    off: impl Fn(u32, u32) -> u64 + Copy,
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, g) = (comm.nranks(), ctx.channels());
    if !ctx.high_throughput() || g == 0 {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let (t, nt) = (coop.thread_rank(), coop.size());
    let r = (|| -> Result<(), MoeError> {
        let mut deadline = Deadline::new(&comm.abort());
        let mut i = t;
        while i < n * g {
            let s = i / g;
            if is_lsa(ctx, s) {
                let p = local_ptr(ctx, off(s, i % g)) as *const u64;
                // SAFETY: this rank's word, written only atomically.
                unsafe { wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline) }?;
            }
            i += nt;
        }
        let gr = gin_ranks(ctx);
        if gr > 0 && coop.is_leader() {
            Gin::new(comm, 0)?.wait_signal(&ThreadCoop, signal, seq as u64 * gr as u64 * g as u64)?;
        }
        Ok(())
    })();
    coop.agree(r)?;
    let mut r = Ok(());
    for s in 0..n {
        if let Err(e) = channel_sums(coop, ctx, s, seq, 0, ctx.channels(), off) {
            r = Err(e);
        }
    }
    coop.agree(r)
}

/// Waits until source `src`'s channel `channel` of dispatch `seq` is in,
/// then returns (the channel's first position, its tokens). From an LSA
/// source every thread acquires the channel's word and reads the position
/// word its sender stored before it ([`MoeContext::ht_dispatch_pos_offset`]):
/// one round trip, where waiting for channels `0..=channel` and summing
/// them was a chain of system-scope acquires after the last send. Both
/// words are written once per dispatch and not again before this rank's
/// combine, so every thread reads the same values. From a GIN source the
/// leader waits for the signal to count every GIN rank's channels, then the
/// coop sums the words of channels `0..=channel` ([`channel_sums`]).
///
/// # Safety
/// `ctx` a live high-throughput context; every thread of `coop` calls it.
unsafe fn wait_dispatch_channel<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    channel: u32,
    seq: u32,
) -> Result<(u32, u32), MoeError> {
    let comm = ctx.comm();
    let lsa = is_lsa(ctx, src);
    let r = (|| -> Result<(u32, u32), MoeError> {
        let mut deadline = Deadline::new(&comm.abort());
        if lsa {
            let p = local_ptr(ctx, ctx.ht_dispatch_word_offset(src, channel)) as *const u64;
            // SAFETY: (both) this rank's words, written only atomically; the
            // wait acquires the dispatch word, which the sender's release
            // stored after the position word.
            let (w, at) = unsafe {
                let w = wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline)?;
                let q = local_ptr(ctx, ctx.ht_dispatch_pos_offset(src, channel)) as *const u64;
                (w, atomic::load_relaxed(q, Scope::Sys))
            };
            let (count, first, m) = (w as u32, at as u32, ctx.max_tokens());
            if (w >> 32) as u32 != seq || (at >> 32) as u32 != seq || count > m || first > m - count {
                return Err(MoeError::OutOfStep);
            }
            return Ok((first, count));
        }
        if coop.is_leader() {
            let total = seq as u64 * gin_ranks(ctx) as u64 * ctx.channels() as u64;
            Gin::new(comm, 0)?.wait_signal(&ThreadCoop, DISPATCH_SIGNAL, total)?;
        }
        Ok((0, 0))
    })();
    let r = coop.agree(r)?;
    if lsa {
        return Ok(r);
    }
    let sums = channel_sums(coop, ctx, src, seq, channel, channel + 1, |s, c| ctx.ht_dispatch_word_offset(s, c));
    coop.agree(sums.map(|(before, own, _)| (before, own)))
}

/// The per-source layout's receive ([`MoeContext::HT_PER_SOURCE`], DeepEP's
/// output): waits for source `src`'s channel `channel` of dispatch `seq`,
/// then copies its tokens, in position order, to rows `src * M + p` of
/// `out` (`[ranks * max_tokens][hidden]`), their top-k entries to the same
/// rows of `recv_idx` (`[ranks * max_tokens][top_k]`, the local expert's
/// index, -1 for another rank's) and `recv_weights` (0 for another
/// rank's), adds each token once to `counts[local]` for every distinct
/// local expert it names, and, for the last channel, writes the source's
/// token count to `source_counts[src]`. Returns the channel's tokens. The
/// receive slots stay as they were (combine reuses them for GIN). With
/// `own_direct`, the rows from this rank itself are in `out` already
/// ([`dispatch_send_channel`]'s `own_out`) and only their routing is copied.
/// `out` may be the receive slots themselves ([`window_rows`]): then no
/// token is copied at all, the channel's tokens stay where they landed.
///
/// # Safety
/// `ctx` a live high-throughput context; `out`, `recv_idx`,
/// `recv_weights` of the shapes above, `counts` `local_experts` `u32`s
/// zeroed before the dispatch's first receive (accessed atomically),
/// `source_counts` `nranks` `u32`s; every thread of `coop` calls with the
/// same arguments; no other coop receives (`src`, `channel`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn dispatch_recv_channel<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    channel: u32,
    out: *mut u8,
    recv_idx: *mut i32,
    recv_weights: *mut f32,
    counts: *mut u32,
    source_counts: *mut u32,
    own_direct: bool,
    seq: u32,
) -> Result<u32, MoeError> {
    // SAFETY: the contract.
    unsafe {
        dispatch_recv_channel_with(
            coop,
            ctx,
            src,
            channel,
            out,
            recv_idx,
            recv_weights,
            counts,
            source_counts,
            own_direct,
            seq,
            |_| {},
        )
    }
}

/// [`dispatch_recv_channel`] with a receive hook (DeepEP's idea): every
/// thread calls `waited(count)` once the channel's `count` tokens are in,
/// before they are read. Work that needs only the count, or a timestamp of
/// the arrival (the library's per-source dispatch stamps its "waited"
/// stage there), then runs at the earliest point without a second wait.
///
/// # Safety
/// As for [`dispatch_recv_channel`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn dispatch_recv_channel_with<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    channel: u32,
    out: *mut u8,
    recv_idx: *mut i32,
    recv_weights: *mut f32,
    counts: *mut u32,
    source_counts: *mut u32,
    own_direct: bool,
    seq: u32,
    waited: impl FnOnce(u32),
) -> Result<u32, MoeError> {
    let (n, l) = (ctx.comm().nranks(), ctx.local_experts());
    if !ctx.high_throughput() || src >= n || channel >= ctx.channels() {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the contract.
    let (first, count) = unsafe { wait_dispatch_channel(coop, ctx, src, channel, seq) }?;
    waited(count);
    let (k, m) = (ctx.top_k() as usize, ctx.max_tokens() as usize);
    let (row, slot) = (ctx.token_bytes() as usize, ctx.slot_bytes() as usize);
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let r0 = src as usize * m + first as usize;
    if !(own_direct && src == ctx.comm().rank()) {
        let from = local_ptr(ctx, ctx.ht_recv_slot_offset(src, first));
        // SAFETY: positions `first..first + count <= max_tokens` of source
        // `src`: received slots, and rows `r0..` of `out`, this coop's alone.
        unsafe { copy_row_block(tr, nt, out.add(r0 * row), row, from, slot, row, count as usize) };
    }
    let lo = ctx.comm().rank() * l;
    let meta = local_ptr(ctx, ctx.ht_meta_offset(src, first)) as *const i32;
    // 32-bit index arithmetic: a 64-bit division is a called routine on
    // the GPU. (Every thread has the same `count`: all return or none.)
    let k32 = ctx.top_k();
    let Some(entries) = count.checked_mul(k32) else { return Err(MoeError::BadArgument) };
    let mut i = tr as u32;
    while i < entries {
        let (p, j) = ((i / k32) as usize, (i % k32) as usize);
        // SAFETY: entries `j < k` and `q < j` of received routing row `p <
        // count` (ids, then weights, `2k` `i32`s a row); the output entries
        // (`r0 + p`, `j`) are this coop's alone; `counts` holds `l` words,
        // accessed atomically.
        unsafe {
            let ids = meta.add(p * 2 * k);
            // The entry, its weight and the ids before it are loaded before
            // any is compared (one round trip): comparing each id as it
            // came made a chain of loads, one per earlier entry.
            let e = *ids.add(j);
            let w = *(ids.add(k + j) as *const f32);
            let mut head = [0i32; ROW_HEAD];
            for (q, h) in head.iter_mut().enumerate() {
                if q < j {
                    *h = *ids.add(q);
                }
            }
            let mut dup = false;
            for (q, h) in head.iter().enumerate() {
                dup |= q < j && *h == e;
            }
            for q in ROW_HEAD..j {
                dup |= *ids.add(q) == e;
            }
            let local = is_one_of(e, lo, l);
            *recv_idx.add((r0 + p) * k + j) = if local { e - lo as i32 } else { -1 };
            *recv_weights.add((r0 + p) * k + j) = if local { w } else { 0.0 };
            if local && !dup {
                atomic::red_add_relaxed(counts.add((e as u32 - lo) as usize), 1u32, Scope::Gpu);
            }
        }
        i += nt as u32;
    }
    if channel == ctx.channels() - 1 && coop.is_leader() {
        // SAFETY: `src < nranks`.
        unsafe { *source_counts.add(src as usize) = first + count };
    }
    coop.sync();
    Ok(count)
}

/// Ids of a received routing row that [`dispatch_recv_channel`] loads at
/// once to find an entry's earlier duplicates (those beyond, with a top-k
/// above it, one at a time).
const ROW_HEAD: usize = 8;

/// 16-byte vectors in flight per thread in [`copy_row_block`]'s
/// contiguous copies (a channel's rows at once: the per-source receive and
/// combine send) and in [`dispatch_send_channel`]'s token rows (a 7168-wide
/// bf16 row over 64 threads in one step: 1.5 us less on 2 x H200 than
/// steps of 8 and 6), twice the other token copies' [`COPY_UNROLL`].
const BLOCK_UNROLL: usize = 16;

/// The index of the `r`-th (from 0) set bit of `m` (`r < m.count_ones()`).
#[inline(always)]
fn nth_set_bit(mut m: u32, r: u32) -> u32 {
    for _ in 0..r {
        m &= m - 1;
    }
    m.trailing_zeros()
}

/// Copies `count` rows of `row` bytes from `src` (rows `src_stride`
/// bytes apart) to `dst` (`dst_stride` apart): one copy when both are
/// contiguous, else a row at a time; nothing when `dst` is `src` with the
/// same stride (the rows are in place already).
///
/// # Safety
/// Both valid for `count` rows of their strides (`>= row`), the same rows
/// or not overlapping; threads `t` of `nt`, each once.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn copy_row_block(
    t: usize,
    nt: usize,
    dst: *mut u8,
    dst_stride: usize,
    src: *const u8,
    src_stride: usize,
    row: usize,
    count: usize,
) {
    if core::ptr::eq(dst, src) && dst_stride == src_stride {
        // The rows are where they are to go (an output in the window: [`window_rows`]).
        return;
    }
    if dst_stride == row && src_stride == row {
        // SAFETY: the contract: `count` whole rows, contiguous on both sides.
        unsafe { copy_strided_by::<BLOCK_UNROLL>(t, nt, dst, src, count * row) };
        return;
    }
    for p in 0..count {
        // SAFETY: the contract: row `p` of both.
        unsafe { copy_strided_by::<COPY_UNROLL>(t, nt, dst.add(p * dst_stride), src.add(p * src_stride), row) };
    }
}

/// Waits until every source's tokens of dispatch `seq` are in (every
/// channel word of every rank).
///
/// # Safety
/// `ctx` a live high-throughput context; every thread of `coop` calls it.
pub unsafe fn dispatch_wait<C: Coop>(coop: &C, ctx: &MoeContext, seq: u32) -> Result<(), MoeError> {
    // SAFETY: the contract.
    unsafe { wait_words(coop, ctx, seq, DISPATCH_SIGNAL, |s, c| ctx.ht_dispatch_word_offset(s, c)) }
}

/// Tokens received from `src` in dispatch `seq` (after [`dispatch_wait`]),
/// the same on every thread of `coop`, which all call it (one thread
/// alone: [`ThreadCoop`]).
pub fn source_tokens<C: Coop>(coop: &C, ctx: &MoeContext, src: u32, seq: u32) -> Result<u32, MoeError> {
    if !ctx.high_throughput() || src >= ctx.comm().nranks() {
        return Err(MoeError::BadArgument);
    }
    channel_sums(coop, ctx, src, seq, 0, ctx.channels(), |s, c| ctx.ht_dispatch_word_offset(s, c)).map(|c| c.2)
}

/// Packs source `src`'s `count` received tokens that name local expert
/// `local` into `out` rows from `row0` on; returns how many.
///
/// # Safety
/// As for [`dispatch_pack`], `count` the source's tokens.
#[allow(clippy::too_many_arguments)]
unsafe fn pack_source<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    src: u32,
    count: u32,
    row0: usize,
    out: *mut u8,
    recv_rows: *mut u32,
) -> u32 {
    let (k, m) = (ctx.top_k() as usize, ctx.max_tokens() as usize);
    let g = ctx.comm().rank() * ctx.local_experts() + local;
    let (row, slot) = (ctx.token_bytes() as usize, ctx.slot_bytes() as usize);
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let meta = |p: u32| local_ptr(ctx, ctx.ht_meta_offset(src, p)) as *const i32;
    // SAFETY: the source's `count <= max_tokens` routing rows, `2k` `i32`s
    // apart (ids, then weights), received (the contract).
    let mut hits = unsafe { RowHits::new(meta(0), 2 * k, k, count, g, 1) };
    let mut at = 0u32;
    let mut c0 = 0;
    let mut held: Option<(*const u8, usize)> = None;
    while c0 < count {
        let p = c0 + lane_id();
        let h = hits.group(c0 / WARP_SIZE) as u32;
        let incl = warp_scan(h);
        let r = row0 + (at + incl - h) as usize;
        if h != 0 && coop.thread_rank() < WARP_SIZE {
            for j in 0..k {
                // SAFETY: entry `j < k` of the routing row and of `recv_rows`
                // (`(src * M + p) * K + j`); entries naming `g` are this coop's.
                unsafe {
                    if *meta(p).add(j) == g as i32 {
                        *recv_rows.add((src as usize * m + p as usize) * k + j) = r as u32;
                    }
                }
            }
        }
        // The group's tokens, two at a time (a token waits in `held` for
        // the next, of this group or a later one): both rows' loads in
        // flight before either is stored, one round trip a pair where one
        // a token made the pack wait on memory
        // (`benches/results/2026-11-27-h200x2-moe-htpack.md`).
        let mut mask = arch::ballot(u32::MAX, h != 0);
        while mask != 0 {
            let j = mask.trailing_zeros();
            mask &= mask - 1;
            let rj = arch::shfl(u32::MAX, r as u64, j) as usize;
            let s = local_ptr(ctx, ctx.ht_recv_slot_offset(src, c0 + j));
            match held.take() {
                None => held = Some((s, rj)),
                // SAFETY: received slots (`slot >= row` bytes); rows `r0`
                // and `rj` of `out` (distinct), below `(local + 1) * N * M`
                // (at most N * M tokens name `local`), this coop's alone.
                Some((s0, r0)) => unsafe {
                    copy_rows_strided_by::<COPY_UNROLL, 2>(
                        tr,
                        nt,
                        [out.add(r0 * row), out.add(rj * row)],
                        [s0, s],
                        row.min(slot),
                    )
                },
            }
        }
        at += arch::shfl(u32::MAX, incl as u64, WARP_SIZE - 1) as u32;
        c0 += WARP_SIZE;
    }
    if let Some((s0, r0)) = held {
        // SAFETY: as for the pairs above.
        unsafe { copy_strided_by::<COPY_UNROLL>(tr, nt, out.add(r0 * row), s0, row.min(slot)) };
    }
    at
}

/// After [`dispatch_wait`]: packs source `src`'s tokens that name local
/// expert `local` into `out[local][..]` (rows of `hidden` elements, after
/// those of the sources before `src`, in token order), records each of
/// their top-k entries naming `local` in `recv_rows[(src * M + p) * K +
/// j]` (the packed row), and, for the last source, the expert's total in
/// `out_count[local]`. Returns the tokens packed. Any coop may take any
/// (`local`, `src`); together they must cover all for the output to be complete.
///
/// # Safety
/// `ctx` a live high-throughput context, after [`dispatch_wait`] of
/// `seq` on this rank; `out` holds `local_experts * nranks * max_tokens`
/// rows, `out_count` `local_experts` `u32`s, `recv_rows` `nranks *
/// max_tokens * top_k` `u32`s; every thread of `coop` calls with the same
/// arguments; no other coop packs (`local`, `src`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_pack<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    src: u32,
    out: *mut u8,
    out_count: *mut u32,
    recv_rows: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    let (n, l) = (ctx.comm().nranks(), ctx.local_experts());
    if !ctx.high_throughput() || local >= l || src >= n {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let k = ctx.top_k() as usize;
    let g = ctx.comm().rank() * l + local;
    let mut prefix = 0u32;
    let mut r = Ok(());
    for q in 0..src {
        match source_tokens(coop, ctx, q, seq) {
            Ok(c) => {
                let meta = local_ptr(ctx, ctx.ht_meta_offset(q, 0)) as *const i32;
                // SAFETY: source `q`'s `c <= max_tokens` received routing
                // rows, `2k` `i32`s apart.
                prefix += unsafe { RowHits::new(meta, 2 * k, k, c, g, 1) }.count();
            }
            Err(e) => r = Err(e),
        }
    }
    let count = coop.agree(r.and(source_tokens(coop, ctx, src, seq)))?;
    let row0 = (local * n) as usize * ctx.max_tokens() as usize + prefix as usize;
    // SAFETY: the contract.
    let got = unsafe { pack_source(coop, ctx, local, src, count, row0, out, recv_rows) };
    if src == n - 1 && coop.is_leader() {
        // SAFETY: `local < local_experts`.
        unsafe { *out_count.add(local as usize) = prefix + got };
    }
    coop.sync();
    Ok(got)
}

/// The per-expert receive hook: waits for dispatch `seq` ([`dispatch_wait`]),
/// then packs every source's tokens for local expert `local` (as
/// [`dispatch_pack`] for each source) and returns the expert's token count.
///
/// # Safety
/// As for [`dispatch_pack`], for every source of `local`.
pub unsafe fn dispatch_recv_expert<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    out: *mut u8,
    out_count: *mut u32,
    recv_rows: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    let (n, l) = (ctx.comm().nranks(), ctx.local_experts());
    if local >= l {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the contract.
    unsafe { dispatch_wait(coop, ctx, seq) }?;
    let mut total = 0u32;
    let row0 = (local * n) as usize * ctx.max_tokens() as usize;
    for s in 0..n {
        let count = coop.agree(source_tokens(coop, ctx, s, seq))?;
        // SAFETY: the contract.
        total += unsafe { pack_source(coop, ctx, local, s, count, row0 + total as usize, out, recv_rows) };
    }
    if coop.is_leader() {
        // SAFETY: `local < local_experts`.
        unsafe { *out_count.add(local as usize) = total };
    }
    coop.sync();
    Ok(total)
}

/// Sends channel `channel`'s partial sums back to source `src`: for each
/// token `src` sent here on that channel, the sum of this rank's local
/// experts' outputs for it (rows of `expert_out`, laid out as the packed
/// dispatch output, found through `recv_rows`) weighted by its gates, in
/// f32 in top-k order, rounded once to `T`; into `src`'s send slots
/// `(this rank, position)` (LSA stores, or staged in this rank's receive
/// slots and put by GIN in pieces), then the channel's combine word.
///
/// # Safety
/// `ctx` a live high-throughput context, `T` of its element size;
/// dispatch `seq` was received and packed on this rank, `recv_rows` its
/// table; `expert_out` holds `local_experts * nranks * max_tokens` rows;
/// every thread of `coop` calls with the same arguments; every (`src`,
/// `channel`) is sent by one coop of every rank.
#[inline(always)]
pub unsafe fn combine_send_channel<T: Element<Acc = f32>, C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    channel: u32,
    expert_out: *const u8,
    recv_rows: *const u32,
    seq: u32,
) -> Result<(), MoeError> {
    let (me, l) = (ctx.comm().rank(), ctx.local_experts());
    let (k, m, h) = (ctx.top_k() as usize, ctx.max_tokens() as usize, ctx.hidden() as usize);
    let (row, slot) = (ctx.token_bytes() as usize, ctx.slot_bytes() as usize);
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let lo = me * l;
    let fill = |p0: u32, rows: u32, dst: *mut u8| {
        let entry = |r: usize, j: usize| -> Option<(*const u8, f32)> {
            let p = p0 as usize + r;
            let meta = local_ptr(ctx, ctx.ht_meta_offset(src, p as u32));
            // SAFETY: entry `j < k` of a received routing row (ids, then weights).
            let (e, w) = unsafe {
                (arch::load_volatile((meta as *const i32).add(j)), arch::load_volatile((meta as *const f32).add(k + j)))
            };
            if !is_one_of(e, lo, l) {
                return None;
            }
            // SAFETY: entry (src, p, j) of `recv_rows`, written by the pack.
            let r = unsafe { *recv_rows.add((src as usize * m + p) * k + j) } as usize;
            // SAFETY: a packed row of `expert_out` (below L * N * M).
            Some((unsafe { expert_out.add(r * row) }, w))
        };
        let out_row = |r: usize| dst.wrapping_add(r * slot);
        // SAFETY: rows `0..rows` of `dst` (`send_back`'s: slots of the
        // window, 16-byte aligned, `slot` apart, this coop's alone); the
        // sources rows of `expert_out`.
        unsafe {
            weighted_rows::<T, 2, false>(tr, nt, rows as usize, h, k, out_row, (expert_out as usize) % 16 == 0, entry)
        };
    };
    // SAFETY: the contract; `fill` writes only the rows it is given.
    unsafe { send_back(coop, ctx, src, channel, seq, fill) }
}

/// The per-source layout's combine send ([`MoeContext::HT_PER_SOURCE`]):
/// for each token `src` sent here on channel `channel`, row `src * M + p`
/// of `rows_in` (`[ranks * max_tokens][hidden]`, laid out as
/// [`dispatch_recv_channel`]'s `out`: this rank's output for that token,
/// its local experts' already added) goes back into `src`'s send slot
/// `(this rank, p)` as it is; then the channel's combine word. Rows for
/// this rank itself are not copied: [`combine_reduce_channel`] reads them
/// from `rows_in`.
///
/// # Safety
/// `ctx` a live high-throughput context; dispatch `seq` was received on
/// this rank; `rows_in` holds `nranks * max_tokens` rows of
/// `token_bytes`; every thread of `coop` calls with the same arguments;
/// every (`src`, `channel`) is sent by one coop of every rank.
#[inline(always)]
pub unsafe fn combine_send_rows<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    channel: u32,
    rows_in: *const u8,
    seq: u32,
) -> Result<(), MoeError> {
    let m = ctx.max_tokens() as usize;
    let (row, slot) = (ctx.token_bytes() as usize, ctx.slot_bytes() as usize);
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let own = src == ctx.comm().rank();
    let fill = |p0: u32, rows: u32, dst: *mut u8| {
        if own {
            // [`combine_reduce_channel`] reads this rank's own rows from `rows_in`.
            return;
        }
        // SAFETY: rows `src * M + p0..` of `rows_in` (the contract: `p0 +
        // rows <= max_tokens`), and `send_back`'s rows of `dst`.
        unsafe {
            let from = rows_in.add((src as usize * m + p0 as usize) * row);
            copy_row_block(tr, nt, dst, slot, from, row, row, rows as usize)
        }
    };
    // SAFETY: the contract; `fill` writes only the rows it is given.
    unsafe { send_back(coop, ctx, src, channel, seq, fill) }
}

/// The in-window combine's announcement: this rank's [`window_rows`] hold
/// its output for every token it received in dispatch `seq` (written in
/// place by earlier work on its stream), so every LSA rank (this one
/// included) may read its tokens' rows there: a release at system scope
/// of word `(seq << 32)` into that rank's combine word `(this rank,
/// channel 0)`, which [`combine_reduce_channel`] with `PULL` waits for.
/// Call once per combine, by one coop of the grid, before any of its
/// coops waits.
///
/// # Safety
/// `ctx` a live per-source high-throughput context; every thread of `coop`
/// calls it; the rows' writes happen before this call (earlier kernels on
/// the stream, or this grid after a grid-wide barrier).
pub unsafe fn combine_rows_ready<C: Coop>(coop: &C, ctx: &MoeContext, seq: u32) {
    let (n, me) = (ctx.comm().nranks(), ctx.comm().rank());
    let mut d = coop.thread_rank();
    while d < n {
        let p = peer_ptr(ctx, d, ctx.ht_combine_word_offset(me, 0)) as *mut u64;
        if !p.is_null() {
            atomic::fence_acq_rel(Scope::Sys);
            // SAFETY: the combine word `(me, 0)` of LSA rank `d`'s window,
            // written only atomically.
            unsafe { atomic::store_release(p, word(seq, 0), Scope::Sys) };
        }
        d += coop.size();
    }
}

/// A combine's send of channel `channel` to source `src`: `fill(p0, rows,
/// dst)` writes the outputs of positions `p0..p0 + rows` into `dst` (rows
/// `slot_bytes` apart: `src`'s send slots `(this rank, p0..)` over LSA, or
/// this rank's receive slots `(src, p0..)`, then put by GIN), a piece of
/// at most [`PUT_BYTES`] at a time; then the channel's combine word.
///
/// # Safety
/// `ctx` a live high-throughput context; dispatch `seq` was received on
/// this rank; every thread of `coop` calls with the same arguments;
/// every (`src`, `channel`) is sent by one coop of every rank; `fill`
/// writes only the rows it is given.
#[inline(always)]
unsafe fn send_back<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    channel: u32,
    seq: u32,
    fill: impl Fn(u32, u32, *mut u8),
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, me) = (comm.nranks(), comm.rank());
    if !ctx.high_throughput() || src >= n || channel >= ctx.channels() {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let (first, count, _) = coop
        .agree(channel_sums(coop, ctx, src, seq, channel, ctx.channels(), |s, c| ctx.ht_dispatch_word_offset(s, c)))?;
    let gin = gin_for(coop, ctx, src)?;
    let chunk = (PUT_BYTES / ctx.slot_bytes()).max(WARP_SIZE as u64) as u32;
    let mut p0 = first;
    while p0 < first + count {
        let rows = chunk.min(first + count - p0);
        let dst = if gin.is_none() {
            peer_ptr(ctx, src, ctx.ht_send_slot_offset(me, p0))
        } else {
            local_ptr(ctx, ctx.ht_recv_slot_offset(src, p0))
        };
        fill(p0, rows, dst);
        if let Some(gin) = &gin {
            let bytes = rows as u64 * ctx.slot_bytes();
            let (d, s) = (ctx.ht_send_slot_offset(me, p0), ctx.ht_recv_slot_offset(src, p0));
            // SAFETY: the rows just written, inside the window on both sides.
            unsafe { put_range(coop, ctx, gin, src, d, s, bytes) }?;
        }
        p0 += rows;
    }
    let off = ctx.ht_combine_word_offset(me, channel);
    // SAFETY: the channel's combine word, written only by this coop.
    unsafe { publish(coop, ctx, gin.as_ref(), src, off, word(seq, count), COMBINE_SIGNAL) }
}

/// [`combine_wait`] and [`combine_reduce`] for the tokens of one channel
/// (the per-source layout's kernel): channel `channel` covers the same
/// token range on every rank it went to, so once every rank's combine
/// word of that channel is in (from GIN ranks: their signal, counting
/// every channel), `out[t]` for those tokens is the partials added in f32
/// in rank order, rounded once, while other channels still travel. This
/// rank's own partials come from `own_rows` (the rows
/// [`combine_send_rows`] took, `[ranks * max_tokens][hidden]`), not
/// through the window.
///
/// With `PULL` (the in-window combine: every rank's rows are its
/// [`window_rows`], announced by [`combine_rows_ready`]), an LSA rank's
/// partials are read straight from its window rows over NVLink once its
/// ready word is in; nothing was pushed.
///
/// # Safety
/// As for [`combine_reduce`]; `own_rows` as [`combine_send_rows`]'s
/// `rows_in` (with `PULL`: this rank's [`window_rows`]); every thread of
/// `coop` calls with the same arguments; no other coop reduces `channel`;
/// with `PULL`, every rank of the group combines with `PULL`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn combine_reduce_channel<T: Element<Acc = f32>, C: Coop, const PULL: bool>(
    coop: &C,
    ctx: &MoeContext,
    channel: u32,
    rank_pos: *const u32,
    num_tokens: u32,
    own_rows: *const u8,
    out: *mut T,
    seq: u32,
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, me) = (comm.nranks(), comm.rank());
    if !ctx.high_throughput() || channel >= ctx.channels() || num_tokens > ctx.max_tokens() {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let off = |d: u32| ctx.ht_combine_word_offset(d, if PULL && is_lsa(ctx, d) { 0 } else { channel });
    let r = (|| -> Result<(), MoeError> {
        let mut deadline = Deadline::new(&comm.abort());
        let mut d = coop.thread_rank();
        while d < n {
            let p = local_ptr(ctx, off(d)) as *const u64;
            if is_lsa(ctx, d) {
                // SAFETY: this rank's word, written only atomically.
                unsafe { wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline) }?;
            }
            d += coop.size();
        }
        let gr = gin_ranks(ctx);
        if gr > 0 && coop.is_leader() {
            let total = seq as u64 * gr as u64 * ctx.channels() as u64;
            Gin::new(comm, 0)?.wait_signal(&ThreadCoop, COMBINE_SIGNAL, total)?;
        }
        Ok(())
    })();
    coop.agree(r)?;
    let mut r = Ok(());
    let mut d = coop.thread_rank();
    while d < n {
        let p = local_ptr(ctx, off(d)) as *const u64;
        // SAFETY: as above.
        let w = unsafe { atomic::load_acquire(p, Scope::Sys) };
        if (w >> 32) as u32 != seq {
            r = Err(MoeError::OutOfStep);
        }
        d += coop.size();
    }
    coop.agree(r)?;
    let (first, end) = channel_tokens(num_tokens, ctx.channels(), channel);
    let (nn, row) = (n as usize, ctx.hidden() as usize * core::mem::size_of::<T>());
    let entry = |tok: usize, d: usize| -> Option<(*const u8, f32)> {
        // SAFETY: `first + tok < num_tokens`, `d < nranks`: inside `rank_pos`.
        let p = unsafe { *rank_pos.add((first as usize + tok) * nn + d) };
        if p == NO_POS || p >= ctx.max_tokens() {
            return None;
        }
        if d as u32 == me {
            let r = me as usize * ctx.max_tokens() as usize + p as usize;
            return Some((own_rows.wrapping_add(r * row), 1.0));
        }
        if PULL && is_lsa(ctx, d as u32) {
            // `d`'s window row of this rank's token at position `p`.
            return Some((peer_ptr(ctx, d as u32, ctx.ht_recv_slot_offset(me, p)) as *const u8, 1.0));
        }
        Some((local_ptr(ctx, ctx.ht_send_slot_offset(d as u32, p)) as *const u8, 1.0))
    };
    let out_row = |tok: usize| (out as *mut u8).wrapping_add((first as usize + tok) * row);
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    // SAFETY: the contract: rows `first..end` of `out`, this coop's alone;
    // the partials are slots of the window (16-byte aligned).
    unsafe {
        weighted_rows::<T, 2, false>(
            t,
            nt,
            (end - first) as usize,
            ctx.hidden() as usize,
            nn,
            out_row,
            (out as usize | own_rows as usize) % 16 == 0,
            entry,
        )
    };
    coop.sync();
    Ok(())
}

/// Waits until every rank's partial sums of dispatch `seq` are back on
/// this rank (every combine word).
///
/// # Safety
/// `ctx` a live high-throughput context; every thread of `coop` calls it.
pub unsafe fn combine_wait<C: Coop>(coop: &C, ctx: &MoeContext, seq: u32) -> Result<(), MoeError> {
    // SAFETY: the contract.
    unsafe { wait_words(coop, ctx, seq, COMBINE_SIGNAL, |d, c| ctx.ht_combine_word_offset(d, c)) }
}

/// `out[t] = sum over ranks d (in order) of the partial d sent back for
/// token t` (tokens whose top-k names none of d's experts add nothing),
/// in f32, rounded once; by any set of threads (`t` of `nt`). Call after
/// [`combine_wait`] (by every thread that reads).
///
/// # Safety
/// `ctx` a live high-throughput context, `T` of its element size;
/// `rank_pos` the dispatch's (`num_tokens * nranks`); `out` holds
/// `num_tokens * hidden` elements; the `nt` threads use `t = 0..nt` once each.
#[inline(always)]
pub unsafe fn combine_reduce<T: Element<Acc = f32>>(
    t: usize,
    nt: usize,
    ctx: &MoeContext,
    rank_pos: *const u32,
    num_tokens: u32,
    out: *mut T,
) {
    let n = ctx.comm().nranks() as usize;
    let row = ctx.hidden() as usize * core::mem::size_of::<T>();
    let entry = |tok: usize, d: usize| -> Option<(*const u8, f32)> {
        // SAFETY: `tok < num_tokens`, `d < nranks`: inside `rank_pos`.
        let p = unsafe { *rank_pos.add(tok * n + d) };
        if p == NO_POS || p >= ctx.max_tokens() {
            return None;
        }
        Some((local_ptr(ctx, ctx.ht_send_slot_offset(d as u32, p)) as *const u8, 1.0))
    };
    let out_row = |tok: usize| (out as *mut u8).wrapping_add(tok * row);
    // SAFETY: the contract; the partials are slots of the window (16-byte aligned).
    unsafe {
        weighted_rows::<T, 2, false>(
            t,
            nt,
            num_tokens as usize,
            ctx.hidden() as usize,
            n,
            out_row,
            (out as usize) % 16 == 0,
            entry,
        )
    };
}
