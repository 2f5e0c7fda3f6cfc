//! MoE expert-parallel dispatch and combine, callable from a kernel
//! (low-latency mode, DeepEP's "low latency" kernels and NCCL EP's shape;
//! the high-throughput mode is [`ht`]).
//!
//! An expert-parallel group ([`MoeContext`], made by the host:
//! `devcomm::moe::EpGroup`) spreads `E` experts over the `N` ranks of the
//! world, `L = E / N` per rank (expert `e` lives on rank `e / L` as local
//! expert `e % L`). Each rank routes up to `M` tokens of `hidden` elements
//! to `top_k` experts each.
//!
//! **Dispatch** sends every token to the ranks of the experts its top-k
//! names. To an LSA peer (NVLink stores) a token goes **once**, however
//! many of the peer's experts it names ([`dispatch_send_token`]): into
//! slot `t` of the peer's token slots for this source, followed by a
//! header with the token's expert ids and gate weights and a word `(seq << 32) | 1`
//! (released after the bytes; slots past the source's token count get a
//! word `seq << 32` and no ids): the receiver finds each expert's tokens
//! by their ids. To a rank outside the LSA team a token goes per expert,
//! straight into per-(local expert, source rank) slots by GIN puts (from
//! a staging copy in the sender's own window), followed by one word
//! `(seq << 32) | tokens` put with a strong signal
//! ([`dispatch_send_expert`], which also gives every top-k entry its
//! position among its expert's tokens, for a per-expert combine). The
//! receiver waits, per local expert, for every LSA source's headers and
//! every GIN source's word ([`dispatch_recv_expert`]: the "hook" that
//! starts an expert as soon as its tokens are in) and packs the expert's
//! tokens, in (source rank, source token) order, into `[L][N * M][hidden]`,
//! recording each LSA token's row in its header. A kernel that takes all
//! local experts at once can instead wait once ([`dispatch_wait_lsa`]),
//! count every expert's rows ([`dispatch_count_expert`]), and copy each
//! LSA token once to all its rows ([`dispatch_pack_token`]) after a grid
//! barrier: the copies then spread evenly over the grid however unevenly
//! the experts are loaded. A group whose ranks are all in the LSA team can
//! receive **streamed** instead ([`lsa`]: each source's counts per expert
//! sent up front and each token's positions in its header, so any warp
//! packs any token as soon as its own slot is in, with no wait for the
//! others and no scan; the library's kernel for such groups). (Sending once per peer
//! moves a quarter of the bytes over NVLink when a token's top-8 names
//! four experts of the peer, as with 256 experts on two ranks: the
//! per-expert sends of session 17 took 50 of the 66 µs of a 128-token
//! dispatch on 2 × H200.)
//!
//! **Combine** has two forms ([`CombineForm`]). Per expert
//! ([`combine_send_expert`]): each expert's outputs go back the way its
//! tokens came, into per-(global expert, position) slots of the token's
//! own rank, with one flag word per expert; an expert's outputs can leave
//! as soon as it is done. Per rank (the library's kernels): each LSA rank
//! sends one gate-weighted partial sum per token over its experts
//! ([`combine_send_token`], a token crossing NVLink once per rank, with a
//! word per token), ranks outside the LSA team per expert. The token's
//! rank waits ([`combine_wait`]) and sums the outputs (or partials) of
//! each token in top-k order with f32 arithmetic ([`combine_reduce`]),
//! rounding once. When every rank is in the LSA team, a rank can instead
//! add up each of its tokens as soon as that token's partials are in
//! ([`combine_recv_token`], the library's kernel): no wait for the last
//! token of all, no second pass over the grid.
//!
//! Work split: coops of whole warps throughout (a [`Warp`](crate::coop::Warp),
//! a [`WarpSpan`](crate::coop::WarpSpan), a [`Cta`] of a
//! multiple of 32 threads; the library's kernels: CTAs). Every token slot
//! `t < max_tokens` must be sent by exactly one coop on every rank
//! ([`dispatch_send_token`], also past the token count: the receivers wait
//! for every header), and every expert by exactly one coop
//! ([`dispatch_send_expert`], also with no tokens: GIN receivers wait for
//! its word); one coop per local expert on the receiving side. A kernel
//! whose coops wait for other ranks' coops must be launched co-resident.
//!
//! Ordering between calls: a dispatch's slots are reused by the next
//! dispatch, so every dispatch is followed by its combine on every rank
//! before the next dispatch (each rank's combine waits for every expert's
//! flag, which its rank sends only after it has packed that dispatch's
//! tokens). `seq` numbers the dispatches from 1, the same on every rank;
//! a combine passes its dispatch's `seq`.

pub mod ht;
pub mod lsa;

pub use crate::abi::moe::{MoeArgs, MoeContext, MoeHtArgs, STAGES};

use core::mem::MaybeUninit;

use crate::arch::{self, lane_id, WARP_SIZE};
use crate::atomic::{self, Order, Scope};
use crate::coll::pack::each_lane;
use crate::coll::{Bf16, Element, Fp8E4M3};
use crate::coop::{Coop, Cta, ThreadCoop};
use crate::error::{DeviceError, ErrorCode};
use crate::gin::{Gin, GinError, LocalAction, RemoteAction};
use crate::lsa::ops::{copy_strided, copy_strided_by, CopyAhead};
use crate::wait::{self, Deadline, WaitError};

/// The position a token's top-k entry gets when it names no expert.
pub const NO_POS: u32 = u32::MAX;

/// Bytes of dynamic shared memory the host launches the MoE kernels with:
/// room for one [`MoeContext`], which each CTA's leader copies there and
/// every thread reads (a reference into the kernel's parameter that reaches
/// a function compiled out of line would make every thread copy the whole
/// parameter to local memory at the kernel's entry).
pub const CONTEXT_SHARED_BYTES: u32 = (core::mem::size_of::<MoeContext>() as u32).next_multiple_of(16);

/// Why a dispatch or combine failed (the same on every thread of the coop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeError {
    /// A top-k entry names an expert id not below the expert count.
    BadExpert,
    /// Count or flag words out of step across ranks.
    OutOfStep,
    /// Shapes the context does not hold (more tokens than the maximum).
    BadArgument,
    /// A wait failed (timeout, abort).
    Wait(WaitError),
    /// A GIN operation failed.
    Gin(GinError),
}

impl From<WaitError> for MoeError {
    fn from(e: WaitError) -> Self {
        MoeError::Wait(e)
    }
}

impl From<GinError> for MoeError {
    fn from(e: GinError) -> Self {
        MoeError::Gin(e)
    }
}

impl ErrorCode for MoeError {
    fn code(self) -> u32 {
        match self {
            MoeError::BadExpert => DeviceError::MoeBadExpert as u32,
            MoeError::OutOfStep => DeviceError::MoeOutOfStep as u32,
            MoeError::BadArgument => DeviceError::MoeBadArgument as u32,
            MoeError::Wait(w) => w.code(),
            MoeError::Gin(g) => g.code(),
        }
    }
    fn from_code(code: u32) -> Self {
        match DeviceError::from_code(code) {
            Some(DeviceError::MoeBadExpert) => MoeError::BadExpert,
            Some(DeviceError::MoeOutOfStep) => MoeError::OutOfStep,
            Some(DeviceError::MoeBadArgument) => MoeError::BadArgument,
            Some(DeviceError::Timeout) | Some(DeviceError::Aborted) => MoeError::Wait(WaitError::from_code(code)),
            _ => MoeError::Gin(GinError::from_code(code)),
        }
    }
}

impl MoeError {
    /// The non-zero code kernels report.
    pub fn code(self) -> u32 {
        ErrorCode::code(self)
    }
}

/// The word that follows a source's tokens (or an expert's outputs).
#[inline(always)]
pub(crate) const fn word(seq: u32, count: u32) -> u64 {
    ((seq as u64) << 32) | count as u64
}

/// Address of byte `offset` of world rank `rank`'s copy of the group's
/// window, or null when `rank` is not an LSA peer.
#[inline(always)]
pub(crate) fn peer_ptr(ctx: &MoeContext, rank: u32, offset: u64) -> *mut u8 {
    let c = ctx.comm();
    ctx.window().peer_ptr::<u8>(&c.world(), &c.lsa(), c.rank(), offset, rank)
}

/// Address of byte `offset` of the caller's own copy of the window.
#[inline(always)]
pub(crate) fn local_ptr(ctx: &MoeContext, offset: u64) -> *mut u8 {
    ctx.window().local_ptr::<u8>(offset)
}

/// Whether world rank `rank` is reached over LSA (NVLink stores) from
/// this rank (itself included); the other ranks over GIN.
#[inline(always)]
pub fn is_lsa(ctx: &MoeContext, rank: u32) -> bool {
    !peer_ptr(ctx, rank, 0).is_null()
}

/// Ranks of the world outside the caller's LSA team.
#[inline(always)]
pub fn gin_ranks(ctx: &MoeContext) -> u32 {
    ctx.comm().nranks() - ctx.comm().lsa_size()
}

/// Inclusive prefix sum of `v` over the warp's lanes.
#[inline(always)]
pub(crate) fn warp_scan(v: u32) -> u32 {
    let lane = lane_id();
    let mut x = v;
    let mut d = 1;
    while d < WARP_SIZE {
        let y = arch::shfl(u32::MAX, x as u64, lane.saturating_sub(d)) as u32;
        if lane >= d {
            x += y;
        }
        d *= 2;
    }
    x
}

/// A step of a dispatch (anywhere in its kernel: the sends check the
/// routing themselves), by any set of threads (`t` of `nt`, e.g.
/// a whole grid): copies `topk_idx` and `topk_weights` (`num_tokens *
/// top_k` each) to the handle's `handle_idx`, `handle_weights`, and sets
/// the position of every entry that names no expert (negative: masked; not
/// below the expert count: an error) to [`NO_POS`]. The positions of the
/// other entries are [`dispatch_send_expert`]'s. Returns
/// `Err(MoeError::BadExpert)` to a thread that saw an id too large.
///
/// # Safety
/// The pointers hold `num_tokens * top_k` elements of device memory; the
/// `nt` threads use `t = 0..nt` once each.
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_prepare(
    t: usize,
    nt: usize,
    ctx: &MoeContext,
    topk_idx: *const i32,
    topk_weights: *const f32,
    num_tokens: u32,
    pos: *mut u32,
    handle_idx: *mut i32,
    handle_weights: *mut f32,
) -> Result<(), MoeError> {
    let total = num_tokens as usize * ctx.top_k() as usize;
    let mut bad = false;
    let mut i = t;
    while i < total {
        // SAFETY: `i < num_tokens * top_k`: inside every buffer (the contract);
        // entry `i` is this thread's alone.
        unsafe {
            let e = *topk_idx.add(i);
            *handle_idx.add(i) = e;
            *handle_weights.add(i) = *topk_weights.add(i);
            if e < 0 || e as u32 >= ctx.num_experts() {
                *pos.add(i) = NO_POS;
                bad |= e >= 0;
            }
        }
        i += nt.max(1);
    }
    if bad {
        Err(MoeError::BadExpert)
    } else {
        Ok(())
    }
}

/// Distinct LSA ranks a low-latency dispatch gathers a token's
/// destinations for before its copy ([`dispatch_send_token`]; a token
/// naming more goes through the per-rank lookup).
const MAX_DESTS: usize = 8;

/// 16-byte vectors in flight per thread when a coop copies a token
/// ([`copy_strided_by`], [`CopyAhead`]); both modes.
pub(crate) const COPY_UNROLL: usize = 8;

/// Whether the `k` expert ids at `idx` name one of experts `lo..lo + l`.
/// Plain loads, which the hardware overlaps and L1 keeps for the lanes
/// that read a routing row's other ids (volatile ones went to L2 one
/// after another: the high-throughput pack's scans were most of its
/// dispatch): `idx` is the caller's routing, or a received row or header
/// read after the wait's acquire.
///
/// # Safety
/// `idx` holds `k` `i32`s, not written while this reads them.
#[inline(always)]
pub(crate) unsafe fn names(idx: *const i32, k: usize, lo: u32, l: u32) -> bool {
    let mut hit = false;
    for j in 0..k {
        // SAFETY: `j < k`: the contract.
        let e = unsafe { *idx.add(j) };
        hit |= is_one_of(e, lo, l);
    }
    hit
}

