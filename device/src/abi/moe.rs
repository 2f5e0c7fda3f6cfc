//! What the host hands the MoE expert-parallel dispatch and combine of
//! [`crate::moe`]: [`MoeContext`] (the group's symmetric window and its
//! layout, made once per group), [`MoeArgs`] (one host-launched
//! dispatch or combine) and [`MoeHtArgs`] (the same in high-throughput mode).

use super::{DevComm, WindowDesc};

/// One expert-parallel group on one rank: the device communicator, the
/// group's window, the shapes, and where each area lies in the window.
///
/// With `N` ranks, `E` experts, `L = E / N` local experts, `M` the most
/// tokens per rank and `B` = [`MoeContext::slot_bytes`] (a token's bytes
/// rounded up to 16), every rank's copy of the window holds:
///
/// * receive slots at `recv_offset`: `L × N × M` slots of `B` bytes, slot
///   `(local expert l, source rank s, position p)` at
///   [`MoeContext::recv_slot_offset`]; a GIN source's dispatch writes
///   them (per expert), combine reuses them as its staging area for GIN.
///   An LSA source `s` sends each token once instead (however many of
///   this rank's experts it names): token `t` into slot `(0, s, t)`
///   ([`MoeContext::ll_token_slot_offset`]);
/// * receive counts at `recv_count_offset`: `L × N` `u64` words, word
///   `(l, s)` = `(seq << 32) | tokens`: written by a GIN source `s` after
///   its tokens for `l` (a put with a signal), by this rank itself for an
///   LSA source once it counted them, or, for a streamed receive, by the
///   LSA source itself before its tokens (a relaxed store: the word is its
///   own data);
/// * combine slots at `comb_offset`: `E × M` slots of `B` bytes, slot
///   `(global expert e, position p)`: expert `e`'s output for this rank's
///   `p`-th token routed to it (a per-expert combine); dispatch stages GIN
///   sends there; a per-rank combine puts LSA rank `d`'s partial sum for
///   token `t` into slot `(d * L, t)`;
/// * combine flags at `comb_flag_offset`: `E` `u64` words, word `e` =
///   `(seq << 32) | tokens` written by `e`'s rank after its outputs;
/// * token headers at `meta_offset`: `N × M` headers of
///   [`MoeContext::ll_meta_bytes`], header `(s, t)` at
///   [`MoeContext::ll_meta_offset`]: a `u64` dispatch word `(seq << 32) |
///   1` (a token) or `(seq << 32)` (slot `t` unused: `t` at or past the
///   source's token count); a `u64` combine word (below); then `I` =
///   [`MoeContext::ll_header_ids`] (`K` rounded up to a multiple of 4:
///   16-byte vectors) `i32` expert ids from byte 16 (-1 past `K`), `I`
///   `f32` gate weights, `I` `u32` rows and `I` `u32` positions. LSA
///   source `s` writes the ids and weights (and, for a streamed receive,
///   each entry's position among `s`'s tokens for its expert), then the
///   dispatch word with a release, after the token's bytes, for every `t <
///   M` in every dispatch; this rank writes the rows while it packs (entry
///   `j`'s row in the packed output, for the entries naming its experts)
///   and reads them back in the combine.
///   In the combine the header `(d, t)` of *this* rank's copy is the
///   other way round: its combine word `(seq << 32) | sent` is written by
///   LSA rank `d` (with a release) after it stored its partial sum for
///   this rank's token `t` (`sent` = 1) into the partial slot
///   [`MoeContext::ll_partial_slot_offset`]`(d, t)`, or found that token
///   names none of its experts (`sent` = 0);
/// * the grid word after the headers ([`MoeContext::ll_grid_word_offset`]):
///   a `u64` the library's dispatch kernel counts its CTAs' arrivals in
///   (a barrier between its packing steps); nothing else uses it.
///
/// With fp8 dispatch ([`MoeContext::with_fp8_dispatch`]) a receive slot
/// holds a token as `hidden` fp8 e4m3 bytes followed by `hidden / 128`
/// f32 scales (each 128-element group's `amax / 448`), which fits the
/// slot (bf16 tokens: `2 * hidden` bytes).
///
/// GIN signals `0..L` count dispatch arrivals per local expert, signal `L`
/// combine arrivals (sources and experts outside the LSA team only).
#[doc(alias = "ncclEpGroup")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct MoeContext {
    pub(crate) comm: DevComm,
    pub(crate) window: WindowDesc,
    pub(crate) num_experts: u32,
    pub(crate) hidden: u32,
    pub(crate) top_k: u32,
    pub(crate) max_tokens: u32,
    pub(crate) elem_size: u32,
    pub(crate) flags: u32,
    pub(crate) slot_bytes: u64,
    pub(crate) recv_offset: u64,
    pub(crate) recv_count_offset: u64,
    pub(crate) comb_offset: u64,
    pub(crate) comb_flag_offset: u64,
    pub(crate) channels: u32,
    pub(crate) reserved: u32,
    pub(crate) meta_offset: u64,
}