/// Whether expert id `e` is one of experts `lo..lo + l` (a negative id,
/// masked, is none).
#[inline(always)]
pub(crate) fn is_one_of(e: i32, lo: u32, l: u32) -> bool {
    e >= 0 && (e as u32).wrapping_sub(lo) < l
}

/// Groups of 32 tokens a warp scans at once: every expert id of the
/// groups is loaded before any is compared, so the loads overlap (one
/// group after another cost a round trip each).
pub(crate) const SCAN_GROUPS: u32 = 4;

/// Bit `g` for `g < SCAN_GROUPS`: whether the calling lane's token of
/// group `g0 + g` (token `(g0 + g) * 32 + lane`, below `count`) names one
/// of experts `lo..lo + l` among its `k` ids, the first `k` of the
/// `stride` `i32`s of its row at `idx + token * stride` (plain loads).
///
/// # Safety
/// `idx` holds `count` rows of `stride >= k` `i32`s, not written while
/// this reads them.
#[inline(always)]
pub(crate) unsafe fn routing_hits(
    idx: *const i32,
    stride: usize,
    k: usize,
    count: u32,
    lo: u32,
    l: u32,
    g0: u32,
) -> u32 {
    let lane = lane_id();
    let token = |g: usize| (g0 + g as u32) * WARP_SIZE + lane;
    let mut bits = 0u32;
    if k <= 8 {
        let mut v = [[-1i32; 8]; SCAN_GROUPS as usize];
        each_lane!(SCAN_GROUPS as usize, |g| {
            let t = token(g);
            if t < count {
                each_lane!(8, |j| {
                    if j < k {
                        // SAFETY: `t < count`, `j < k <= stride`: inside `idx`.
                        v[g][j] = unsafe { *idx.add(t as usize * stride + j) };
                    }
                });
            }
        });
        each_lane!(SCAN_GROUPS as usize, |g| {
            let mut hit = false;
            each_lane!(8, |j| {
                hit |= is_one_of(v[g][j], lo, l);
            });
            bits |= (hit as u32) << g;
        });
    } else {
        for g in 0..SCAN_GROUPS as usize {
            let t = token(g);
            // SAFETY: `t < count`: token `t`'s `k` ids.
            if t < count && unsafe { names(idx.add(t as usize * stride), k, lo, l) } {
                bits |= 1 << g;
            }
        }
    }
    bits
}

/// LSA source `src`'s token headers and slots in this rank's window,
/// as addresses and strides held in registers: the scan and pack loops
/// below read no context field (the context lives in shared memory, and
/// every inline-asm store of a copy makes the compiler load its fields
/// again; with them the per-expert pack ran at twice the time of the same
/// loop in plain CUDA, `benches/results/2026-11-27-h200x2-moe-ll-floor.md`).
/// Header and slot `t < max_tokens` lie at `t` strides from the first:
/// the layout's offsets are linear in `t`, and a live context's window
/// holds the whole layout ([`MoeContext::new`]'s contract), so these
/// addresses are the ones `local_ptr` would give, without its range check.
#[derive(Clone, Copy)]
struct LsaSource {
    /// Header 0's expert ids.
    ids: *mut u8,
    /// Bytes from one header to the next.
    header_bytes: usize,
    /// Token slot 0.
    slot: *const u8,
    /// Bytes from one token slot to the next.
    slot_bytes: usize,
    /// Ids per header ([`MoeContext::ll_header_ids`]).
    per_header: usize,
    /// Token slots ([`MoeContext::max_tokens`]).
    tokens: u32,
}

impl LsaSource {
    #[inline(always)]
    fn new(ctx: &MoeContext, src: u32) -> Self {
        LsaSource {
            ids: local_ptr(ctx, ctx.ll_ids_offset(src, 0)),
            header_bytes: ctx.ll_meta_bytes() as usize,
            slot: local_ptr(ctx, ctx.ll_token_slot_offset(src, 0)),
            slot_bytes: ctx.slot_bytes() as usize,
            per_header: ctx.ll_header_ids() as usize,
            tokens: ctx.max_tokens(),
        }
    }

    /// Token `t`'s expert ids (then as many weights, rows and positions).
    #[inline(always)]
    fn ids_of(&self, t: u32) -> *mut u8 {
        self.ids.wrapping_add(t as usize * self.header_bytes)
    }

    /// Token `t`'s slot.
    #[inline(always)]
    fn slot_of(&self, t: u32) -> *const u8 {
        self.slot.wrapping_add(t as usize * self.slot_bytes)
    }
}

/// [`routing_hits`] over an LSA source's token headers in this rank's
/// window (ids from byte 16, [`MoeContext::ll_header_ids`] of them, -1
/// past `top_k`), with 16-byte loads.
///
/// # Safety
/// `h` is of a live context; the headers of this dispatch are in (after
/// the wait's acquire), not written while this reads them.
#[inline(always)]
unsafe fn header_hits(h: &LsaSource, e: u32, g0: u32) -> u32 {
    let (m, ids) = (h.tokens, h.per_header);
    let lane = lane_id();
    let token = |g: usize| (g0 + g as u32) * WARP_SIZE + lane;
    let mut bits = 0u32;
    if ids <= 8 {
        let mut v = [[[u32::MAX; 4]; 2]; SCAN_GROUPS as usize];
        each_lane!(SCAN_GROUPS as usize, |g| {
            let t = token(g);
            if t < m {
                each_lane!(2, |q| {
                    if q * 4 < ids {
                        // SAFETY: vector `q` of header `t < max_tokens`'s
                        // ids, 16-byte aligned (headers are multiples of 16
                        // bytes from a 16-byte aligned area).
                        v[g][q] = unsafe { arch::load16(h.ids_of(t).add(16 * q)) };
                    }
                });
            }
        });
        each_lane!(SCAN_GROUPS as usize, |g| {
            let mut hit = false;
            each_lane!(2, |q| {
                each_lane!(4, |j| {
                    hit |= v[g][q][j] == e;
                });
            });
            bits |= (hit as u32) << g;
        });
    } else {
        for g in 0..SCAN_GROUPS as usize {
            let t = token(g);
            // SAFETY: header `t < max_tokens`'s `ids` ids.
            if t < m && unsafe { names(h.ids_of(t) as *const i32, ids, e, 1) } {
                bits |= 1 << g;
            }
        }
    }
    bits
}

/// Sends token slot `t` of this rank to every LSA rank (every thread of
/// `coop` calls it; the coop is whole warps): when `t < num_tokens`, the
/// token goes once to each LSA rank whose experts its top-k names (fp8
/// dispatch: quantized), into that rank's slot
/// [`MoeContext::ll_token_slot_offset`]`(me, t)`; then every LSA rank gets
/// the slot's header (the token's expert ids and gate weights, or none
/// past `num_tokens`) and its word, released after the bytes. Ranks
/// outside the LSA team get their tokens from [`dispatch_send_expert`].
///
/// # Safety
/// `ctx` live; `x` holds `num_tokens` tokens of
/// [`MoeContext::token_bytes`], `topk_idx` and `topk_weights` `num_tokens *
/// top_k` entries; every thread of the coop calls with the same
/// arguments; no other coop sends slot `t` in this dispatch; the previous
/// dispatch's combine is done on every rank (see the [module docs](self)).
#[allow(clippy::too_many_arguments)]
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
    // SAFETY: the contract.
    unsafe { send_token::<C, true, false>(coop, ctx, t, x, topk_idx, topk_weights, num_tokens, seq) }
}

/// [`dispatch_send_token`], with the fp8 quantisation compiled in only
/// when `QUANT` ([`lsa::dispatch_send_token`] leaves it out: the caller
/// checked that the context does not quantize), and with `POS` each
/// entry's position among this rank's tokens for its expert written to
/// the header's positions on the expert's rank (the streamed receive,
/// [`lsa::dispatch_recv_token`]; warp `j % W` of the coop's `W` counts
/// for entry `j`).
///
/// # Safety
/// As for [`dispatch_send_token`]; `QUANT` or the context's dispatch is
/// not fp8.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn send_token<C: Coop, const QUANT: bool, const POS: bool>(
    coop: &C,
    ctx: &MoeContext,
    t: u32,
    x: *const u8,
    topk_idx: *const i32,
    topk_weights: *const f32,
    num_tokens: u32,
    seq: u32,
) -> Result<(), MoeError> {
    let (k, m, e_all) = (ctx.top_k() as usize, ctx.max_tokens(), ctx.num_experts());
    if num_tokens > m || t >= m || coop.size() % WARP_SIZE != 0 {
        return Err(MoeError::BadArgument);
    }
    let comm = ctx.comm();
    let (me, n, l) = (comm.rank(), comm.nranks(), ctx.local_experts().max(1));
    let token = t < num_tokens;
    let idx = topk_idx.wrapping_add(t as usize * k);
    // Whether the token names an expert of rank `r` (an LSA rank).
    let bound = |r: u32| -> Option<*mut u8> {
        let mut hit = false;
        if token {
            for j in 0..k {
                // SAFETY: `t < num_tokens`, `j < top_k`: inside `topk_idx`.
                let e = unsafe { *idx.add(j) };
                hit |= e >= 0 && (e as u32) < e_all && e as u32 / l == r;
            }
        }
        let p = peer_ptr(ctx, r, ctx.ll_token_slot_offset(me, t));
        (hit && !p.is_null()).then_some(p)
    };
    // The same destinations gathered once, from the token's ids (up to
    // `MAX_DESTS` distinct ranks; more, or ranks from 64 on, fall back to
    // `bound`): the copy's stores then read no routing entry and no
    // context field per round (each inline-asm store makes the compiler
    // load them again). The ranks first, as a mask from ids loaded at once
    // (up to 8), then one peer lookup per rank: a loop over the ids that
    // waited for each load, division and peer lookup in turn held 13 % of
    // the one-rank lean dispatch's warp samples on an H200 (session 36).
    let mut dests = [core::ptr::null_mut::<u8>(); MAX_DESTS];
    let mut found = 0usize;
    let mut overflow = false;
    if token {
        let (mut ranks, mut far) = (0u64, false);
        let mut name = |e: i32| {
            if is_one_of(e, 0, e_all) {
                let r = e as u32 / l;
                if r < 64 {
                    ranks |= 1 << r;
                } else {
                    far = true;
                }
            }
        };
        if k <= 8 {
            let mut v = [-1i32; 8];
            each_lane!(8, |j| {
                if j < k {
                    // SAFETY: `t < num_tokens`, `j < top_k`: inside `topk_idx`.
                    v[j] = unsafe { *idx.add(j) };
                }
            });
            each_lane!(8, |j| {
                name(v[j]);
            });
        } else {
            for j in 0..k {
                // SAFETY: as above.
                name(unsafe { *idx.add(j) });
            }
        }
        let off = ctx.ll_token_slot_offset(me, t);
        overflow = far;
        while ranks != 0 {
            let r = ranks.trailing_zeros();
            ranks &= ranks - 1;
            let p = peer_ptr(ctx, r, off);
            if p.is_null() {
                continue;
            }
            if found == MAX_DESTS {
                overflow = true;
            } else {
                dests[found] = p;
                found += 1;
            }
        }
    }
    let row = ctx.token_bytes() as usize;
    if token {
        // SAFETY: token `t < num_tokens` of `x`; each destination is slot
        // `(0, me, t)` of an LSA rank's window (`slot_bytes >=
        // dispatch_bytes`), this coop's alone in this dispatch.
        unsafe {
            let src = x.add(t as usize * row);
            if QUANT && ctx.fp8_dispatch() {
                let (wi, nw) = (coop.thread_rank() / WARP_SIZE, (coop.size() / WARP_SIZE).max(1));
                for r in 0..n {
                    if let Some(d) = bound(r) {
                        quantize_row(ctx, d, src, wi, nw);
                    }
                }
            } else {
                let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
                let copy = CopyAhead::<COPY_UNROLL>::load(tr, nt, src, row);
                if POS {
                    // While the token's first vectors load.
                    send_positions(coop, ctx, t, topk_idx);
                }
                // One call site (each is a whole inlined copy loop).
                let m = if overflow { n as usize } else { found };
                copy.store(m, |j| if overflow { bound(j as u32) } else { dests.get(j).copied() });
            }
        }
    }
    // The header's entries, thread `j` entry `j` (id and weight) on every
    // LSA rank.
    let (j, ids) = (coop.thread_rank() as usize, ctx.ll_header_ids() as usize);
    if j < ids {
        let (e, w) = if token && j < k {
            // SAFETY: `t < num_tokens`, `j < top_k`: inside the routing.
            unsafe { (*idx.add(j), *topk_weights.add(t as usize * k + j)) }
        } else {
            (-1, 0.0)
        };
        for r in 0..n {
            let h = peer_ptr(ctx, r, ctx.ll_ids_offset(me, t));
            if !h.is_null() {
                // SAFETY: id and weight `j < I` of header `(me, t)` in LSA
                // rank `r`'s window, read by `r` only after the word below.
                unsafe {
                    arch::store_volatile((h as *mut i32).add(j), e);
                    arch::store_volatile((h as *mut f32).add(ids + j), w);
                }
            }
        }
    }
    // The coop's stores, then the leader's release at system scope
    // (cumulative over the stores the barrier ordered before it).
    coop.sync();
    if coop.is_leader() {
        // One fence for every rank's word: a release of each (the fence
        // then relaxed system-scope stores), not one fence per rank.
        atomic::fence_acq_rel(Scope::Sys);
        for r in 0..n {
            let h = peer_ptr(ctx, r, ctx.ll_meta_offset(me, t));
            if !h.is_null() {
                // SAFETY: the header's word, written only atomically.
                unsafe { atomic::store_relaxed(h as *mut u64, word(seq, token as u32), Scope::Sys) };
            }
        }
    }
    Ok(())
}

/// [`send_token`]'s positions of token `t < num_tokens` (the streamed
/// receive): warp `j % W` of the coop's `W` counts the tokens before `t`
/// naming entry `j`'s expert and its lane 0 stores the count in position
/// `j` of header `(me, t)` on the expert's rank (an LSA rank; others get
/// none).
///
/// # Safety
/// As for [`send_token`], and `t < num_tokens`; before the coop's barrier
/// and release of the header's word.
#[inline(always)]
unsafe fn send_positions<C: Coop>(coop: &C, ctx: &MoeContext, t: u32, topk_idx: *const i32) {
    let (k, e_all, ids) = (ctx.top_k() as usize, ctx.num_experts(), ctx.ll_header_ids() as usize);
    let (me, l) = (ctx.comm().rank(), ctx.local_experts().max(1));
    let (mut j, nw) = ((coop.thread_rank() / WARP_SIZE) as usize, (coop.size() / WARP_SIZE).max(1) as usize);
    while j < k {
        // SAFETY: `t < num_tokens`, `j < top_k`: inside `topk_idx`.
        let e = unsafe { *topk_idx.add(t as usize * k + j) };
        if e >= 0 && (e as u32) < e_all {
            // SAFETY: the first `t < num_tokens` tokens of the routing.
            let p = unsafe { tokens_naming(topk_idx, k, t, e as u32) };
            let h = peer_ptr(ctx, e as u32 / l, ctx.ll_ids_offset(me, t));
            if lane_id() == 0 && !h.is_null() {
                // SAFETY: position `j < I` of header `(me, t)` in the
                // expert's LSA rank's window, read by that rank only after
                // the header's word.
                unsafe { arch::store_volatile((h as *mut u32).add(3 * ids + j), p) };
            }
        }
        j += nw;
    }
}

/// How many of this rank's first `count` tokens name global expert `e`
/// among their `k` ids (a token naming it twice once), the same on every
/// lane of the calling warp: its lanes scan 32 tokens each a round, with
/// ballots.
///
/// # Safety
/// `idx` holds `count` rows of `k` `i32`s, not written while this reads
/// them; every lane of the warp calls with the same arguments.
#[inline(always)]
pub(crate) unsafe fn tokens_naming(idx: *const i32, k: usize, count: u32, e: u32) -> u32 {
    let groups = count.div_ceil(WARP_SIZE);
    let (mut c, mut g0) = (0u32, 0u32);
    while g0 < groups {
        // SAFETY: the contract.
        let bits = unsafe { routing_hits(idx, k, k, count, e, 1, g0) };
        each_lane!(SCAN_GROUPS as usize, |g| {
            c += arch::ballot(u32::MAX, (bits >> g) & 1 != 0).count_ones();
        });
        g0 += SCAN_GROUPS;
    }
    c
}

/// This rank's tokens routed to global expert `expert` (every thread of
/// `coop` calls it; the coop is whole warps: a [`Warp`](crate::coop::Warp), a
/// [`WarpSpan`](crate::coop::WarpSpan) or a [`Cta`] of a
/// multiple of 32 threads): scans `topk_idx` in token order (each warp
/// alike), gives the `i`-th token routed there position `i` (written to
/// `pos` for each of its top-k entries naming `expert`; a token that names
/// an expert twice goes once), and, when the expert's rank is outside the
/// LSA team, stages the tokens in this rank's combine slots of `expert`,
/// puts them into the rank's receive slots and publishes the count word
/// (an LSA rank gets the tokens from [`dispatch_send_token`]). Returns
/// the expert's token count.
///
/// # Safety
/// `ctx` live (see [`MoeContext::new`]); `x` holds `num_tokens` tokens of
/// [`MoeContext::token_bytes`], `topk_idx` and `pos` `num_tokens * top_k`
/// entries; `num_tokens <= max_tokens`; `expert < num_experts`; every
/// thread of the coop calls with the same arguments; no other coop sends
/// `expert` in this dispatch; the previous dispatch's combine is done on
/// every rank (see the [module docs](self)).
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_send_expert<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    expert: u32,
    x: *const u8,
    topk_idx: *const i32,
    num_tokens: u32,
    pos: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    let (k, m) = (ctx.top_k() as usize, ctx.max_tokens());
    if num_tokens > m || expert >= ctx.num_experts() {
        return Err(MoeError::BadArgument);
    }
    let comm = ctx.comm();
    let (me, l) = (comm.rank(), ctx.local_experts());
    let (Some(dest), Some(local)) = (expert.checked_div(l), expert.checked_rem(l)) else {
        return Err(MoeError::BadArgument);
    };
    let lsa = is_lsa(ctx, dest);
    let row = ctx.token_bytes() as usize;
    let fp8 = ctx.fp8_dispatch();
    let lane = lane_id();
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (wi, nw) = (coop.thread_rank() / WARP_SIZE, (coop.size() / WARP_SIZE).max(1));
    let mut base = 0u32;
    let groups = num_tokens.div_ceil(WARP_SIZE);
    let mut g0 = 0u32;
    while g0 < groups {
        // SAFETY: `topk_idx` holds `num_tokens * top_k` entries.
        let bits = unsafe { routing_hits(topk_idx, k, k, num_tokens, expert, 1, g0) };
        let mut gi = 0;
        while gi < SCAN_GROUPS && g0 + gi < groups {
            let c0 = (g0 + gi) * WARP_SIZE;
            let hit = (bits >> gi) & 1 != 0;
            let mask = arch::ballot(u32::MAX, hit);
            // The lanes before a lane: `(1 << lane) - 1` (lane < 32).
            let before = |l: u32| (mask & ((1u32 << l) - 1)).count_ones();
            if hit && wi == 0 {
                let (t, p) = (c0 + lane, base + before(lane));
                for j in 0..k {
                    let i = t as usize * k + j;
                    // SAFETY: `t < num_tokens` (a hit), `j < top_k`: inside
                    // `topk_idx` and `pos`; entry `i` names `expert`, whose
                    // coop this is alone (its first warp writes).
                    unsafe {
                        if *topk_idx.add(i) == expert as i32 {
                            *pos.add(i) = p;
                        }
                    }
                }
            }
            // Every hit's token, by the whole coop (GIN; LSA ranks get
            // theirs from `dispatch_send_token`).
            let mut rest = if lsa { 0 } else { mask };
            while rest != 0 {
                let sl = rest.trailing_zeros();
                let (tj, pj) = ((c0 + sl) as usize, base + before(sl));
                let dst = local_ptr(ctx, ctx.comb_slot_offset(expert, pj));
                // SAFETY: token `tj < num_tokens` of `x`; the slot holds
                // `slot_bytes >= dispatch_bytes` bytes (`pj < num_tokens <=
                // max_tokens`); the slot is this coop's alone in this dispatch.
                unsafe {
                    if fp8 {
                        quantize_row(ctx, dst, x.add(tj * row), wi, nw);
                    } else {
                        copy_strided_by::<COPY_UNROLL>(tr, nt, dst, x.add(tj * row), row)
                    }
                };
                rest &= rest - 1;
            }
            base += mask.count_ones();
            gi += 1;
        }
        g0 += SCAN_GROUPS;
    }
    if lsa {
        return Ok(base);
    }
    let w = word(seq, base);
    let r = (|| -> Result<(), MoeError> {
        let gin = Gin::new(comm, 0)?.with_given_release(Scope::Sys);
        coop.sync();
        if coop.is_leader() {
            atomic::fence_acq_rel(Scope::Sys);
        }
        let world = comm.world();
        let win = ctx.window();
        if base > 0 {
            let bytes = base as u64 * ctx.slot_bytes();
            let (dst, src) = (ctx.recv_slot_offset(local, me, 0), ctx.comb_slot_offset(expert, 0));
            // SAFETY: the group's window is in the GIN window table (the
            // context's contract); both ranges lie inside it.
            unsafe { gin.put(coop, &world, dest, &win, dst, &win, src, bytes, RemoteAction::None, LocalAction::None) }?;
        }
        let r = if coop.is_leader() {
            let action = RemoteAction::SignalInc { signal: local, strong: true };
            let off = ctx.recv_count_offset(local, me);
            // SAFETY: as above.
            unsafe { gin.put_value(&world, dest, &win, off, w, action, LocalAction::None) }
        } else {
            Ok(())
        };
        coop.agree(r)?;
        Ok(())
    })();
    coop.agree(r).map(|_| base)
}

/// Warp `wi` of `nw` (each whole) writes its share of bf16 token `src`
/// (`hidden` elements) to `dst` as fp8 e4m3: for each group of 128
/// elements `g = wi, wi + nw, ...`, `scale = max(amax, 1e-4) / 448` and `q
/// = fp8(x / scale)` (lane `i` its 4 elements), the scales after the
/// `hidden` data bytes (lane 0).
///
/// # Safety
/// `src` holds `hidden` bf16, 8-byte aligned; `dst` holds
/// [`MoeContext::dispatch_bytes`], 4-byte aligned; `hidden` a multiple of
/// 128; every lane calls.
#[inline(always)]
unsafe fn quantize_row(ctx: &MoeContext, dst: *mut u8, src: *const u8, wi: u32, nw: u32) {
    let h = ctx.hidden() as usize;
    let lane = lane_id() as usize;
    let mut g = wi as usize;
    while g < h / 128 {
        let at = g * 128 + lane * 4;
        // SAFETY: elements `at..at + 4 < hidden` of `src`, 8-byte aligned.
        let v = unsafe { arch::load_volatile(src.add(at * 2) as *const u64) };
        let x = [0, 1, 2, 3].map(|i| Bf16((v >> (16 * i)) as u16).to_f32());
        let amax = x.iter().fold(0.0f32, |m, v| {
            let a = if *v < 0.0 { -*v } else { *v };
            if a > m {
                a
            } else {
                m
            }
        });
        // Non-negative floats order as their bits.
        let amax = f32::from_bits(arch::sync_warp_max(u32::MAX, amax.to_bits()));
        let scale = (if amax > 1e-4 { amax } else { 1e-4 }) / 448.0;
        let mut q = 0u32;
        for (i, xi) in x.iter().enumerate() {
            q |= (Fp8E4M3::from_f32(*xi / scale).0 as u32) << (8 * i);
        }
        // SAFETY: bytes `at..at + 4` of the data part, 4-byte aligned.
        unsafe { arch::store_volatile(dst.add(at) as *mut u32, q) };
        if lane == 0 {
            // SAFETY: scale `g < hidden / 128` after the `hidden` data bytes.
            unsafe { arch::store_volatile(dst.add(h + 4 * g) as *mut f32, scale) };
        }
        g += nw as usize;
    }
}