impl MoeContext {
    /// Bytes of the window the layout above needs (`None` on overflow).
    pub const fn window_bytes(
        nranks: u32,
        num_experts: u32,
        top_k: u32,
        max_tokens: u32,
        slot_bytes: u64,
    ) -> Option<u64> {
        let l = (num_experts / if nranks == 0 { 1 } else { nranks }) as u64;
        let (n, e, m) = (nranks as u64, num_experts as u64, max_tokens as u64);
        let recv = match l.checked_mul(n) {
            Some(ln) => match ln.checked_mul(m) {
                Some(x) => x.checked_mul(slot_bytes),
                None => None,
            },
            None => None,
        };
        let comb = match e.checked_mul(m) {
            Some(x) => x.checked_mul(slot_bytes),
            None => None,
        };
        let meta = match n.checked_mul(m) {
            // The headers, then the grid word (16 bytes).
            Some(nm) => match nm.checked_mul(Self::meta_bytes_for(top_k)) {
                Some(h) => h.checked_add(16),
                None => None,
            },
            None => None,
        };
        match (recv, comb, meta) {
            (Some(r), Some(c), Some(h)) => match r.checked_add(c) {
                Some(rc) => match rc.checked_add(8 * (l * n + e)) {
                    Some(words) => words.next_multiple_of(16).checked_add(h),
                    None => None,
                },
                None => None,
            },
            _ => None,
        }
    }

    /// Bytes of a token header (see the layout above) for top-k `top_k`:
    /// two words, then ids, weights, rows and positions, `top_k` rounded
    /// up to 4 each.
    const fn meta_bytes_for(top_k: u32) -> u64 {
        16 + 4 * 4 * (top_k as u64).next_multiple_of(4)
    }

    /// Expert ids in a token header of the low-latency layout: `top_k`
    /// rounded up to a multiple of 4 (the rest -1).
    #[inline(always)]
    pub const fn ll_header_ids(&self) -> u32 {
        self.top_k.next_multiple_of(4)
    }

    /// Bytes of a token header of the low-latency layout: the dispatch and
    /// combine words, then [`MoeContext::ll_header_ids`] expert ids, as
    /// many weights, rows and positions.
    #[inline(always)]
    pub const fn ll_meta_bytes(&self) -> u64 {
        Self::meta_bytes_for(self.top_k)
    }

    /// Offset of LSA source `src`'s token header `t` (low-latency): its
    /// dispatch word.
    #[inline(always)]
    pub const fn ll_meta_offset(&self, src: u32, t: u32) -> u64 {
        self.meta_offset + (src as u64 * self.max_tokens as u64 + t as u64) * self.ll_meta_bytes()
    }

    /// Offset of header `(rank, t)`'s combine word (low-latency): written
    /// by LSA rank `rank` after its partial sum for this rank's token `t`.
    #[inline(always)]
    pub const fn ll_combine_word_offset(&self, rank: u32, t: u32) -> u64 {
        self.ll_meta_offset(rank, t) + 8
    }

    /// Offset of header `(src, t)`'s expert ids (16-byte aligned), followed
    /// by the weights at `+ 4 * I`, the rows at `+ 8 * I` and the
    /// positions at `+ 12 * I` (`I` = [`MoeContext::ll_header_ids`]).
    #[inline(always)]
    pub const fn ll_ids_offset(&self, src: u32, t: u32) -> u64 {
        self.ll_meta_offset(src, t) + 16
    }