/// For each token of LSA source `h` whose header names global expert
/// `e`, in token order: `f(i, t)` for the `i`-th such token, slot `t`.
/// Every lane of the calling warp calls it alike (and runs every `f`);
/// returns the count. Reads the headers with plain loads: after the
/// dispatch's wait ([`wait_headers`]).
///
/// # Safety
/// `h` an LSA source of a live context whose headers of this dispatch are in.
#[inline(always)]
unsafe fn lsa_tokens_of(h: &LsaSource, e: u32, mut f: impl FnMut(u32, u32)) -> u32 {
    let groups = h.tokens.div_ceil(WARP_SIZE);
    let mut base = 0u32;
    let mut g0 = 0u32;
    while g0 < groups {
        // SAFETY: the contract.
        let bits = unsafe { header_hits(h, e, g0) };
        let mut gi = 0;
        while gi < SCAN_GROUPS && g0 + gi < groups {
            let mut mask = arch::ballot(u32::MAX, (bits >> gi) & 1 != 0);
            while mask != 0 {
                f(base, (g0 + gi) * WARP_SIZE + mask.trailing_zeros());
                base += 1;
                mask &= mask - 1;
            }
            gi += 1;
        }
        g0 += SCAN_GROUPS;
    }
    base
}

/// Waits until every LSA source's token headers of dispatch `seq` are in
/// (every thread of `coop` watches some), then joins the coop: with a
/// barrier that orders memory (`coop.sync`), so every thread may read
/// every header after it (a warp's agreement, `redux.sync`, does not
/// order memory; the strict emulator caught the headers read by lanes
/// that had not acquired them).
///
/// # Safety
/// `ctx` live; every thread of `coop` calls it.
unsafe fn wait_headers<C: Coop>(coop: &C, ctx: &MoeContext, seq: u32) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, m) = (comm.nranks(), ctx.max_tokens());
    let r = (|| -> Result<(), MoeError> {
        let mut deadline = Deadline::new(&comm.abort());
        let mut i = coop.thread_rank();
        while i < n.saturating_mul(m) {
            let (s, t) = (i / m.max(1), i % m.max(1));
            if is_lsa(ctx, s) {
                let p = local_ptr(ctx, ctx.ll_meta_offset(s, t)) as *const u64;
                // SAFETY: this rank's header word, written only atomically.
                let w = unsafe { wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline) }?;
                if (w >> 32) as u32 != seq {
                    return Err(MoeError::OutOfStep);
                }
            }
            i += coop.size();
        }
        Ok(())
    })();
    let r = coop.agree(r);
    coop.sync();
    r
}

/// Waits until every LSA source's tokens of dispatch `seq` are in (their
/// token headers, [`dispatch_send_token`]): a step a kernel may take once
/// for all its local experts before their receive hooks, whose own waits
/// then pass at once (the library's kernel does, to time the wait apart).
///
/// # Safety
/// `ctx` live; every thread of `coop` calls it.
pub unsafe fn dispatch_wait_lsa<C: Coop>(coop: &C, ctx: &MoeContext, seq: u32) -> Result<(), MoeError> {
    // SAFETY: the contract.
    unsafe { wait_headers(coop, ctx, seq) }
}

/// Every GIN source's word for `local` (the leader waits for its signal).
///
/// # Safety
/// `ctx` live; every thread of `coop` calls it.
unsafe fn wait_gin<C: Coop>(coop: &C, ctx: &MoeContext, local: u32, seq: u32) -> Result<(), MoeError> {
    let r = (|| -> Result<(), MoeError> {
        let g = gin_ranks(ctx);
        if g > 0 && coop.is_leader() {
            Gin::new(ctx.comm(), 0)?.wait_signal(&ThreadCoop, local, seq as u64 * g as u64)?;
        }
        Ok(())
    })();
    coop.agree(r)
}

/// Records LSA source `s`'s token count `c` for local expert `local` in
/// its count word (one thread of the expert's coops, its leader: the
/// combine's per-expert sends read it).
#[inline(always)]
fn record_count(ctx: &MoeContext, local: u32, s: u32, seq: u32, c: u32) {
    let p = local_ptr(ctx, ctx.recv_count_offset(local, s)) as *mut u64;
    // SAFETY: this rank's count word for (`local`, `s`): an LSA source's
    // is this rank's own, written only here, atomically.
    unsafe { atomic::store_relaxed(p, word(seq, c), Scope::Gpu) };
}

/// Waits until every source's tokens for local expert `local` of this
/// dispatch are in (the per-expert receive hook: every LSA source's token
/// headers, and the GIN sources' words for `local`), records each LSA
/// source's count for `local` in its count word, and returns how many
/// tokens `local` got (all sources). Does not pack: source `s`'s tokens
/// for `local` lie in its token slots (LSA, [`MoeContext::ll_token_slot_offset`],
/// those whose header names the expert) or in the receive slots `(local,
/// s, 0..)` (GIN) until the next dispatch; [`dispatch_recv_expert`] packs
/// them. The coop is whole warps.
///
/// # Safety
/// `ctx` live; every thread of `coop` calls with the same arguments; no
/// other coop waits for `local` in this dispatch.
pub unsafe fn dispatch_wait_expert<C: Coop>(coop: &C, ctx: &MoeContext, local: u32, seq: u32) -> Result<u32, MoeError> {
    let comm = ctx.comm();
    let (n, me) = (comm.nranks(), comm.rank());
    if local >= ctx.local_experts() || coop.size() % WARP_SIZE != 0 {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the contract.
    unsafe { wait_headers(coop, ctx, seq) }?;
    // SAFETY: the contract.
    unsafe { wait_gin(coop, ctx, local, seq) }?;
    let e = me * ctx.local_experts() + local;
    let mut total = 0u32;
    let mut r = Ok(());
    for s in 0..n {
        if is_lsa(ctx, s) {
            // SAFETY: `s` is an LSA rank whose headers are in (waited above).
            let c = unsafe { lsa_tokens_of(&LsaSource::new(ctx, s), e, |_, _| {}) };
            if coop.is_leader() {
                record_count(ctx, local, s, seq, c);
            }
            total += c;
        } else {
            match recv_count(ctx, local, s, seq) {
                Ok(c) => total += c,
                Err(e) => r = Err(e),
            }
        }
    }
    let r = coop.agree(r.map(|_| total));
    // The LSA count words above, before any thread reads them.
    coop.sync();
    r
}

/// Source `s`'s token count for local expert `local` (its word, which
/// must carry `seq`).
#[inline(always)]
fn recv_count(ctx: &MoeContext, local: u32, s: u32, seq: u32) -> Result<u32, MoeError> {
    let p = local_ptr(ctx, ctx.recv_count_offset(local, s)) as *const u64;
    // SAFETY: this rank's count word, written only atomically.
    count_of(ctx, unsafe { atomic::load_acquire(p, Scope::Sys) }, seq)
}

/// The count a count word `w` holds for dispatch `seq`: `OutOfStep` when
/// it is another dispatch's or above the most tokens a source sends.
#[inline(always)]
pub(crate) fn count_of(ctx: &MoeContext, w: u64, seq: u32) -> Result<u32, MoeError> {
    if (w >> 32) as u32 != seq || (w as u32) > ctx.max_tokens() {
        return Err(MoeError::OutOfStep);
    }
    Ok(w as u32)
}

/// [`dispatch_wait_expert`], then packs local expert `local`'s tokens into
/// `out[local][..]` (rows of `hidden` elements, in source rank then source
/// token order; an LSA source's rows a warp each) and stores the total in
/// `out_count[local]`. Returns the total. With fp8 dispatch, `out` gets
/// rows of `hidden` fp8 bytes and `scales` the rows' `hidden / 128` f32
/// scales (same row numbers). Records each LSA token's row in its header
/// (for [`combine_send_token`]).
///
/// # Safety
/// As for [`dispatch_wait_expert`]; `out` holds `local_experts * nranks *
/// max_tokens` rows, `out_count` `local_experts` `u32`s, `scales` (fp8
/// dispatch only) as many rows of scales.
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_recv_expert<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    out: *mut u8,
    scales: *mut u8,
    out_count: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    if local >= ctx.local_experts() || coop.size() % WARP_SIZE != 0 {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the contract.
    unsafe { wait_headers(coop, ctx, seq) }?;
    // SAFETY: the contract; the coop waited for every LSA header just now.
    unsafe { dispatch_pack_expert(coop, ctx, local, out, scales, out_count, seq) }
}

/// [`dispatch_recv_expert`] for a coop that already waited for every LSA
/// source's tokens of this dispatch ([`dispatch_wait_lsa`] returned `Ok`
/// to it): waits for the GIN sources' words for `local` alone, then packs.
/// A kernel whose coops each take several local experts waits once
/// (every LSA header is each expert's wait) instead of once per expert.
///
/// # Safety
/// As for [`dispatch_recv_expert`], and this coop's [`dispatch_wait_lsa`]
/// for `seq` returned `Ok` (its threads read the headers it acquired).
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_pack_expert<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    out: *mut u8,
    scales: *mut u8,
    out_count: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    // SAFETY: the contract.
    unsafe { dispatch_pack_expert_part(coop, ctx, local, PackPart::WHOLE, out, scales, out_count, seq) }
}

/// [`dispatch_pack_expert`] shared by `part.count` coops (each calling
/// with its own `part.index`): this coop copies the rows `r` of local
/// expert `local` with `r % part.count == part.index` (and that share of
/// the GIN sources' bytes); every part returns the expert's whole count,
/// part 0 stores it in `out_count[local]` and the count words. A kernel
/// with more coops than local experts gives each expert several (with
/// 8 ranks of 32 experts each, a CTA per expert left three CTAs of four
/// idle while each copied its ~32 rows); the rows of every part are
/// visible to other coops after a grid barrier or the kernel's end.
/// `BadArgument` (on every thread) when `part.index >= part.count`.
///
/// # Safety
/// As for [`dispatch_pack_expert`]; the parts of one expert are called
/// with the same `part.count`, each index once.
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_pack_expert_part<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    part: PackPart,
    out: *mut u8,
    scales: *mut u8,
    out_count: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    // SAFETY: the contract.
    unsafe { pack_expert::<C, true, true>(coop, ctx, local, part, out, scales, out_count, seq, true) }
}

/// Which share of a local expert's rows a coop packs
/// ([`dispatch_pack_expert_part`]): the rows `r` with `r % count == index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackPart {
    /// This coop's share, `0..count`.
    pub index: u32,
    /// How many coops share the expert (at least 1).
    pub count: u32,
}

impl PackPart {
    /// The whole expert, one coop.
    pub const WHOLE: PackPart = PackPart { index: 0, count: 1 };

    /// Share `index` of `count` (checked by the pack: `index < count`).
    pub const fn new(index: u32, count: u32) -> Self {
        PackPart { index, count }
    }
}

/// [`dispatch_pack_expert`] without the LSA sources' token bytes: counts
/// local expert `local`'s tokens, records each LSA token's row in its
/// header, packs the GIN sources' tokens, stores the total in
/// `out_count[local]` and returns it; the LSA tokens are then copied a
/// token at a time by [`dispatch_pack_token`] (once to every row it
/// lands in), after every local expert was counted. A kernel whose
/// experts get uneven token counts spreads the copies over all its coops
/// this way, where a coop per expert copies that expert's rows alone.
///
/// # Safety
/// As for [`dispatch_pack_expert`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn dispatch_count_expert<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    out: *mut u8,
    scales: *mut u8,
    out_count: *mut u32,
    seq: u32,
) -> Result<u32, MoeError> {
    // SAFETY: the contract.
    unsafe { pack_expert::<C, true, true>(coop, ctx, local, PackPart::WHOLE, out, scales, out_count, seq, false) }
}

/// [`dispatch_pack_expert`] (`copy_lsa`) or [`dispatch_count_expert`].
/// `GIN`: the GIN sources' wait and copies are compiled in; `QUANT`: the
/// fp8 rows and scales are ([`lsa::dispatch_pack_expert`] leaves both out).
///
/// # Safety
/// As for [`dispatch_pack_expert`]; `GIN` or every rank is in the LSA
/// team; `QUANT` or the context's dispatch is not fp8.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn pack_expert<C: Coop, const GIN: bool, const QUANT: bool>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    part: PackPart,
    out: *mut u8,
    scales: *mut u8,
    out_count: *mut u32,
    seq: u32,
    copy_lsa: bool,
) -> Result<u32, MoeError> {
    let comm = ctx.comm();
    let (n, me) = (comm.nranks(), comm.rank());
    if local >= ctx.local_experts() || coop.size() % WARP_SIZE != 0 || part.index >= part.count {
        return coop.agree(Err(MoeError::BadArgument));
    }
    if GIN {
        // SAFETY: the contract.
        unsafe { wait_gin(coop, ctx, local, seq) }?;
    }
    let e = me * ctx.local_experts() + local;
    let (parts, pi) = (part.count as usize, part.index as usize);
    // This thread among all the parts' (the GIN sources' flat copies).
    let (t, nt) = (pi * coop.size() as usize + coop.thread_rank() as usize, parts * coop.size() as usize);
    // This warp among all the parts' warps, interleaved so that rows in
    // turn go to another part first (other CTAs: other SMs' bandwidth).
    let nw = parts * (coop.size() / WARP_SIZE).max(1) as usize;
    let wi = (coop.thread_rank() / WARP_SIZE) as usize * parts + pi;
    let leader = pi == 0 && coop.is_leader();
    let lane = lane_id() as usize;
    let row = ctx.token_bytes() as usize;
    let slot = ctx.slot_bytes() as usize;
    let fp8 = QUANT && ctx.fp8_dispatch();
    let (h, sc) = (ctx.hidden() as usize, ctx.hidden() as usize / 32);
    let ids = ctx.ll_header_ids() as usize;
    let first = local as usize * n as usize * ctx.max_tokens() as usize;
    let mut at = first;
    let mut r = Ok(());
    for s in 0..n {
        if !GIN || is_lsa(ctx, s) {
            // One pass over the headers counts the source's tokens for `e`
            // and packs them: row `r` by warp `r % nw` of all the parts'
            // warps (rows of every source spread over all of them), a warp
            // a row; its lanes record the row in the header's entries
            // naming `e`.
            let hs = LsaSource::new(ctx, s);
            // The warp of the next row (`r % nw`, counted on: no division per row).
            let mut owner = at % nw;
            // SAFETY: `s` is an LSA rank whose headers are in (the
            // contract); its tokens naming `e` go to rows `at..` (at most
            // `max_tokens`: inside `out`, the contract's sizes); header
            // `(s, tok)`'s rows are this rank's, entry `lane` naming `e`
            // this warp's alone (the row's owner among every part's warps).
            let c = unsafe {
                lsa_tokens_of(&hs, e, |i, tok| {
                    let r = at + i as usize;
                    let mine = owner == wi;
                    owner = if owner + 1 == nw { 0 } else { owner + 1 };
                    if !mine {
                        return;
                    }
                    let hdr = hs.ids_of(tok) as *mut i32;
                    if lane < ids && *hdr.add(lane) == e as i32 {
                        *(hdr as *mut u32).add(2 * ids + lane) = r as u32;
                    }
                    if !copy_lsa {
                        return;
                    }
                    let src = hs.slot_of(tok);
                    if fp8 {
                        copy_strided_by::<COPY_UNROLL>(lane, WARP_SIZE as usize, out.add(r * h), src, h);
                        copy_strided(lane, WARP_SIZE as usize, scales.add(r * sc), src.add(h), sc);
                    } else {
                        copy_strided_by::<COPY_UNROLL>(lane, WARP_SIZE as usize, out.add(r * row), src, row);
                    }
                })
            };
            if leader {
                record_count(ctx, local, s, seq, c);
            }
            at += c as usize;
            continue;
        }
        let c = match recv_count(ctx, local, s, seq) {
            Ok(c) => c as usize,
            Err(e) => {
                r = Err(e);
                continue;
            }
        };
        let src = local_ptr(ctx, ctx.recv_slot_offset(local, s, 0));
        if fp8 {
            for i in 0..c {
                // SAFETY: slot `i` holds `h` data bytes and `sc` bytes of
                // scales; rows `at + i` of `out` (`h` bytes) and `scales`
                // (`sc` bytes) are inside them (the contract).
                unsafe {
                    copy_strided(t, nt, out.add((at + i) * h), src.add(i * slot), h);
                    copy_strided(t, nt, scales.add((at + i) * sc), src.add(i * slot + h), sc);
                }
            }
        } else if slot == row {
            // SAFETY: `c <= max_tokens` slots from `src` in the window, `c`
            // rows from row `at` of `out` (`at + c <= (local + 1) * n * m`).
            unsafe { copy_strided_by::<COPY_UNROLL>(t, nt, out.add(at * row), src, c * row) };
        } else {
            for i in 0..c {
                // SAFETY: as above, row by row.
                unsafe { copy_strided(t, nt, out.add((at + i) * row), src.add(i * slot), row) };
            }
        }
        at += c;
    }
    let total = (at - first) as u32;
    let r = coop.agree(r.map(|_| total));
    if r.is_ok() && leader {
        // SAFETY: `local < local_experts` (checked above).
        unsafe { *out_count.add(local as usize) = total };
    }
    // The count words and rows above, before any thread of the coop reads
    // them (the combine's send).
    coop.sync();
    r
}

/// This rank's dispatch header word of LSA source `src`'s slot `t`
/// (`(seq << 32) | has_token`), or `Err(OutOfStep)` when it is not of
/// dispatch `seq`.
///
/// # Safety
/// `ctx` live, `src` a rank and `t < max_tokens`; the word was acquired
/// by this rank's dispatch wait.
unsafe fn header_word(ctx: &MoeContext, src: u32, t: u32, seq: u32) -> Result<u64, MoeError> {
    let hdr = local_ptr(ctx, ctx.ll_meta_offset(src, t));
    // SAFETY: this rank's header word `(src, t)`, written only atomically
    // (the contract).
    let w = unsafe { atomic::load_relaxed(hdr as *const u64, Scope::Gpu) };
    if (w >> 32) as u32 != seq {
        return Err(MoeError::OutOfStep);
    }
    Ok(w)
}

/// Copies LSA source `src`'s token slot `t` (when it holds a token of
/// this dispatch) into every packed row of a local expert it names, the
/// rows [`dispatch_count_expert`] recorded in its header: one load of each
/// vector, a store per row (an expert named twice gets the row once).
/// The coop is whole warps.
///
/// # Safety
/// `ctx` live; `out` and `scales` as for [`dispatch_pack_expert`];
/// [`dispatch_count_expert`] of dispatch `seq` returned for every local
/// expert on this rank and what it wrote is visible to this coop (a grid
/// barrier: [`dispatch_grid_sync`]); every thread of the coop calls with
/// the same arguments; no other coop copies (`src`, `t`) in this dispatch.
pub unsafe fn dispatch_pack_token<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    t: u32,
    out: *mut u8,
    scales: *mut u8,
    seq: u32,
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (me, l) = (comm.rank(), ctx.local_experts());
    if src >= comm.nranks() || t >= ctx.max_tokens() || !is_lsa(ctx, src) || coop.size() % WARP_SIZE != 0 {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the headers of dispatch `seq` are in (the contract).
    let w = match unsafe { header_word(ctx, src, t, seq) } {
        Ok(w) => w,
        Err(e) => return coop.agree(Err(e)),
    };
    if w & 1 == 0 {
        return Ok(());
    }
    let slot = local_ptr(ctx, ctx.ll_token_slot_offset(src, t)) as *const u8;
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let (row, h, sc) = (ctx.token_bytes() as usize, ctx.hidden() as usize, ctx.hidden() as usize / 32);
    let fp8 = ctx.fp8_dispatch();
    // The token's first vectors, loaded while the rows are looked up.
    // SAFETY: the slot holds the token (`row` bytes; fp8: fewer, unused).
    let ahead = unsafe { CopyAhead::<COPY_UNROLL>::load(tr, nt, slot, if fp8 { 0 } else { row }) };
    let (ids, rows_all) = (ctx.ll_header_ids() as usize, (l * comm.nranks() * ctx.max_tokens()) as usize);
    let at = local_ptr(ctx, ctx.ll_ids_offset(src, t)) as *const u32;
    // Entry `j`'s packed row, when it names a local expert that no entry
    // before it names.
    let dst = |j: usize| -> Option<usize> {
        // SAFETY: ids and rows `j < I` of the header: written before the
        // word this rank acquired, and by its counting (the contract).
        let (e, r) = unsafe { (*at.add(j), *at.add(2 * ids + j) as usize) };
        // SAFETY: as above, ids `i < j`.
        let first = (0..j).all(|i| unsafe { *at.add(i) } != e);
        (first && is_one_of(e as i32, me * l, l) && r < rows_all).then_some(r)
    };
    if fp8 {
        for j in 0..ids {
            if let Some(r) = dst(j) {
                // SAFETY: row `r < L * N * M` of `out` (`h` bytes) and of
                // `scales` (`sc` bytes); the slot holds both.
                unsafe {
                    copy_strided_by::<COPY_UNROLL>(tr, nt, out.add(r * h), slot, h);
                    copy_strided(tr, nt, scales.add(r * sc), slot.add(h), sc);
                }
            }
        }
    } else {
        // SAFETY: rows `r < L * N * M` of `out`, each this token's alone
        // (one per local expert it names); vector `i` of each this thread's.
        unsafe { ahead.store(ids, |j| dst(j).map(|r| out.add(r * row))) };
    }
    Ok(())
}

/// The library dispatch kernel's barrier between counting
/// ([`dispatch_count_expert`]) and copying ([`dispatch_pack_token`]):
/// the CTA's leader adds 1 to the grid word (a release at GPU scope,
/// after the CTA's barrier) and waits until the `B` CTAs of this launch
/// arrived (the count reaches the next multiple of `B`), then the CTA
/// syncs. Returns a wait's error (timeout, abort) on every thread.
///
/// # Safety
/// `ctx` live; every thread of the CTA calls it; every CTA of the grid
/// calls it exactly once per launch (also after an error: the count must
/// stay a multiple of `B` between launches), every launch on the group
/// with the same grid size, launched co-resident.
pub unsafe fn dispatch_grid_sync(cta: &Cta, ctx: &MoeContext) -> Result<(), MoeError> {
    let b = arch::grid_dim().x.max(1) as u64;
    cta.sync();
    let r = if cta.is_leader() {
        let p = local_ptr(ctx, ctx.ll_grid_word_offset()) as *mut u64;
        // SAFETY: this rank's grid word, only used atomically by this kernel.
        let old = unsafe { atomic::fetch_add(p, 1, Order::Release, Scope::Gpu) };
        let mut deadline = Deadline::new(&ctx.comm().abort());
        // SAFETY: as above.
        unsafe { wait::wait_ge_u64(p, (old / b + 1) * b, Scope::Gpu, &mut deadline) }
            .map(|_| ())
            .map_err(MoeError::from)
    } else {
        Ok(())
    };
    let r = cta.agree(r);
    cta.sync();
    r
}

/// How a low-latency combine brings the experts' outputs back to an LSA
/// rank's tokens (ranks outside the LSA team always get them per expert).
/// Every rank of a combine uses the same form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CombineForm {
    /// Every (token, expert) output goes back on its own
    /// ([`combine_send_expert`], one flag per expert): an expert's outputs
    /// can leave as soon as that expert is done (DeepEP's low-latency
    /// combine). `K` rows per token cross the link.
    PerExpert,
    /// Each LSA rank sends one gate-weighted partial sum per token over its
    /// experts ([`combine_send_token`], one word per token): a token
    /// crosses the link once per rank, as in the high-throughput mode, and
    /// the token's rank adds `N` partials instead of `K` outputs. Needs
    /// every local expert's outputs before the first send.
    PerRank,
}