    /// Offset of the grid word (low-latency; see the layout above).
    #[inline(always)]
    pub const fn ll_grid_word_offset(&self) -> u64 {
        self.ll_meta_offset(self.comm.nranks, 0)
    }

    /// Offset of the slot LSA source `src`'s token `t` lands in
    /// (low-latency): receive slot `(0, src, t)`.
    #[inline(always)]
    pub const fn ll_token_slot_offset(&self, src: u32, t: u32) -> u64 {
        self.recv_slot_offset(0, src, t)
    }

    /// Offset of the slot where LSA rank `rank` puts its partial sum for
    /// this rank's token `t` in a per-rank combine (low-latency): combine
    /// slot `(rank * L, t)`, the slot of `rank`'s first expert, which no
    /// per-expert traffic uses when `rank` is an LSA peer (the dispatch
    /// stages only GIN ranks' experts there).
    #[inline(always)]
    pub const fn ll_partial_slot_offset(&self, rank: u32, t: u32) -> u64 {
        self.comb_slot_offset(rank * self.local_experts(), t)
    }

    /// A context from its parts; the offsets follow the layout above in
    /// its order (receive slots, combine slots, receive counts, combine
    /// flags) from byte 0 of `window`.
    ///
    /// # Safety
    /// `comm` is live; if any rank of the world is outside its LSA team,
    /// it has GIN with at least `num_experts / nranks + 1` signals used by
    /// nothing else; `window` is a window of `comm`'s communicator, in
    /// `comm`'s GIN window table when GIN is used, of at least
    /// [`MoeContext::window_bytes`] bytes on every rank, used by nothing
    /// else, zeroed on every rank before any rank's first use;
    /// `num_experts` is a non-zero multiple of the rank count; `top_k` in
    /// `1..=32`; `elem_size` in `{1, 2, 4}`.
    pub unsafe fn new(
        comm: DevComm,
        window: WindowDesc,
        num_experts: u32,
        hidden: u32,
        top_k: u32,
        max_tokens: u32,
        elem_size: u32,
    ) -> Self {
        let n = comm.nranks as u64;
        let l = num_experts as u64 / n.max(1);
        let (e, m) = (num_experts as u64, max_tokens as u64);
        let slot_bytes = (hidden as u64 * elem_size as u64).div_ceil(16) * 16;
        let recv_offset = 0;
        let comb_offset = l * n * m * slot_bytes;
        let recv_count_offset = comb_offset + e * m * slot_bytes;
        let comb_flag_offset = recv_count_offset + 8 * l * n;
        // 16-byte aligned: the headers' ids are read as 16-byte vectors.
        let meta_offset = (comb_flag_offset + 8 * e).next_multiple_of(16);
        MoeContext {
            comm,
            window,
            num_experts,
            hidden,
            top_k,
            max_tokens,
            elem_size,
            flags: 0,
            slot_bytes,
            recv_offset,
            recv_count_offset,
            comb_offset,
            comb_flag_offset,
            channels: 0,
            reserved: 0,
            meta_offset,
        }
    }

    /// The same context with fp8 dispatch: tokens (bf16) travel as fp8
    /// e4m3 with one f32 scale per 128 elements (DeepEP's low-latency
    /// fp8 dispatch); combine is unchanged.
    ///
    /// # Safety
    /// As for [`MoeContext::new`], and `elem_size == 2` (bf16 tokens),
    /// `hidden` a multiple of 128, the same on every rank.
    pub const unsafe fn with_fp8_dispatch(mut self) -> Self {
        self.flags |= Self::FP8_DISPATCH;
        self
    }

    /// Flag: dispatch sends fp8 e4m3 with per-128 scales.
    pub const FP8_DISPATCH: u32 = 1;

    /// Flag: the high-throughput layout ([`MoeContext::new_high_throughput`]).
    pub const HIGH_THROUGHPUT: u32 = 2;

    /// Flag (low-latency, the library's kernels): pack per local expert
    /// (`moe::dispatch_pack_expert`, a coop per expert) instead of a token
    /// at a time after a grid barrier.
    pub const PACK_PER_EXPERT: u32 = 4;

    /// Flag (low-latency, the library's kernels): combine per expert
    /// (`moe::CombineForm::PerExpert`) instead of per rank.
    pub const COMBINE_PER_EXPERT: u32 = 8;