/// Sends local expert `local`'s outputs back to their tokens' ranks: rows
/// of `expert_out[local][..]`, laid out as the dispatch packed them, go to
/// the combine slots of global expert `rank * L + local` on each source
/// rank (LSA stores, or a staging copy in this rank's receive slots and a
/// GIN put), followed by the expert's flag word on every source rank.
/// With [`CombineForm::PerRank`] only the sources outside the LSA team
/// get them (the LSA ones get [`combine_send_token`]'s partial sums).
///
/// # Safety
/// `ctx` live; `expert_out` holds `local_experts * nranks * max_tokens`
/// tokens; dispatch `seq`'s tokens of `local` were received and packed on
/// this rank ([`dispatch_recv_expert`]); every thread of `coop` calls with
/// the same arguments, and no other coop sends `local`.
pub unsafe fn combine_send_expert<C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    local: u32,
    expert_out: *const u8,
    form: CombineForm,
    seq: u32,
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, me) = (comm.nranks(), comm.rank());
    if local >= ctx.local_experts() {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let expert = me * ctx.local_experts() + local;
    let (t, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    let row = ctx.token_bytes() as usize;
    let slot = ctx.slot_bytes() as usize;
    let first_row = local as usize * n as usize * ctx.max_tokens() as usize;
    // Source `s`'s rows follow those of the sources before it. Every count
    // word is read before the flag to its source goes out: after that flag
    // the source may start its next dispatch and overwrite the word. So the
    // rows before the first source (`me + 1`) are summed first.
    let first = (me + 1) % n;
    let mut at = first_row;
    let mut before = Ok(());
    for q in 0..first {
        match recv_count(ctx, local, q, seq) {
            Ok(c) => at += c as usize,
            Err(e) => before = Err(e),
        }
    }
    coop.agree(before)?;
    let mut result = Ok(());
    for k in 0..n {
        // Start with the next rank, so ranks do not all write to rank 0 first.
        let s = (first + k) % n;
        if s == 0 {
            at = first_row;
        }
        let c = match coop.agree(recv_count(ctx, local, s, seq)) {
            Ok(c) => c,
            Err(e) => {
                result = Err(e);
                continue;
            }
        };
        let row_at = at;
        at += c as usize;
        let lsa = is_lsa(ctx, s);
        if lsa && form == CombineForm::PerRank {
            continue;
        }
        let dst = if lsa {
            peer_ptr(ctx, s, ctx.comb_slot_offset(expert, 0))
        } else {
            local_ptr(ctx, ctx.recv_slot_offset(local, s, 0))
        };
        // SAFETY: rows `row_at..row_at + c` of `expert_out` (`c <=
        // max_tokens`, the packing's layout); `c` slots at `dst` in the window.
        let src = unsafe { expert_out.add(row_at * row) };
        if slot == row {
            // SAFETY: as above.
            unsafe { copy_strided_by::<COPY_UNROLL>(t, nt, dst, src, c as usize * row) };
        } else {
            for i in 0..c as usize {
                // SAFETY: as above, row by row.
                unsafe { copy_strided(t, nt, dst.add(i * slot), src.add(i * row), row) };
            }
        }
        let w = word(seq, c);
        coop.sync();
        if lsa {
            if coop.is_leader() {
                let p = peer_ptr(ctx, s, ctx.comb_flag_offset(expert)) as *mut u64;
                // SAFETY: the flag word of `s`'s window, written only atomically.
                unsafe { atomic::store_release(p, w, Scope::Sys) };
            }
            continue;
        }
        let r = (|| -> Result<(), MoeError> {
            let gin = Gin::new(comm, 0)?.with_given_release(Scope::Sys);
            if coop.is_leader() {
                atomic::fence_acq_rel(Scope::Sys);
            }
            let (world, win) = (comm.world(), ctx.window());
            if c > 0 {
                let bytes = c as u64 * ctx.slot_bytes();
                let (d, sr) = (ctx.comb_slot_offset(expert, 0), ctx.recv_slot_offset(local, s, 0));
                // SAFETY: the window is in the GIN window table; both ranges inside it.
                unsafe { gin.put(coop, &world, s, &win, d, &win, sr, bytes, RemoteAction::None, LocalAction::None) }?;
            }
            let r = if coop.is_leader() {
                let action = RemoteAction::SignalInc { signal: ctx.local_experts(), strong: true };
                // SAFETY: as above.
                unsafe { gin.put_value(&world, s, &win, ctx.comb_flag_offset(expert), w, action, LocalAction::None) }
            } else {
                Ok(())
            };
            coop.agree(r)?;
            Ok(())
        })();
        if let Err(e) = coop.agree(r) {
            result = Err(e);
        }
    }
    coop.agree(result)
}

/// The partial sum of LSA source `src`'s token slot `t` over this rank's
/// experts ([`CombineForm::PerRank`]): when the slot's header names some of
/// this rank's experts, `sum over those entries j of w_j * y_j` (`y_j`
/// the expert's output row, found through the row the dispatch's packing
/// recorded in the header; f32 in top-k order, rounded once to `T`) goes
/// into `src`'s partial slot [`MoeContext::ll_partial_slot_offset`]`(me,
/// t)`; then, in every case, `src` gets the header's combine word
/// `(seq << 32) | sent` with a release. Every thread of `coop` calls it.
///
/// # Safety
/// `ctx` live, `T` of its element size; `expert_out` holds
/// `local_experts × nranks × max_tokens` rows laid out as the packing's
/// output; dispatch `seq` was received and packed on this rank for
/// **every** local expert ([`dispatch_recv_expert`],
/// [`dispatch_pack_expert`] or [`dispatch_count_expert`] returned, and
/// what they and the experts wrote is visible to this coop: a later
/// kernel, or a grid-wide barrier); every thread of the coop calls with the same
/// arguments; every (`src`, `t`) with `src` an LSA rank and `t <
/// max_tokens` is sent by one coop of this rank.
#[inline(always)]
pub unsafe fn combine_send_token<T: Element<Acc = f32>, C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    src: u32,
    t: u32,
    expert_out: *const u8,
    seq: u32,
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (me, l) = (comm.rank(), ctx.local_experts());
    if src >= comm.nranks() || t >= ctx.max_tokens() || !is_lsa(ctx, src) || size_of::<T>() as u32 != ctx.elem_size() {
        return coop.agree(Err(MoeError::BadArgument));
    }
    // SAFETY: the headers of dispatch `seq` are in (the contract).
    let w = match unsafe { header_word(ctx, src, t, seq) } {
        Ok(w) => w,
        Err(e) => return coop.agree(Err(e)),
    };
    let (ids, rows_all) = (ctx.ll_header_ids() as usize, (l * comm.nranks() * ctx.max_tokens()) as usize);
    let at = local_ptr(ctx, ctx.ll_ids_offset(src, t)) as *const u32;
    let row = ctx.token_bytes() as usize;
    // Entry `j` of the header: this rank's expert's output row and weight.
    let entry = |_: usize, j: usize| -> Option<(*const u8, f32)> {
        // SAFETY: id, weight and row `j < I` of the header (plain loads:
        // written before the dispatch word this rank acquired, and by its
        // own packing; not written until this word reaches `src`).
        let (e, wt, r) =
            unsafe { (*at.add(j) as i32, f32::from_bits(*at.add(ids + j)), *at.add(2 * ids + j) as usize) };
        if !is_one_of(e, me * l, l) || r >= rows_all {
            return None;
        }
        // SAFETY: row `r` of `expert_out` (below `L * N * M`, checked).
        Some((unsafe { expert_out.add(r * row) }, wt))
    };
    let token = w & 1 != 0;
    let sent = token && (0..ids).any(|j| entry(0, j).is_some());
    if sent {
        let dst = peer_ptr(ctx, src, ctx.ll_partial_slot_offset(me, t));
        let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
        let aligned = (expert_out as usize) % 16 == 0;
        // SAFETY: the partial slot is a whole slot of `src`'s window
        // (16-byte aligned), this coop's alone; the rows are `expert_out`'s.
        unsafe { weighted_rows::<T, 1, true>(tr, nt, 1, ctx.hidden() as usize, ids, |_| dst, aligned, entry) };
    }
    // The coop's stores, then the leader's release at system scope.
    coop.sync();
    if coop.is_leader() {
        let p = peer_ptr(ctx, src, ctx.ll_combine_word_offset(me, t)) as *mut u64;
        // SAFETY: the combine word of header `(me, t)` in `src`'s window,
        // written only atomically.
        unsafe { atomic::store_release(p, word(seq, sent as u32), Scope::Sys) };
    }
    Ok(())
}

/// Waits until every expert's outputs of dispatch `seq` are back on this
/// rank: with [`CombineForm::PerExpert`] every expert's flag word; with
/// [`CombineForm::PerRank`] every LSA rank's combine word of every token
/// slot, and the flags of the experts outside the LSA team. Every thread
/// of the coop may read every output after it.
///
/// # Safety
/// `ctx` live; every thread of `coop` calls it.
pub unsafe fn combine_wait<C: Coop>(coop: &C, ctx: &MoeContext, form: CombineForm, seq: u32) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, m, e_all, l) = (comm.nranks(), ctx.max_tokens(), ctx.num_experts(), ctx.local_experts());
    let (t, nt) = (coop.thread_rank(), coop.size());
    let per_rank = form == CombineForm::PerRank;
    let lsa_of = |e: u32| is_lsa(ctx, e.checked_div(l).unwrap_or(u32::MAX));
    let r = (|| -> Result<(), MoeError> {
        let mut deadline = Deadline::new(&comm.abort());
        if per_rank {
            let mut i = t;
            while i < n.saturating_mul(m) {
                let (d, tok) = (i / m.max(1), i % m.max(1));
                if is_lsa(ctx, d) {
                    let p = local_ptr(ctx, ctx.ll_combine_word_offset(d, tok)) as *const u64;
                    // SAFETY: this rank's combine word, written only atomically.
                    let w = unsafe { wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline) }?;
                    if (w >> 32) as u32 != seq {
                        return Err(MoeError::OutOfStep);
                    }
                }
                i += nt;
            }
        } else {
            let mut e = t;
            while e < e_all {
                if lsa_of(e) {
                    let p = local_ptr(ctx, ctx.comb_flag_offset(e)) as *const u64;
                    // SAFETY: this rank's flag word, written only atomically.
                    unsafe { wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline) }?;
                }
                e += nt;
            }
        }
        let g = gin_ranks(ctx);
        if g > 0 && coop.is_leader() {
            Gin::new(comm, 0)?.wait_signal(&ThreadCoop, l, seq as u64 * (g * l) as u64)?;
        }
        Ok(())
    })();
    coop.agree(r)?;
    let mut r = Ok(());
    let mut e = t;
    while e < e_all {
        if !(per_rank && lsa_of(e)) {
            let p = local_ptr(ctx, ctx.comb_flag_offset(e)) as *const u64;
            // SAFETY: as above.
            let w = unsafe { atomic::load_acquire(p, Scope::Sys) };
            if (w >> 32) as u32 != seq || w as u32 > ctx.max_tokens() {
                r = Err(MoeError::OutOfStep);
            }
        }
        e += nt;
    }
    let r = coop.agree(r);
    // Each thread acquired some words: a barrier that orders memory, so
    // every thread may read every output.
    coop.sync();
    r
}

/// `out[t][h] = sum of each token's expert outputs weighted by its gates`,
/// accumulated in f32 and rounded once, as `form` brought them back:
/// [`CombineForm::PerExpert`]: `sum over j < top_k of weights[t][j] *
/// y_j[h]` (`y_j` the output of expert `topk_idx[t][j]` for token `t`;
/// entries with [`NO_POS`] add nothing), in top-k order;
/// [`CombineForm::PerRank`]: the same entries in top-k order, except that
/// the entries on an LSA rank `d` add `d`'s partial sum once, at the first
/// of them. By any set of threads (`t` of `nt`) over the tokens' 16-byte
/// vectors (when a token is a whole number of them and `out` is 16-byte
/// aligned; else over single elements, with the same result). Call after
/// [`combine_wait`] (by every thread that reads).
///
/// # Safety
/// `ctx` live; `topk_idx`, `topk_weights` and `pos` are the dispatch's
/// (`num_tokens * top_k` each, `pos` filled by the dispatch), `out` holds
/// `num_tokens * hidden` elements of `T`, whose size is the context's
/// element size; the `nt` threads use `t = 0..nt` once each.
#[allow(clippy::too_many_arguments)]
pub unsafe fn combine_reduce<T: Element<Acc = f32>>(
    t: usize,
    nt: usize,
    ctx: &MoeContext,
    form: CombineForm,
    topk_idx: *const i32,
    topk_weights: *const f32,
    pos: *const u32,
    num_tokens: u32,
    out: *mut T,
) {
    let (k, h, l) = (ctx.top_k() as usize, ctx.hidden() as usize, ctx.local_experts());
    let size = core::mem::size_of::<T>();
    let valid = |e: i32| e >= 0 && (e as u32) < ctx.num_experts();
    // The expert and slot of entry `at` (None: it adds nothing).
    let entry = |tok: usize, j: usize| -> Option<(*const u8, f32)> {
        let at = tok * k + j;
        // SAFETY: `at < num_tokens * top_k` (callers): inside the buffers.
        let e = unsafe { *topk_idx.add(at) };
        if !valid(e) {
            return None;
        }
        let d = e as u32 / l.max(1);
        if form == CombineForm::PerRank && is_lsa(ctx, d) {
            // SAFETY: entries `tok * k..tok * k + j`: inside `topk_idx`.
            return unsafe { partial_entry(ctx, topk_idx, tok, j, d) };
        }
        // SAFETY: as above.
        let (p, w) = unsafe { (*pos.add(at), *topk_weights.add(at)) };
        if p == NO_POS || p >= ctx.max_tokens() {
            return None;
        }
        Some((local_ptr(ctx, ctx.comb_slot_offset(e as u32, p)) as *const u8, w))
    };
    let row = h * size;
    // SAFETY: the contract: `out` holds `num_tokens` rows; the entries'
    // slots are the window's (16-byte aligned, whole tokens).
    unsafe {
        weighted_rows::<T, 1, false>(
            t,
            nt,
            num_tokens as usize,
            h,
            k,
            |tok| (out as *mut u8).wrapping_add(tok * row),
            (out as usize) % 16 == 0,
            entry,
        )
    }
}