    /// The same context with the library kernels' low-latency variants
    /// `flags` ([`MoeContext::PACK_PER_EXPERT`],
    /// [`MoeContext::COMBINE_PER_EXPERT`]; other bits ignored): a choice
    /// for measuring them against each other, the same on every rank.
    pub const fn with_ll_variants(mut self, flags: u32) -> Self {
        self.flags |= flags & (Self::PACK_PER_EXPERT | Self::COMBINE_PER_EXPERT);
        self
    }

    /// Flag (high-throughput): the dispatch leaves each received token
    /// once, per source rank (DeepEP's layout: `ht::dispatch_recv_channel`),
    /// instead of packing it into every local expert it names; combine
    /// then takes one row per received token (`ht::combine_send_rows`).
    pub const HT_PER_SOURCE: u32 = 16;

    /// The same high-throughput context with the per-source layout
    /// ([`MoeContext::HT_PER_SOURCE`]); a low-latency context unchanged.
    /// The same on every rank.
    pub const fn with_ht_per_source(mut self) -> Self {
        if self.high_throughput() {
            self.flags |= Self::HT_PER_SOURCE;
        }
        self
    }

    /// Whether a high-throughput dispatch leaves its tokens per source
    /// rank ([`MoeContext::HT_PER_SOURCE`]).
    #[inline(always)]
    pub const fn ht_per_source(&self) -> bool {
        self.flags & Self::HT_PER_SOURCE != 0
    }

    /// Whether the library's low-latency kernels pack per expert.
    #[inline(always)]
    pub const fn pack_per_expert(&self) -> bool {
        self.flags & Self::PACK_PER_EXPERT != 0
    }

    /// Whether the library's low-latency kernels combine per expert.
    #[inline(always)]
    pub const fn combine_per_expert(&self) -> bool {
        self.flags & Self::COMBINE_PER_EXPERT != 0
    }

    /// Bytes of the window the high-throughput layout needs (`None` on
    /// overflow); see [`MoeContext::new_high_throughput`].
    pub const fn window_bytes_ht(
        nranks: u32,
        top_k: u32,
        max_tokens: u32,
        slot_bytes: u64,
        channels: u32,
    ) -> Option<u64> {
        let nm = nranks as u64 * max_tokens as u64;
        let slots = match nm.checked_mul(slot_bytes) {
            Some(x) => x.checked_mul(2),
            None => None,
        };
        let meta = nm.checked_mul(16 * top_k as u64);
        let words = 24 * nranks as u64 * channels as u64;
        match (slots, meta) {
            (Some(a), Some(b)) => match a.checked_add(b) {
                Some(ab) => ab.checked_add(words),
                None => None,
            },
            _ => None,
        }
    }