/// With [`CombineForm::PerRank`], entry `j` of token `tok` naming an
/// expert of LSA rank `d`: `d`'s partial sum of the token (weight 1) at the
/// first of the token's entries on `d`, `None` at the others (experts `d *
/// L..`: no division per earlier entry).
///
/// # Safety
/// `topk_idx` holds entries `tok * top_k..tok * top_k + j`.
#[inline(always)]
unsafe fn partial_entry(
    ctx: &MoeContext,
    topk_idx: *const i32,
    tok: usize,
    j: usize,
    d: u32,
) -> Option<(*const u8, f32)> {
    let (k, l, e_all) = (ctx.top_k() as usize, ctx.local_experts(), ctx.num_experts());
    let on_d = |x: i32| x >= 0 && (x as u32) < e_all && is_one_of(x, d * l, l);
    // SAFETY: entries `tok * k + i < tok * k + j`: the contract.
    let seen = (0..j).map(|i| unsafe { *topk_idx.add(tok * k + i) }).any(on_d);
    let p = local_ptr(ctx, ctx.ll_partial_slot_offset(d, tok as u32)) as *const u8;
    (!seen).then_some((p, 1.0))
}

/// Waits until every rank's partial sum of this rank's token slot `t` of
/// dispatch `seq` is in (their combine words of header `(me, t)`, which
/// [`combine_send_token`] releases) and, when `t < num_tokens`, writes
/// `out[t]` as [`combine_reduce`] does with [`CombineForm::PerRank`] (the
/// partials in top-k order, f32, rounded once). For a group whose ranks
/// are all in this rank's LSA team: a kernel that sends its slots
/// ([`combine_send_token`]) and then calls this for each of its own
/// token slots `t < max_tokens` (one coop each, also past `num_tokens`:
/// every word is waited for before the next dispatch reuses the slots)
/// needs neither [`combine_wait`] nor [`combine_reduce`]: each token is
/// added up as soon as its own partials are in, not after every token's
/// (the library's kernel). `Err(BadArgument)` (no wait) when some rank is
/// outside the LSA team. The coop is whole warps.
///
/// # Safety
/// `ctx` live, `T` of its element size; `topk_idx` is the dispatch's
/// routing (`num_tokens * top_k` entries), `out` holds `num_tokens *
/// hidden` elements of `T`; this coop's [`combine_send_token`] calls for
/// dispatch `seq` returned (a coop that waits before sending may wait for
/// a coop of another rank that waits for it); every thread of the coop
/// calls with the same arguments.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn combine_recv_token<T: Element<Acc = f32>, C: Coop>(
    coop: &C,
    ctx: &MoeContext,
    t: u32,
    topk_idx: *const i32,
    num_tokens: u32,
    out: *mut T,
    seq: u32,
) -> Result<(), MoeError> {
    let comm = ctx.comm();
    let (n, m) = (comm.nranks(), ctx.max_tokens());
    if t >= m || num_tokens > m || gin_ranks(ctx) > 0 || size_of::<T>() as u32 != ctx.elem_size() {
        return coop.agree(Err(MoeError::BadArgument));
    }
    let r = (|| -> Result<(), MoeError> {
        let mut deadline = Deadline::new(&comm.abort());
        let mut d = coop.thread_rank();
        while d < n {
            let p = local_ptr(ctx, ctx.ll_combine_word_offset(d, t)) as *const u64;
            // SAFETY: this rank's combine word of `(d, t)`, written only atomically.
            let w = unsafe { wait::wait_ge_u64(p, word(seq, 0), Scope::Sys, &mut deadline) }?;
            if (w >> 32) as u32 != seq {
                return Err(MoeError::OutOfStep);
            }
            d += coop.size();
        }
        Ok(())
    })();
    let r = coop.agree(r);
    // The words' acquires by some threads, before every thread reads the partials.
    coop.sync();
    r?;
    if t >= num_tokens {
        return Ok(());
    }
    let (k, h, l) = (ctx.top_k() as usize, ctx.hidden() as usize, ctx.local_experts().max(1));
    let e_all = ctx.num_experts();
    let tok = t as usize;
    let entry = |_: usize, j: usize| -> Option<(*const u8, f32)> {
        // SAFETY: entry `j < top_k` of token `t < num_tokens` (the contract).
        let e = unsafe { *topk_idx.add(tok * k + j) };
        if e < 0 || e as u32 >= e_all {
            return None;
        }
        // SAFETY: entries before `j` of the token: inside `topk_idx`.
        unsafe { partial_entry(ctx, topk_idx, tok, j, e as u32 / l) }
    };
    let row = out.wrapping_add(tok * h) as *mut u8;
    let (tr, nt) = (coop.thread_rank() as usize, coop.size() as usize);
    // SAFETY: row `t < num_tokens` of `out` (the contract); the partial
    // slots are whole slots of this rank's window (16-byte aligned), in
    // since the words above (this rank's own among them).
    unsafe { weighted_rows::<T, 1, false>(tr, nt, 1, h, k, |_| row, (row as usize) % 16 == 0, entry) };
    Ok(())
}

/// Entries a thread of [`weighted_rows`] keeps resolved for its current
/// row (a top-k's at most 32; more are looked up again for every vector).
const ROW_ENTRIES: usize = 16;

/// The resolved entries (`Some` ones, in `j` order) of the row a thread
/// of [`weighted_rows`] is on. A thread visits a row's vectors one after
/// another (`t, t + nt, ...` of the row's), so it resolves the row's `k`
/// entries once, not once per 16-byte vector: a high-throughput entry is
/// two volatile routing-row loads and a `recv_rows` load, which per vector
/// made the combine (2 ms at 4096 tokens on 2 x H200) mostly metadata.
struct RowEntries {
    row: usize,
    len: usize,
    /// Entries `0..len` written (no zeroing per call: 32 stores to local
    /// memory a thread otherwise, a pointer and a weight per entry).
    at: [MaybeUninit<(*const u8, f32)>; ROW_ENTRIES],
}

impl RowEntries {
    #[inline(always)]
    fn new() -> Self {
        RowEntries { row: usize::MAX, len: 0, at: [const { MaybeUninit::uninit() }; ROW_ENTRIES] }
    }

    /// Resolves row `r`'s entries (once per row, when `k <= ROW_ENTRIES`)
    /// and returns how many [`RowEntries::get`] may then be asked for.
    #[inline(always)]
    fn resolve(&mut self, r: usize, k: usize, entry: &impl Fn(usize, usize) -> Option<(*const u8, f32)>) -> usize {
        if k > ROW_ENTRIES {
            return k;
        }
        if self.row != r {
            self.len = 0;
            for e in (0..k).filter_map(|j| entry(r, j)) {
                if let Some(slot) = self.at.get_mut(self.len) {
                    slot.write(e);
                    self.len += 1;
                }
            }
            self.row = r;
        }
        self.len
    }

    /// Entry `j` (below what [`RowEntries::resolve`] returned for row `r`).
    #[inline(always)]
    fn get(
        &self,
        r: usize,
        j: usize,
        k: usize,
        entry: &impl Fn(usize, usize) -> Option<(*const u8, f32)>,
    ) -> Option<(*const u8, f32)> {
        if k > ROW_ENTRIES {
            return entry(r, j);
        }
        // SAFETY: entries `0..len` were written by `resolve`.
        self.at.get(j).filter(|_| j < self.len).map(|e| unsafe { e.assume_init() })
    }

    /// `add(src, w)` for each `entry(r, j) = Some((src, w))`, `j < k` in
    /// order. `add` has one call site, so it is inlined (a closure called
    /// from two loops was compiled as a function, its accumulators in
    /// local memory).
    #[inline(always)]
    fn each(
        &mut self,
        r: usize,
        k: usize,
        entry: &impl Fn(usize, usize) -> Option<(*const u8, f32)>,
        mut add: impl FnMut(*const u8, f32),
    ) {
        let count = self.resolve(r, k, entry);
        for j in 0..count {
            if let Some((src, w)) = self.get(r, j, k, entry) {
                add(src, w);
            }
        }
    }
}

/// Row `r` of the output (`out_row(r)`, `h` elements of `T`) = the sum
/// over `j < k` of `w * src[..]` for each `entry(r, j) = Some((src, w))`
/// (`src` a row of `h` elements of `T`), accumulated in f32 in `j` order
/// and rounded once, for rows `0..rows`; by any set of threads (`t` of
/// `nt`) over the rows' 16-byte vectors when `aligned` (every `out_row`
/// and every `src` 16-byte aligned) and a row is a whole number of
/// vectors, else over single elements, with the same result. Shared by
/// both modes' combines. A thread calls `entry` once per row it works on
/// (up to [`ROW_ENTRIES`] entries; for larger `k`, once per vector).
///
/// One row (`rows == 1`) goes by [`strided_row`], with `GATHER` by its
/// path that loads every entry's vectors together (the low-latency
/// combine's send, up to 8 experts a token; its receive, a partial per
/// rank, passes `false`: both paths in both made the kernel's code too
/// large for the instruction cache, session 37). Over several rows, a
/// thread loads the vectors of `AHEAD` entries (1 or 2) before adding
/// them. On 2 × H200 (session 30) two ahead made the high-throughput
/// combines faster (per source 255.6 → 245.1 µs, in the window 195.3 →
/// 192.5 at 4096 tokens) and the low-latency combine's reduce (one unit
/// of 4 vectors a thread, two partials a row) slower (26.7 → 27.9 µs a
/// combine): its callers pass 1.
///
/// # Safety
/// `out_row(r)` for `r < rows` and every `src` of an entry are valid rows
/// (16-byte aligned when `aligned`); no two rows overlap; the `nt` threads
/// use `t = 0..nt` once each; `entry(r, j)` gives the same answer however
/// often it is called (its inputs do not change during the call).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn weighted_rows<T: Element<Acc = f32>, const AHEAD: usize, const GATHER: bool>(
    t: usize,
    nt: usize,
    rows: usize,
    h: usize,
    k: usize,
    out_row: impl Fn(usize) -> *mut u8,
    aligned: bool,
    entry: impl Fn(usize, usize) -> Option<(*const u8, f32)>,
) {
    let size = core::mem::size_of::<T>();
    let row = h * size;
    let mut entries = RowEntries::new();
    if size <= 16 && 16 % size == 0 && row % 16 == 0 && aligned {
        let vecs = row / 16;
        if rows == 1 {
            // SAFETY: the contract; the row is `vecs` whole vectors.
            unsafe { strided_row::<T, STRIDED_VECS, GATHER>(t, nt, vecs, k, out_row(0), &entry) };
            return;
        }
        if vecs % (BLOCK_LANES * 4) == 0 {
            // SAFETY: the contract; a row is `vecs` whole vectors, a multiple of 32 * 4.
            unsafe { vector_rows::<T, 4, AHEAD>(t, nt, rows, vecs, k, &out_row, &entry, &mut entries) };
        } else {
            // SAFETY: the contract; a row is `vecs` whole vectors.
            unsafe { vector_rows::<T, 1, AHEAD>(t, nt, rows, vecs, k, &out_row, &entry, &mut entries) };
        }
        return;
    }
    // SAFETY: the contract.
    unsafe { element_rows::<T>(t, nt, rows, h, k, &out_row, &entry) };
}