    /// A context of the high-throughput mode (`devcomm_device::moe::ht`):
    /// tokens are sent once per destination rank (not once per expert),
    /// over `channels` channels per destination. With `N` ranks, `M` the
    /// most tokens per rank, `K` top-k, `B` the slot bytes and `G`
    /// channels, every rank's copy of the window holds, from byte 0:
    ///
    /// * receive slots (`recv_offset`): `N × M` slots, slot `(source s,
    ///   position p)` ([`MoeContext::ht_recv_slot_offset`]): the `p`-th
    ///   token `s` sent here; combine stages its GIN sends to `s` there;
    /// * send slots (`comb_offset`): `N × M` slots, slot `(rank d, p)`
    ///   ([`MoeContext::ht_send_slot_offset`]): dispatch stages its GIN
    ///   sends to `d` there, and combine receives `d`'s partial sum of this
    ///   rank's `p`-th token sent to `d` there;
    /// * routing (`meta_offset`): `N × M` rows of `K` `i32` expert ids and
    ///   `K` `f32` weights received with the tokens
    ///   ([`MoeContext::ht_meta_offset`]), then as many rows staged for GIN
    ///   sends ([`MoeContext::ht_send_meta_offset`]);
    /// * dispatch words (`recv_count_offset`): `N × G` `u64`, word `(s,
    ///   c)` = `(seq << 32) | tokens` of source `s`'s channel `c`;
    /// * combine words (`comb_flag_offset`): `N × G` `u64`, word `(d, c)`
    ///   the same for rank `d`'s partial sums of channel `c`;
    /// * dispatch positions: `N × G` `u64`, word `(s, c)` = `(seq << 32) |
    ///   first position` of source `s`'s channel `c`, stored by LSA sources
    ///   before the channel's dispatch word
    ///   ([`MoeContext::ht_dispatch_pos_offset`]).
    ///
    /// GIN signal 0 counts dispatch words, signal 1 combine words (from
    /// ranks outside the LSA team).
    ///
    /// Such a context is for the functions of `devcomm_device::moe::ht`
    /// only, not for the low-latency ones (whose layout it does not have).
    ///
    /// # Safety
    /// As for [`MoeContext::new`] (at least 2 GIN signals), with `window`
    /// of at least [`MoeContext::window_bytes_ht`] bytes; `channels`
    /// non-zero, the same on every rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new_high_throughput(
        comm: DevComm,
        window: WindowDesc,
        num_experts: u32,
        hidden: u32,
        top_k: u32,
        max_tokens: u32,
        elem_size: u32,
        channels: u32,
    ) -> Self {
        // SAFETY: the caller's contract covers `new`'s.
        let mut c = unsafe { Self::new(comm, window, num_experts, hidden, top_k, max_tokens, elem_size) };
        let nm = comm.nranks as u64 * max_tokens as u64;
        c.flags = Self::HIGH_THROUGHPUT;
        c.channels = channels;
        c.recv_offset = 0;
        c.comb_offset = nm * c.slot_bytes;
        c.meta_offset = 2 * nm * c.slot_bytes;
        c.recv_count_offset = c.meta_offset + 2 * nm * 8 * top_k as u64;
        c.comb_flag_offset = c.recv_count_offset + 8 * comm.nranks as u64 * channels as u64;
        c
    }

    /// Whether this is a high-throughput context.
    #[inline(always)]
    pub const fn high_throughput(&self) -> bool {
        self.flags & Self::HIGH_THROUGHPUT != 0
    }

    /// Channels per destination rank (high-throughput mode; 0 otherwise).
    #[inline(always)]
    pub const fn channels(&self) -> u32 {
        self.channels
    }

    /// High-throughput: offset of receive slot `(source, position)`.
    #[inline(always)]
    pub const fn ht_recv_slot_offset(&self, src: u32, pos: u32) -> u64 {
        self.recv_offset + (src as u64 * self.max_tokens as u64 + pos as u64) * self.slot_bytes
    }

    /// High-throughput: offset of send slot `(rank, position)`.
    #[inline(always)]
    pub const fn ht_send_slot_offset(&self, rank: u32, pos: u32) -> u64 {
        self.comb_offset + (rank as u64 * self.max_tokens as u64 + pos as u64) * self.slot_bytes
    }

    /// High-throughput: bytes of one routing row (`K` ids, `K` weights).
    #[inline(always)]
    pub const fn ht_meta_bytes(&self) -> u64 {
        8 * self.top_k as u64
    }

    /// High-throughput: offset of the received routing row `(source, position)`.
    #[inline(always)]
    pub const fn ht_meta_offset(&self, src: u32, pos: u32) -> u64 {
        self.meta_offset + (src as u64 * self.max_tokens as u64 + pos as u64) * self.ht_meta_bytes()
    }

    /// High-throughput: offset of the staged routing row `(rank, position)`.
    #[inline(always)]
    pub const fn ht_send_meta_offset(&self, rank: u32, pos: u32) -> u64 {
        self.meta_offset
            + (self.comm.nranks as u64 * self.max_tokens as u64 + rank as u64 * self.max_tokens as u64 + pos as u64)
                * self.ht_meta_bytes()
    }

    /// High-throughput: offset of dispatch word `(source, channel)`.
    #[inline(always)]
    pub const fn ht_dispatch_word_offset(&self, src: u32, channel: u32) -> u64 {
        self.recv_count_offset + (src as u64 * self.channels as u64 + channel as u64) * 8
    }

    /// High-throughput: offset of dispatch position word `(source,
    /// channel)`: the channel's first position among the tokens `source`
    /// sends here, so that a receiver of one channel waits for that
    /// channel's word alone (LSA sources; from GIN sources every word is
    /// in before any channel is read).
    #[inline(always)]
    pub const fn ht_dispatch_pos_offset(&self, src: u32, channel: u32) -> u64 {
        self.comb_flag_offset + (self.comm.nranks as u64 + src as u64) * self.channels as u64 * 8 + channel as u64 * 8
    }

    /// High-throughput: offset of combine word `(rank, channel)`.
    #[inline(always)]
    pub const fn ht_combine_word_offset(&self, rank: u32, channel: u32) -> u64 {
        self.comb_flag_offset + (rank as u64 * self.channels as u64 + channel as u64) * 8
    }

    /// Whether dispatch sends fp8 e4m3 with per-128 scales.
    #[inline(always)]
    pub const fn fp8_dispatch(&self) -> bool {
        self.flags & Self::FP8_DISPATCH != 0
    }

    /// Bytes a dispatched token occupies in its receive slot: the token's
    /// bytes, or with fp8 dispatch `hidden` + 4 × `hidden / 128` (data, scales).
    #[inline(always)]
    pub const fn dispatch_bytes(&self) -> u64 {
        if self.fp8_dispatch() {
            self.hidden as u64 + 4 * (self.hidden as u64 / 128)
        } else {
            self.token_bytes()
        }
    }

    /// The device communicator.
    #[inline(always)]
    pub const fn comm(&self) -> &DevComm {
        &self.comm
    }

    /// The group's window.
    #[inline(always)]
    pub const fn window(&self) -> WindowDesc {
        self.window
    }

    /// Number of experts (all ranks).
    #[inline(always)]
    pub const fn num_experts(&self) -> u32 {
        self.num_experts
    }

    /// Experts per rank.
    #[inline(always)]
    pub const fn local_experts(&self) -> u32 {
        self.num_experts / if self.comm.nranks == 0 { 1 } else { self.comm.nranks }
    }

    /// Elements per token.
    #[inline(always)]
    pub const fn hidden(&self) -> u32 {
        self.hidden
    }

    /// Experts per token.
    #[inline(always)]
    pub const fn top_k(&self) -> u32 {
        self.top_k
    }

    /// Most tokens a rank dispatches at once.
    #[inline(always)]
    pub const fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// Bytes per element.
    #[inline(always)]
    pub const fn elem_size(&self) -> u32 {
        self.elem_size
    }

    /// Bytes of one token (`hidden * elem_size`).
    #[inline(always)]
    pub const fn token_bytes(&self) -> u64 {
        self.hidden as u64 * self.elem_size as u64
    }

    /// Bytes of one slot (a token's bytes rounded up to 16).
    #[inline(always)]
    pub const fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Offset of receive slot `(local expert, source rank, position)`.
    #[inline(always)]
    pub const fn recv_slot_offset(&self, local_expert: u32, src: u32, pos: u32) -> u64 {
        self.recv_offset
            + ((local_expert as u64 * self.comm.nranks as u64 + src as u64) * self.max_tokens as u64 + pos as u64)
                * self.slot_bytes
    }

    /// Offset of receive count word `(local expert, source rank)`.
    #[inline(always)]
    pub const fn recv_count_offset(&self, local_expert: u32, src: u32) -> u64 {
        self.recv_count_offset + (local_expert as u64 * self.comm.nranks as u64 + src as u64) * 8
    }

    /// Offset of combine slot `(global expert, position)`.
    #[inline(always)]
    pub const fn comb_slot_offset(&self, expert: u32, pos: u32) -> u64 {
        self.comb_offset + (expert as u64 * self.max_tokens as u64 + pos as u64) * self.slot_bytes
    }

    /// Offset of combine flag word `expert`.
    #[inline(always)]
    pub const fn comb_flag_offset(&self, expert: u32) -> u64 {
        self.comb_flag_offset + expert as u64 * 8
    }
}

// SAFETY: #[repr(C)] plain data (two ABI structs, u32s, u64s) with the same
// layout on both targets.
unsafe impl crate::KernelParam for MoeContext {}

/// Stamps per CTA in [`MoeArgs::stamps`]: the kernel's start, then the end
/// of its send, wait, counting (the low-latency dispatch's counting and
/// grid barrier before its token-major pack; other kernels stamp it right
/// before the last) and last (pack or reduce) steps.
pub const STAGES: usize = 5;

/// One host-launched dispatch or combine: what the kernels of
/// `devcomm-kernels`' `moe` module take. Addresses are device memory of
/// the caller; shapes as `devcomm::moe` documents them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct MoeArgs {
    /// The group.
    pub ctx: MoeContext,
    /// Dispatch: the tokens, `[num_tokens][hidden]`. Combine: the experts'
    /// outputs, `[local experts][ranks * max_tokens][hidden]`.
    pub x: u64,
    /// Dispatch: `i32 [num_tokens][top_k]` expert ids (negative: none).
    /// Combine: the handle's copy.
    pub topk_idx: u64,
    /// `f32 [num_tokens][top_k]` gate weights (dispatch: the caller's;
    /// combine: the handle's copy).
    pub topk_weights: u64,
    /// Dispatch: the packed received tokens, `[local experts][ranks *
    /// max_tokens][hidden]`. Combine: `[num_tokens][hidden]`.
    pub out: u64,
    /// Dispatch: `u32 [local experts]` tokens received per local expert.
    pub counts: u64,
    /// Fp8 dispatch: `f32 [local experts][ranks * max_tokens][hidden / 128]`,
    /// the received tokens' scales (`out` then holds fp8 bytes); else 0.
    pub scales: u64,
    /// The handle's `u32 [max_tokens][top_k]` positions (dispatch writes,
    /// combine reads).
    pub pos: u64,
    /// The handle's copies of `topk_idx` and `topk_weights` (dispatch writes them).
    pub handle_idx: u64,
    /// See `handle_idx`.
    pub handle_weights: u64,
    /// Where the kernel reports a failure: one `u32` error code, device memory.
    pub errors: u64,
    /// 0, or `u64 [CTAs][STAGES]` of device memory where each CTA's leader
    /// records `%globaltimer` (ns) at the kernel's start and after its send,
    /// wait and last steps ([`STAGES`]; `devcomm::moe::EpConfig::stage_stamps`).
    /// Recording syncs the CTA at each stage; 0 costs nothing.
    pub stamps: u64,
    /// 0, or `u32 [CTAs]` of device memory, zeroed when the group is made
    /// (the library's kernels, launched with the same grid each way): CTA
    /// `b`'s last combined sequence number. With it a kernel's CTA `b`
    /// uses `max(seq, seq_words[b] + 1)`, and a combine's CTA `b` stores
    /// that back, so a CUDA graph that captured a dispatch and its combine
    /// numbers each replay on from the device (its `seq` baked in).
    pub seq_words: u64,
    /// Tokens of this rank.
    pub num_tokens: u32,
    /// The dispatch's sequence number (non-zero, the same on every rank;
    /// its combine passes the same); see `seq_words`.
    pub seq: u32,
}