/// [`weighted_rows`] element by element: for rows or sources not 16-byte
/// aligned, or rows not a whole number of vectors. Out of line: inlined,
/// it put a copy of this loop beside each caller's vector code (the
/// low-latency combine's kernel has two), code that never runs for
/// aligned rows but that the instruction fetch of the kernel paid for.
///
/// # Safety
/// As for [`weighted_rows`].
#[allow(clippy::too_many_arguments)]
#[inline(never)]
unsafe fn element_rows<T: Element<Acc = f32>>(
    t: usize,
    nt: usize,
    rows: usize,
    h: usize,
    k: usize,
    out_row: &impl Fn(usize) -> *mut u8,
    entry: &impl Fn(usize, usize) -> Option<(*const u8, f32)>,
) {
    let mut entries = RowEntries::new();
    let total = rows * h;
    let mut i = t;
    while i < total {
        let (Some(tok), Some(el)) = (i.checked_div(h), i.checked_rem(h)) else {
            return;
        };
        let mut acc = 0.0f32;
        entries.each(tok, k, entry, |slot, w| {
            // SAFETY: element `el < hidden` of a source row.
            let y = unsafe { arch::load_volatile((slot as *const T).add(el)) };
            acc += w * y.to_acc();
        });
        // SAFETY: element `el` of output row `tok < rows`.
        unsafe { arch::store_volatile((out_row(tok) as *mut T).add(el), T::from_acc(acc)) };
        i += nt.max(1);
    }
}

/// Vectors of one entry a thread of [`strided_row`] loads before it adds
/// them, one entry at a time.
const STRIDED_VECS: usize = 8;

/// Entries [`strided_row`] resolves once into registers and, when more
/// than two are present, loads together (a low-latency top-k, or the
/// ranks of an LSA team, up to 8).
const STRIDED_ENTRIES: usize = 8;

/// [`weighted_rows`]' path for a single row (a span's partial sum of one
/// token, the low-latency combine's send and receive): thread `t` takes
/// vectors `t, t + nt, ...` (lanes adjacent). Without `GATHER`, or with
/// up to two entries, a pass loads up to `V` vectors of an entry before
/// adding them, entry by entry: a 7168-wide bf16 row over a span of 128
/// threads is one pass, a round trip per entry. With `GATHER` and three
/// to [`STRIDED_ENTRIES`] entries, a pass loads two vectors of **every**
/// entry before adding any
/// ([`gathered_row`]): one round trip a pass whatever the entry count,
/// where one entry at a time made eight in turn for a top-8 token on one
/// rank (the combine's send waited on them: 16 % of its warp samples on
/// one instruction, session 36). The same sums in the same order either
/// way.
///
/// # Safety
/// As for [`weighted_rows`] with its vector path's conditions, for the
/// one row `out` of `vecs` vectors.
#[inline(always)]
unsafe fn strided_row<T: Element<Acc = f32>, const V: usize, const GATHER: bool>(
    t: usize,
    nt: usize,
    vecs: usize,
    k: usize,
    out: *mut u8,
    entry: &impl Fn(usize, usize) -> Option<(*const u8, f32)>,
) {
    let nt = nt.max(1);
    if GATHER && k <= STRIDED_ENTRIES {
        let mut e = [None; STRIDED_ENTRIES];
        let mut c = 0;
        each_lane!(STRIDED_ENTRIES, |j| {
            if j < k {
                e[j] = entry(0, j);
                c += e[j].is_some() as usize;
            }
        });
        if c > 2 {
            // SAFETY: the contract; `e` holds the entries.
            unsafe { gathered_row::<T, 2>(t, nt, vecs, out, &e) };
            return;
        }
    }
    let mut base = t;
    while base < vecs {
        let mut acc = [[0.0f32; 16]; V];
        for j in 0..k {
            let Some((src, w)) = entry(0, j) else { continue };
            let mut bits = [[0u32; 4]; V];
            each_lane!(V, |x| {
                let v = base + x * nt;
                if v < vecs {
                    // SAFETY: vector `v < vecs` of a source row (16-byte
                    // aligned, `vecs` whole vectors: the contract).
                    bits[x] = unsafe { arch::load16(src.add(v * 16)) };
                }
            });
            // Vectors past the row add zeros to accumulators never stored.
            add_vectors::<T, V>(&mut acc, &bits, w);
        }
        // SAFETY: the contract: `out` is a row of `vecs` aligned vectors.
        unsafe { store_pass::<T, V>(out, base, nt, vecs, &acc) };
        base += V * nt;
    }
}

/// [`strided_row`] over its resolved entries `e` (`Some((row, weight))`,
/// in `j` order): each pass loads vectors `base + x * nt` (`x < V`) of
/// every entry, then adds them entry by entry.
///
/// # Safety
/// As for [`strided_row`]; each `Some` row is `vecs` 16-byte-aligned
/// vectors; `nt >= 1`.
#[inline(always)]
unsafe fn gathered_row<T: Element<Acc = f32>, const V: usize>(
    t: usize,
    nt: usize,
    vecs: usize,
    out: *mut u8,
    e: &[Option<(*const u8, f32)>; STRIDED_ENTRIES],
) {
    let mut base = t;
    while base < vecs {
        let mut bits = [[[0u32; 4]; V]; STRIDED_ENTRIES];
        each_lane!(STRIDED_ENTRIES, |j| {
            if let Some((src, _)) = e[j] {
                each_lane!(V, |x| {
                    let v = base + x * nt;
                    if v < vecs {
                        // SAFETY: vector `v < vecs` of entry `j`'s row (the contract).
                        bits[j][x] = unsafe { arch::load16(src.add(v * 16)) };
                    }
                });
            }
        });
        let mut acc = [[0.0f32; 16]; V];
        each_lane!(STRIDED_ENTRIES, |j| {
            if let Some((_, w)) = e[j] {
                // Vectors past the row add zeros to accumulators never stored.
                add_vectors::<T, V>(&mut acc, &bits[j], w);
            }
        });
        // SAFETY: the contract: `out` is a row of `vecs` aligned vectors.
        unsafe { store_pass::<T, V>(out, base, nt, vecs, &acc) };
        base += V * nt;
    }
}

/// Stores a pass of [`strided_row`] or [`gathered_row`]: vector `base + x
/// * nt` of `out` from `acc[x]`, for `x < V` while below `vecs`.
///
/// # Safety
/// `out` is a row of `vecs` 16-byte-aligned vectors, valid for writes.
#[inline(always)]
unsafe fn store_pass<T: Element<Acc = f32>, const V: usize>(
    out: *mut u8,
    base: usize,
    nt: usize,
    vecs: usize,
    acc: &[[f32; 16]; V],
) {
    each_lane!(V, |x| {
        let v = base + x * nt;
        if v < vecs {
            // SAFETY: vector `v < vecs` of the output row, 16-byte aligned.
            unsafe { arch::store16(out.add(v * 16), packed_vector::<T>(&acc[x])) };
        }
    });
}

/// The 16-byte vector of `T` lanes `acc[0..16 / size_of::<T>()]`, each
/// rounded once from f32 ([`Element::from_acc`]).
#[inline(always)]
fn packed_vector<T: Element<Acc = f32>>(acc: &[f32; 16]) -> [u32; 4] {
    let size = core::mem::size_of::<T>();
    let mask = if size >= 4 { u32::MAX } else { (1u32 << (8 * size)) - 1 };
    let mut o = [0u32; 4];
    each_lane!(16 / size, |q| {
        let b = q * size;
        o[b / 4] |= ((T::from_acc(acc[q]).to_bits64() as u32) & mask) << ((b % 4) * 8);
    });
    o
}

/// `acc[x][q] += w * lane q of vectors[x]` (lanes of `T`), for `x < V`.
#[inline(always)]
fn add_vectors<T: Element<Acc = f32>, const V: usize>(acc: &mut [[f32; 16]; V], vectors: &[[u32; 4]; V], w: f32) {
    let size = core::mem::size_of::<T>();
    let mask = if size >= 4 { u32::MAX } else { (1u32 << (8 * size)) - 1 };
    each_lane!(V, |x| {
        each_lane!(16 / size, |q| {
            let o = q * size;
            let e = (vectors[x][o / 4] >> ((o % 4) * 8)) & mask;
            acc[x][q] += w * T::from_bits64(e as u64).to_acc();
        });
    });
}

/// Units of a row's vectors that [`vector_rows`] lays out lane-contiguous:
/// `BLOCK_LANES` units of `V` vectors cover `BLOCK_LANES * V` vectors, the
/// `x`-th vector of each unit side by side (one coalesced load per `x`).
const BLOCK_LANES: usize = 32;

/// [`weighted_rows`]' vector path: each thread takes units of `V` 16-byte
/// vectors of a row (the `x`-th of unit `u` is vector `(u / 32) * 32 * V +
/// x * 32 + u % 32`, so a warp's lanes read adjacent vectors), loading the
/// `V` vectors of an entry before adding them: `V` loads in flight per
/// thread instead of one (the combine's copies wait on memory, not on
/// arithmetic).
///
/// # Safety
/// As for [`weighted_rows`] with its vector path's conditions; a row is
/// `vecs` vectors, `vecs % (32 * V) == 0` unless `V == 1`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn vector_rows<T: Element<Acc = f32>, const V: usize, const AHEAD: usize>(
    t: usize,
    nt: usize,
    rows: usize,
    vecs: usize,
    k: usize,
    out_row: &impl Fn(usize) -> *mut u8,
    entry: &impl Fn(usize, usize) -> Option<(*const u8, f32)>,
    entries: &mut RowEntries,
) {
    let units = vecs / V;
    // The vector `x` of unit `u`.
    let at = |u: usize, x: usize| {
        if V == 1 {
            u
        } else {
            (u / BLOCK_LANES) * BLOCK_LANES * V + x * BLOCK_LANES + u % BLOCK_LANES
        }
    };
    let total = rows * units;
    let mut i = t;
    while i < total {
        let (Some(tok), Some(u)) = (i.checked_div(units), i.checked_rem(units)) else {
            return;
        };
        let mut acc = [[0.0f32; 16]; V];
        // `each_lane!` unrolls with constant indices: `acc` and `bits`
        // stay in registers (a loop over `x` put them in local memory).
        // With `AHEAD == 2` two entries' vectors are loaded before either
        // is added: one round trip for both.
        let count = entries.resolve(tok, k, entry);
        let mut j = 0;
        while j < count {
            let a = entries.get(tok, j, k, entry);
            let b = if AHEAD >= 2 && j + 1 < count { entries.get(tok, j + 1, k, entry) } else { None };
            let (mut bits_a, mut bits_b) = ([[0u32; 4]; V], [[0u32; 4]; V]);
            each_lane!(V, |x| {
                if let Some((src, _)) = a {
                    // SAFETY: vector `at(u, x) < vecs` of a source row
                    // (16-byte aligned, `vecs` whole vectors: the contract).
                    bits_a[x] = unsafe { arch::load16(src.add(at(u, x) * 16)) };
                }
                if let Some((src, _)) = b {
                    // SAFETY: as above.
                    bits_b[x] = unsafe { arch::load16(src.add(at(u, x) * 16)) };
                }
            });
            if let Some((_, w)) = a {
                add_vectors::<T, V>(&mut acc, &bits_a, w);
            }
            if let Some((_, w)) = b {
                add_vectors::<T, V>(&mut acc, &bits_b, w);
            }
            j += if AHEAD >= 2 { 2 } else { 1 };
        }
        each_lane!(V, |x| {
            // SAFETY: vector `at(u, x)` of output row `tok < rows`, 16-byte aligned.
            unsafe { arch::store16(out_row(tok).add(at(u, x) * 16), packed_vector::<T>(&acc[x])) };
        });
        i += nt.max(1);
    }
}