// SAFETY: #[repr(C)] plain data with the same layout on both targets.
unsafe impl crate::KernelParam for MoeArgs {}

/// One host-launched high-throughput dispatch or combine: [`MoeArgs`]
/// (its `pos` unused) and the handle's two high-throughput tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct MoeHtArgs {
    /// As for the low-latency kernels.
    pub args: MoeArgs,
    /// The handle's `u32 [max_tokens][ranks]`: the position of each token
    /// among those sent to each rank (`NO_POS`: not sent there). Dispatch
    /// writes, combine reads.
    pub rank_pos: u64,
    /// The handle's `u32 [ranks * max_tokens][top_k]`: for each received
    /// token's top-k entry naming a local expert, its row in the packed
    /// output. Dispatch writes, combine reads. Per-source layout: 0.
    pub recv_rows: u64,
    /// Per-source layout ([`MoeContext::HT_PER_SOURCE`]), dispatch
    /// writes: `i32 [ranks * max_tokens][top_k]`, each received token's
    /// top-k entries as local expert indices (-1: an expert of another
    /// rank); 0 otherwise.
    pub recv_idx: u64,
    /// Per-source layout, dispatch writes: `f32 [ranks * max_tokens][top_k]`,
    /// the entries' gate weights (0 where `recv_idx` is -1); 0 otherwise.
    pub recv_weights: u64,
    /// Per-source layout, dispatch writes: `u32 [ranks]`, the tokens
    /// received from each source; 0 otherwise.
    pub source_counts: u64,
}

// SAFETY: #[repr(C)] plain data with the same layout on both targets.
unsafe impl crate::KernelParam for MoeHtArgs {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts() {
        assert_eq!(size_of::<MoeContext>(), size_of::<DevComm>() + 40 + 24 + 40 + 16);
        assert_eq!(size_of::<MoeHtArgs>(), size_of::<MoeArgs>() + 40);
        assert_eq!(size_of::<MoeArgs>(), size_of::<MoeContext>() + 12 * 8 + 8);
        assert_eq!(core::mem::offset_of!(MoeContext, window), size_of::<DevComm>());
        assert_eq!(core::mem::offset_of!(MoeContext, slot_bytes), size_of::<DevComm>() + 64);
        assert_eq!(core::mem::offset_of!(MoeArgs, errors), size_of::<MoeContext>() + 72);
        assert_eq!(core::mem::offset_of!(MoeArgs, stamps), size_of::<MoeContext>() + 80);
        assert_eq!(core::mem::offset_of!(MoeArgs, seq_words), size_of::<MoeContext>() + 88);
        assert_eq!(core::mem::offset_of!(MoeArgs, seq), size_of::<MoeContext>() + 100);
    }

    #[test]
    fn areas_do_not_overlap() {
        // SAFETY: only its layout arithmetic is used; no kernel gets it.
        let comm = unsafe { DevComm::from_raw_parts(1, 3, WindowDesc::NONE, 0, 0, 0, crate::abi::AbortInfo::none()) };
        // 6 experts on 3 ranks, 5 tokens, 7 f16 elements: 14 bytes -> 16 per slot.
        // SAFETY: as above.
        let c = unsafe { MoeContext::new(comm, WindowDesc::NONE, 6, 7, 2, 5, 2) };
        assert_eq!(c.slot_bytes(), 16);
        assert_eq!(c.local_experts(), 2);
        assert_eq!(c.recv_slot_offset(1, 2, 4) + 16, c.comb_slot_offset(0, 0));
        assert_eq!(c.comb_slot_offset(5, 4) + 16, c.recv_count_offset(0, 0));
        assert_eq!(c.recv_count_offset(1, 2) + 8, c.comb_flag_offset(0));
        assert_eq!((c.comb_flag_offset(5) + 8).next_multiple_of(16), c.ll_meta_offset(0, 0));
        assert_eq!(c.ll_meta_offset(0, 0) % 16, 0);
        // Two words, then 4 ids, weights, rows and positions (top-2 rounded up to 4).
        assert_eq!(c.ll_meta_bytes(), 16 + 4 * 16);
        assert_eq!(c.ll_meta_offset(2, 4) + 80, c.ll_grid_word_offset());
        assert_eq!(c.ll_grid_word_offset() + 16, MoeContext::window_bytes(3, 6, 2, 5, 16).unwrap());
        assert_eq!(c.ll_combine_word_offset(2, 4), c.ll_meta_offset(2, 4) + 8);
        assert_eq!(c.ll_ids_offset(2, 4) % 16, 0);
        assert_eq!(c.ll_token_slot_offset(2, 4), c.recv_slot_offset(0, 2, 4));
        assert_eq!(c.ll_partial_slot_offset(2, 4), c.comb_slot_offset(4, 4));
        // High throughput, 2 channels.
        // SAFETY: as above.
        let h = unsafe { MoeContext::new_high_throughput(comm, WindowDesc::NONE, 6, 7, 2, 5, 2, 2) };
        assert!(h.high_throughput() && !c.high_throughput());
        assert_eq!(h.ht_recv_slot_offset(2, 4) + 16, h.ht_send_slot_offset(0, 0));
        assert_eq!(h.ht_send_slot_offset(2, 4) + 16, h.ht_meta_offset(0, 0));
        assert_eq!(h.ht_meta_offset(2, 4) + 16, h.ht_send_meta_offset(0, 0));
        assert_eq!(h.ht_send_meta_offset(2, 4) + 16, h.ht_dispatch_word_offset(0, 0));
        assert_eq!(h.ht_dispatch_word_offset(2, 1) + 8, h.ht_combine_word_offset(0, 0));
        assert_eq!(h.ht_combine_word_offset(2, 1) + 8, h.ht_dispatch_pos_offset(0, 0));
        assert_eq!(h.ht_dispatch_pos_offset(2, 1) + 8, MoeContext::window_bytes_ht(3, 2, 5, 16, 2).unwrap());
    }
}
