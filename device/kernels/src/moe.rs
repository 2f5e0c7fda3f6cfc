//! The kernels behind `devcomm::moe`'s dispatch and combine, both modes:
//! one kernel each way, launched co-resident (CTAs wait for other ranks'
//! CTAs), each a sequence of calls of [`devcomm_device::moe`]'s device
//! functions (high-throughput: [`devcomm_device::moe::ht`]) with the
//! arguments in one [`MoeArgs`] ([`MoeHtArgs`]).

use devcomm_device::arch::{
    self, block_dim, block_idx, global_thread_x, global_timer_ns, grid_dim, grid_threads_x, warp_id, WARP_SIZE,
};
use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::coll::{Bf16, Element, F16};
use devcomm_device::coop::{Coop, Cta, Warp, WarpSpan};
use devcomm_device::kernel;
use devcomm_device::moe::{self, ht, CombineForm, MoeArgs, MoeContext, MoeError, MoeHtArgs, PackPart, STAGES};

use crate::shared::cta_copy;

const _: () = assert!(core::mem::size_of::<MoeContext>() as u32 <= moe::CONTEXT_SHARED_BYTES);

/// Records `r`'s error in `args.errors` (the first one stays); the caller
/// decides which thread reports.
///
/// # Safety
/// `args.errors` is a valid `u32` of device memory, accessed atomically.
#[inline(always)]
unsafe fn report<T>(args: &MoeArgs, r: Result<T, MoeError>) {
    if let Err(e) = r {
        // SAFETY: the contract: a valid device `u32`, accessed atomically.
        unsafe { atomic::compare_exchange(args.errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys) };
    }
}

/// The kernel's stages, as [`MoeArgs::stamps`] records them.
#[derive(Clone, Copy)]
enum Stage {
    Start = 0,
    Sent = 1,
    Waited = 2,
    Counted = 3,
    Done = 4,
}

const _: () = assert!(Stage::Done as usize + 1 == STAGES);

/// With `args.stamps` set: the CTA syncs and its leader records
/// `%globaltimer` as this CTA's stamp of `stage`. Nothing otherwise.
///
/// # Safety
/// Every thread of the CTA calls it; `args.stamps` 0 or `u64 [grid CTAs][STAGES]`.
#[inline(always)]
unsafe fn stamp(cta: &Cta, args: &MoeArgs, stage: Stage) {
    if args.stamps == 0 {
        return;
    }
    cta.sync();
    if cta.is_leader() {
        let at = block_idx().x as usize * STAGES + stage as usize;
        // SAFETY: the contract: this CTA's stamp, written by its leader only.
        unsafe { *(args.stamps as *mut u64).add(at) = global_timer_ns() };
    }
}

/// With `args.stamps` set: the coop's leader raises this CTA's stamp of
/// `stage` to `%globaltimer` (an atomic max: each span of the CTA reaches
/// the stage on its own, the CTA's stamp is the last of them). Nothing
/// otherwise. Only for stages no [`stamp`] of the kernel writes.
///
/// # Safety
/// `args.stamps` 0 or `u64 [grid CTAs][STAGES]`.
#[inline(always)]
unsafe fn stamp_span<C: Coop>(coop: &C, args: &MoeArgs, stage: Stage) {
    if args.stamps == 0 || !coop.is_leader() {
        return;
    }
    let at = block_idx().x as usize * STAGES + stage as usize;
    // SAFETY: the contract: this CTA's stamp, written only atomically in this kernel.
    unsafe { atomic::fetch_max((args.stamps as *mut u64).add(at), global_timer_ns(), Order::Relaxed, Scope::Gpu) };
}

/// `f(i)` for this coop's items `i < items` (`at`), each result reported
/// by the coop's leader: the item loop of every kernel here.
///
/// # Safety
/// `args.errors` a valid device `u32`; every thread of `coop` calls it.
#[inline(always)]
unsafe fn for_items<C: Coop, T>(
    coop: &C,
    at: Items,
    items: u32,
    args: &MoeArgs,
    f: impl Fn(u32) -> Result<T, MoeError>,
) {
    let mut i = at.first;
    while i < items {
        let r = f(i);
        if coop.is_leader() {
            // SAFETY: the contract.
            unsafe { report(args, r) };
        }
        i += at.stride;
    }
}

/// The context, copied by the CTA's leader into the block's dynamic shared
/// memory ([`moe::CONTEXT_SHARED_BYTES`], which the host launches these
/// kernels with) and read from there by every thread: the MoE device
/// functions take it by reference, and a reference into the kernel's
/// parameter would make every thread copy the ~400-byte arguments to local
/// memory at entry. Returned with the kernel's sequence number
/// (`MoeArgs::seq_words`: `max(args.seq, this CTA's word + 1)`, which a
/// combine stores back). `None`, with `BadArgument` reported, when the
/// launch lacks the shared memory (on every thread).
///
/// # Safety
/// Every thread of the CTA calls it, first; `args.errors` a valid device
/// `u32`; `args.seq_words` 0 or a word per CTA of the grid, used by the
/// group's kernels alone.
#[inline(always)]
unsafe fn shared_context<'c>(cta: &'c Cta, args: &MoeArgs, kernel: Kernel) -> Option<(&'c MoeContext, u32)> {
    // The sequence number (see `MoeArgs::seq`): the argument's, or one
    // past this CTA's word when that is further on (read by every thread
    // before the copy's barrier; a combine's leader stores its number
    // back after that barrier, when every thread has read).
    let words = args.seq_words as *mut u32;
    let from_device = !words.is_null();
    let b = block_idx().x as usize;
    let seq = if from_device {
        // SAFETY: the contract: `seq_words` holds a word per CTA of the
        // grid, written only by this CTA's leader (below), between kernels.
        args.seq.max(unsafe { arch::load_volatile(words.add(b)) }.wrapping_add(1))
    } else {
        args.seq
    };
    // SAFETY: the contract; the MoE functions use no shared memory.
    let ctx = unsafe { cta_copy(cta, &args.ctx) };
    if ctx.is_none() && cta.is_leader() {
        // SAFETY: the contract.
        unsafe { report::<()>(args, Err(MoeError::BadArgument)) };
    }
    if from_device && kernel == Kernel::Combine && ctx.is_some() && cta.is_leader() {
        // SAFETY: as above; every thread of the CTA read the word before
        // `cta_copy`'s barrier (passed: it returned the context).
        unsafe { arch::store_volatile(words.add(b), seq) };
    }
    ctx.map(|c| (c, seq))
}

/// Which way a kernel goes (a combine advances the device's sequence words).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Dispatch,
    Combine,
}

/// A dispatch's step (both modes; the high-throughput kernels take it
/// first, the low-latency one after its sends): the token count (0, with
/// the error reported, when above the maximum: the other ranks still wait
/// for this rank's empty counts), and [`moe::dispatch_prepare`] over the grid.
///
/// # Safety
/// As for `moe_dispatch`; `ctx` is `args.ctx` (its shared copy).
#[inline(always)]
unsafe fn prepare(args: &MoeArgs, ctx: &MoeContext) -> u32 {
    let mut num_tokens = args.num_tokens;
    if num_tokens > ctx.max_tokens() {
        if global_thread_x() == 0 {
            // SAFETY: the contract.
            unsafe { report::<()>(args, Err(MoeError::BadArgument)) };
        }
        num_tokens = 0;
    }
    // SAFETY: the contract: the routing and the handle's buffers of `num_tokens * top_k`.
    let r = unsafe {
        moe::dispatch_prepare(
            global_thread_x() as usize,
            grid_threads_x() as usize,
            ctx,
            args.topk_idx as *const i32,
            args.topk_weights as *const f32,
            num_tokens,
            args.pos as *mut u32,
            args.handle_idx as *mut i32,
            args.handle_weights as *mut f32,
        )
    };
    // SAFETY: the contract.
    unsafe { report(args, r) };
    num_tokens
}

/// A low-latency dispatch (`moe_dispatch`; `LEAN`: `moe_dispatch_lsa`,
/// compiled for a group without fp8 dispatch whose ranks are all in the
/// LSA team, with a per-rank combine and the per-expert pack: the
/// streamed receive of [`moe::lsa`] and none of the GIN, fp8, scan or
/// token-major paths).
///
/// # Safety
/// As for `moe_dispatch`; with `LEAN`, the group is such a group.
#[inline(always)]
unsafe fn dispatch<const LEAN: bool>(args: &MoeArgs) {
    let cta = Cta::new();
    let Some((ctx, seq)) = shared_context(&cta, args, Kernel::Dispatch) else { return };
    if LEAN && !lsa_dispatch_serves(ctx) {
        refuse(&cta, args);
        return;
    }
    stamp(&cta, args, Stage::Start);
    // The sends check the routing themselves; `prepare` (the handle's
    // copy of it, and the count check) comes after them, its loads
    // overlapping the other ranks' sends rather than delaying ours.
    let num_tokens = if args.num_tokens > ctx.max_tokens() { 0 } else { args.num_tokens };
    let pos = args.pos as *mut u32;
    let (x, idx, w) = (args.x as *const u8, args.topk_idx as *const i32, args.topk_weights as *const f32);
    let warp = Warp::new();
    if LEAN {
        // The streamed receive's counts first, a warp per expert (rows of
        // later sources wait for them).
        for_items(&warp, Items::warps(), ctx.num_experts(), args, |e| {
            moe::lsa::dispatch_send_count(&warp, ctx, e, idx, num_tokens, seq)
        });
    }
    for_items(&cta, Items::ctas(), ctx.max_tokens(), args, |t| {
        if LEAN {
            moe::lsa::dispatch_send_token_streamed(&cta, ctx, t, x, idx, w, num_tokens, seq)
        } else {
            moe::dispatch_send_token(&cta, ctx, t, x, idx, w, num_tokens, seq)
        }
    });
    // A span of warps per expert of a rank outside the LSA team (its
    // scan is a warp's work, done by each warp alike); with a
    // per-expert combine, every expert (its positions).
    let per_expert_combine = ctx.combine_per_expert();
    if !LEAN && (moe::gin_ranks(ctx) > 0 || per_expert_combine) {
        let (span, at) = Items::spans(ctx.num_experts());
        let l = ctx.local_experts();
        for_items(&span, at, ctx.num_experts(), args, |e| {
            if moe::is_lsa(ctx, e / l) && !per_expert_combine {
                return Ok(0);
            }
            moe::dispatch_send_expert(&span, ctx, e, x, idx, num_tokens, pos, seq)
        });
    }
    if LEAN {
        // The lean kernel has no wait for every slot: its "sent" stamp
        // follows the tokens, its "waited" one `prepare`.
        stamp(&cta, args, Stage::Sent);
    }
    prepare(args, ctx);
    stamp(&cta, args, if LEAN { Stage::Waited } else { Stage::Sent });
    let (out, scales, counts) = (args.out as *mut u8, args.scales as *mut u8, args.counts as *mut u32);
    let (n, m) = (ctx.comm().nranks(), ctx.max_tokens());
    if LEAN {
        // The streamed receive: every token slot of every source, in
        // pieces that give each warp of the grid about one, each waiting
        // for its slot alone; then the counts.
        let items = Items::warps();
        // Pieces per slot: a power of two, so an item splits by a shift and
        // a mask (a division each is ~20 instructions a warp runs once).
        let shift = (items.stride / (n * m).max(1)).max(1).ilog2();
        let parts = 1 << shift;
        // The counts (sent first, so in before most tokens) by each CTA's
        // first warp, then every warp's token items.
        if warp_id() == 0 {
            for_items(&warp, Items::ctas(), ctx.local_experts(), args, |l| {
                moe::lsa::dispatch_recv_count(&warp, ctx, l, counts, seq)
            });
        }
        for_items(&warp, items, n * m * parts, args, |i| {
            let slot = i >> shift;
            let part = PackPart::new(i & (parts - 1), parts);
            moe::lsa::dispatch_recv_token(&warp, ctx, slot / m, slot % m, part, out, seq)
        });
        stamp(&cta, args, Stage::Counted);
        stamp(&cta, args, Stage::Done);
        return;
    }
    // Every LSA source's tokens, once for the CTA's experts (their
    // receive steps then wait for the GIN sources alone).
    let waited = moe::dispatch_wait_lsa(&cta, ctx, seq);
    if waited.is_err() && cta.is_leader() {
        report(args, waited);
    }
    stamp(&cta, args, Stage::Waited);
    if ctx.pack_per_expert() {
        // Every local expert packed by its own coops (no grid barrier).
        if waited.is_ok() {
            let l = ctx.local_experts();
            let (span, at, parts) = pack_units(l);
            for_items(&span, at, l * parts, args, |i| {
                moe::dispatch_pack_expert_part(&span, ctx, i % l, PackPart::new(i / l, parts), out, scales, counts, seq)
            });
        }
        stamp(&cta, args, Stage::Counted);
        stamp(&cta, args, Stage::Done);
        return;
    }
    if waited.is_ok() {
        for_items(&cta, Items::ctas(), ctx.local_experts(), args, |l| {
            moe::dispatch_count_expert(&cta, ctx, l, out, scales, counts, seq)
        });
    }
    // Every CTA arrives, also after an error (the barrier counts them).
    let synced = moe::dispatch_grid_sync(&cta, ctx);
    if synced.is_err() && cta.is_leader() {
        report(args, synced);
    }
    if waited.is_err() || synced.is_err() {
        return;
    }
    stamp(&cta, args, Stage::Counted);
    // The LSA sources' tokens, a token per span of warps, each to
    // every row the counting gave it.
    let (span, at) = Items::spans(n * m);
    for_items(&span, at, n * m, args, |i| {
        if !moe::is_lsa(ctx, i / m) {
            return Ok(());
        }
        moe::dispatch_pack_token(&span, ctx, i / m, i % m, out, scales, seq)
    });
    stamp(&cta, args, Stage::Done);
}

kernel! {
    /// A low-latency dispatch: prepare (grid-strided), send (CTA `b` of
    /// the grid sends token slots `b, b + B, ...` to the LSA ranks; then
    /// spans of warps take the experts of the ranks outside the LSA team:
    /// their positions and tokens; the combine is per rank, so the LSA
    /// ranks' experts need no positions), wait for every LSA header (each
    /// CTA, once), then the pack: by default
    /// ([`MoeContext::PACK_PER_EXPERT`](devcomm_device::moe::MoeContext::PACK_PER_EXPERT),
    /// `LlPack::PerExpert` on the host)
    /// CTA `b` packs local experts `b, b + B, ...` (scan, rows, copies);
    /// otherwise (token-major) it counts them (their rows, and the GIN
    /// sources' tokens), a grid barrier, then the LSA tokens' copies (span
    /// `s` of the grid's takes token slots `s, s + S, ...` of the LSA
    /// sources), spread evenly however unevenly the experts are loaded.
    ///
    /// # Safety
    /// `args` made by `devcomm::moe::EpGroup::dispatch`: live context,
    /// buffers of the sizes it documents; launched co-resident with a
    /// block size that is a multiple of 32; the same `seq` on every rank.
    pub unsafe fn moe_dispatch(args: MoeArgs) {
        dispatch::<false>(&args);
    }

    /// A low-latency dispatch compiled for the common single-node case
    /// (`devcomm::moe::EpGroup` picks it when the group allows): every
    /// rank in the LSA team, no fp8 dispatch, the per-expert pack and the
    /// per-rank combine. The streamed receive ([`moe::lsa`]): a warp per
    /// expert sends this rank's count for it (`dispatch_send_count`),
    /// CTA `b` sends token slots `b, b + B, ...` with their positions
    /// (`dispatch_send_token_streamed`), prepare; then each warp of the
    /// grid takes token slots of every source, or pieces of them (about
    /// one item a warp), each as soon as that slot is in
    /// (`dispatch_recv_token`), after the first warp of CTA `b` stored
    /// local experts `b, b + B, ...`'s counts (`dispatch_recv_count`). The output is
    /// `moe_dispatch`'s per-expert pack's, row for row; `BadArgument` for
    /// another group.
    ///
    /// # Safety
    /// As for `moe_dispatch`.
    pub unsafe fn moe_dispatch_lsa(args: MoeArgs) {
        dispatch::<true>(&args);
    }
}

/// Whether `moe_dispatch_lsa` serves the group of `ctx`: the group
/// `moe_combine_lsa_*` serves ([`lsa_combine_serves`]: every rank in the
/// LSA team, the per-rank combine), without fp8 dispatch and with the
/// per-expert pack (the host's choice of kernel, checked again by the
/// kernel).
#[inline(always)]
pub fn lsa_dispatch_serves(ctx: &MoeContext) -> bool {
    lsa_combine_serves(ctx) && !ctx.fp8_dispatch() && ctx.pack_per_expert()
}

/// How the low-latency dispatch's per-expert pack spreads `l` local
/// experts over the grid: the coop of this thread, its items (`i`: local
/// expert `i % l`, its part `i / l`) and the parts per expert. With at
/// least as many CTAs as experts, each expert gets `B / l` CTAs (with 8
/// ranks of 256 experts a CTA per expert left 96 of 128 CTAs idle while
/// each of the others copied ~32 rows); with fewer, spans of warps
/// smaller than a CTA take an expert each (on one rank a CTA had packed
/// its two experts of ~4 rows one after the other, half its warps idle).
#[inline(always)]
fn pack_units(l: u32) -> (WarpSpan, Items, u32) {
    let parts = (grid_dim().x / l.max(1)).max(1);
    let (span, at) = Items::spans(l * parts);
    (span, at, parts)
}

/// A lean kernel launched for a group it does not serve: the CTA's leader
/// reports `BadArgument` (the caller then returns, on every thread).
///
/// # Safety
/// `args.errors` a valid device `u32`.
#[inline(always)]
unsafe fn refuse(cta: &Cta, args: &MoeArgs) {
    if cta.is_leader() {
        // SAFETY: the contract.
        unsafe { report::<()>(args, Err(MoeError::BadArgument)) };
    }
}

/// The items `first, first + stride, ...` a coop of the grid takes: CTA
/// `b` of `B` (`Items::ctas`) or span `s` of the grid's (`Items::spans`).
#[derive(Clone, Copy)]
struct Items {
    first: u32,
    stride: u32,
}

/// Most spans in a CTA: named barriers 1..=15 (0 is the CTA's). Two
/// phases whose spans split the warps differently need a CTA barrier
/// between them: span `j` uses barrier `1 + j` with its own thread count,
/// and one barrier used with two counts at once is undefined (an illegal
/// instruction on H100; the emulator refuses it).
const MAX_SPANS: u32 = 15;

impl Items {
    #[inline(always)]
    fn ctas() -> Self {
        Items { first: block_idx().x, stride: grid_dim().x }
    }

    /// The caller's warp's items: warp `w` of CTA `b` is warp `w * B + b`
    /// of the grid (items go round the CTAs first).
    #[inline(always)]
    fn warps() -> Self {
        let nb = grid_dim().x;
        Items { first: warp_id() * nb + block_idx().x, stride: nb * (block_dim().x / WARP_SIZE).max(1) }
    }

    /// The caller's span of warps for `items` items, and the items it
    /// takes: each CTA's `W` warps form spans of `g` (a divisor of `W`, at
    /// most [`MAX_SPANS`] spans per CTA), `g` as large as still gives every
    /// item a span (so a few items get many warps: more bytes in flight
    /// each), else as small as allowed. Span `j` of CTA `b` is span `j * B
    /// + b` of the grid: items go round the CTAs (SMs) first.
    #[inline(always)]
    fn spans(items: u32) -> (WarpSpan, Self) {
        let (w, nb) = ((block_dim().x / WARP_SIZE).max(1), grid_dim().x);
        let mut g = 0;
        let mut c = 1;
        while c <= w {
            if w % c == 0 && w / c <= MAX_SPANS {
                if g == 0 || nb * (w / c) >= items {
                    g = c;
                }
                if nb * (w / c) < items {
                    break;
                }
            }
            c += 1;
        }
        let per_block = w / g;
        let j = warp_id() / g;
        let span = WarpSpan::new(j * g, g, 1 + j);
        (span, Items { first: j * nb + block_idx().x, stride: nb * per_block })
    }
}

/// A combine's steps (both modes): `send()` (this CTA's sends, each
/// reported), then `wait(cta)` (every CTA waits for every partner's
/// outputs; the low-latency combine within one LSA team receives and adds
/// up each token there, its `reduce` doing nothing), then, if it
/// succeeded, `reduce(tokens)` over the grid;
/// failures reported in `args.errors`.
///
/// # Safety
/// `args.errors` a valid device `u32`; the closures' own contracts.
#[inline(always)]
unsafe fn combine_steps(
    cta: &Cta,
    args: &MoeArgs,
    ctx: &MoeContext,
    send: impl FnOnce(),
    wait: impl Fn(&Cta) -> Result<(), MoeError>,
    reduce: impl Fn(u32),
) {
    // SAFETY: (all four) the contract.
    unsafe { stamp(cta, args, Stage::Start) };
    send();
    // SAFETY: as above.
    unsafe { stamp(cta, args, Stage::Sent) };
    let r = wait(cta);
    if r.is_err() {
        if cta.is_leader() {
            // SAFETY: the contract.
            unsafe { report(args, r) };
        }
        return;
    }
    // SAFETY: as above.
    unsafe { stamp(cta, args, Stage::Waited) };
    // SAFETY: as above (no counting step: stamped with the last).
    unsafe { stamp(cta, args, Stage::Counted) };
    reduce(args.num_tokens.min(ctx.max_tokens()));
    // SAFETY: as above.
    unsafe { stamp(cta, args, Stage::Done) };
}

/// A low-latency combine of elements `T`, per rank
/// ([`CombineForm::PerRank`]): spans of warps send the partial sums of
/// the LSA sources' token slots (span `s` of the grid's `S` takes items
/// `s, s + S, ...` of (LSA source, slot)). With every rank in the LSA
/// team, each span then adds up its items that are this rank's own token
/// slots, each as soon as its partials are in ([`moe::combine_recv_token`]).
/// Otherwise CTA `b` sends local experts `b, b + B, ...` to the ranks
/// outside the LSA team, every CTA waits for every partial and output, and
/// the grid reduces.
/// With [`MoeContext::COMBINE_PER_EXPERT`], per expert to every source
/// (CTA `b` takes local experts `b, b + B, ...`). `LEAN`
/// (`moe_combine_lsa_*`): compiled for a group of the first kind alone
/// (every rank in the LSA team, per rank: [`lsa_combine_serves`]), with
/// neither the per-expert sends nor the grid's wait and reduce.
///
/// # Safety
/// As for `moe_dispatch`, `args` made by `devcomm::moe::EpGroup::combine`
/// for the dispatch with the same `seq`, `T` of the context's element size.
#[inline(always)]
unsafe fn combine<T: Element<Acc = f32>, const LEAN: bool>(args: &MoeArgs) {
    let cta = Cta::new();
    // SAFETY: every thread of the CTA, first; the contract.
    let Some((ctx, seq)) = (unsafe { shared_context(&cta, args, Kernel::Combine) }) else { return };
    if LEAN && !lsa_combine_serves(ctx) {
        // SAFETY: the contract.
        unsafe { refuse(&cta, args) };
        return;
    }
    let (n, m) = (ctx.comm().nranks(), ctx.max_tokens());
    let x = args.x as *const u8;
    let (span, at) = Items::spans(n * m);
    let form = if !LEAN && ctx.combine_per_expert() { CombineForm::PerExpert } else { CombineForm::PerRank };
    // Every rank in the LSA team, per rank: each span, after its sends,
    // adds up the items among its own that are this rank's token slots, as
    // soon as their partials are in (no wait for every token, no second
    // pass over the grid). One call site per device function: a second one
    // made the sends a call instead of inlined code (2 µs on one H200).
    let by_token = LEAN || (form == CombineForm::PerRank && moe::gin_ranks(ctx) == 0);
    let me = ctx.comm().rank();
    // SAFETY: (all three steps) the contract: this group's live context,
    // `x` the experts' outputs of the dispatch this kernel follows (every
    // local expert packed: an earlier kernel), the handle's buffers, `out`
    // of `num_tokens * hidden`.
    unsafe {
        combine_steps(
            &cta,
            args,
            ctx,
            || {
                if form == CombineForm::PerRank {
                    for_items(&span, at, n * m, args, |i| {
                        let (s, t) = (i / m, i % m);
                        if !LEAN && !moe::is_lsa(ctx, s) {
                            return Ok(());
                        }
                        moe::combine_send_token::<T, _>(&span, ctx, s, t, x, seq)
                    });
                }
                if !LEAN && (moe::gin_ranks(ctx) > 0 || form == CombineForm::PerExpert) {
                    for_items(&cta, Items::ctas(), ctx.local_experts(), args, |l| {
                        moe::combine_send_expert(&cta, ctx, l, x, form, seq)
                    });
                }
            },
            |cta| {
                if !by_token {
                    return moe::combine_wait(cta, ctx, form, seq);
                }
                // Every span sent all its items above (`combine_recv_token`'s
                // condition); the same spans, so no CTA barrier between.
                let (out, num_tokens) = (args.out as *mut T, args.num_tokens.min(m));
                for_items(&span, at, n * m, args, |i| {
                    if i / m != me {
                        return Ok(());
                    }
                    moe::combine_recv_token::<T, _>(
                        &span,
                        ctx,
                        i % m,
                        args.topk_idx as *const i32,
                        num_tokens,
                        out,
                        seq,
                    )
                });
                Ok(())
            },
            |num_tokens| {
                if by_token {
                    return;
                }
                moe::combine_reduce::<T>(
                    global_thread_x() as usize,
                    grid_threads_x() as usize,
                    ctx,
                    form,
                    args.topk_idx as *const i32,
                    args.topk_weights as *const f32,
                    args.pos as *const u32,
                    num_tokens,
                    args.out as *mut T,
                )
            },
        )
    }
}

kernel! {
    /// A low-latency combine of f32 tokens (see `combine`).
    ///
    /// # Safety
    /// As for `moe_dispatch`, `args` made by `devcomm::moe::EpGroup::combine`.
    pub unsafe fn moe_combine_f32(args: MoeArgs) {
        combine::<f32, false>(&args);
    }

    /// A low-latency combine of bf16 tokens.
    ///
    /// # Safety
    /// As for `moe_combine_f32`.
    pub unsafe fn moe_combine_bf16(args: MoeArgs) {
        combine::<Bf16, false>(&args);
    }

    /// A low-latency combine of f16 tokens.
    ///
    /// # Safety
    /// As for `moe_combine_f32`.
    pub unsafe fn moe_combine_f16(args: MoeArgs) {
        combine::<F16, false>(&args);
    }

    /// A low-latency combine of f32 tokens compiled for the single-node
    /// case (`devcomm::moe::EpGroup` picks it when the group allows):
    /// every rank in the LSA team and the per-rank combine. The same steps
    /// as `moe_combine_f32` with the per-expert sends and the grid's wait
    /// and reduce left out; `BadArgument` for another group.
    ///
    /// # Safety
    /// As for `moe_combine_f32`.
    pub unsafe fn moe_combine_lsa_f32(args: MoeArgs) {
        combine::<f32, true>(&args);
    }

    /// `moe_combine_lsa_f32` of bf16 tokens.
    ///
    /// # Safety
    /// As for `moe_combine_f32`.
    pub unsafe fn moe_combine_lsa_bf16(args: MoeArgs) {
        combine::<Bf16, true>(&args);
    }

    /// `moe_combine_lsa_f32` of f16 tokens.
    ///
    /// # Safety
    /// As for `moe_combine_f32`.
    pub unsafe fn moe_combine_lsa_f16(args: MoeArgs) {
        combine::<F16, true>(&args);
    }
}

/// Whether `moe_combine_lsa_*` serves the group of `ctx`: every rank in
/// the LSA team and the per-rank combine (the host's choice of kernel,
/// checked again by the kernel).
#[inline(always)]
pub fn lsa_combine_serves(ctx: &MoeContext) -> bool {
    moe::gin_ranks(ctx) == 0 && !ctx.combine_per_expert()
}

/// A high-throughput dispatch's first steps: prepare (grid-strided) and
/// send (span `s` of the grid's `S` takes (destination, channel) items `s,
/// s + S, ...`, destinations from the next rank on). A macro, not a
/// function: a function taking the kernel's parameter by reference made
/// ptxas copy it to local memory (704-byte stack frames against 168).
///
/// Safety: as for `moe_ht_dispatch`; `$ctx` is `$a.args.ctx` (its shared
/// copy); `$own_out` null or the per-source output (`dispatch_send_channel`).
macro_rules! ht_send {
    ($cta:expr, $a:expr, $ctx:expr, $seq:expr, $own_out:expr) => {{
        let (cta, a, ctx) = ($cta, $a, $ctx);
        let args = &a.args;
        stamp(cta, args, Stage::Start);
        let num_tokens = prepare(args, ctx);
        let (n, g, me) = (ctx.comm().nranks(), ctx.channels(), ctx.comm().rank());
        let (span, at) = Items::spans(n * g);
        for_items(&span, at, n * g, args, |i| {
            ht::dispatch_send_channel(
                &span,
                ctx,
                (me + 1 + i / g) % n,
                i % g,
                args.x as *const u8,
                args.topk_idx as *const i32,
                args.topk_weights as *const f32,
                num_tokens,
                a.rank_pos as *mut u32,
                $own_out,
                $seq,
            )
        });
        stamp(cta, args, Stage::Sent);
    }};
}

kernel! {
    /// A high-throughput dispatch: prepare (grid-strided), send (span `s`
    /// of the grid's `S` takes (destination, channel) items `s, s + S, ...`,
    /// destinations from the next rank on), wait for every source (each
    /// CTA), pack (span `s` takes (local expert, source) items `s, s + S,
    /// ...`; a per-source context is refused: `moe_ht_dispatch_per_source`).
    /// Spans of warps ([`Items::spans`]), as many warps each as the
    /// launch gives the items. On 2 x H200 at 4096 tokens: a CTA per item
    /// 3.4 ms, a warp per item 1.3 ms; spans alone did not speed the pack
    /// (its time was the routing scans' volatile loads, now plain: 0.89 ms;
    /// `benches/results/2026-11-27-h200x2-moe-stages.md`).
    ///
    /// # Safety
    /// `a` made by `devcomm::moe::EpGroup::dispatch` on a high-throughput
    /// group: live context, buffers of the sizes it documents (`rank_pos`
    /// of `max_tokens * nranks`, `recv_rows` of `nranks * max_tokens *
    /// top_k`); launched co-resident with a block size that is a multiple
    /// of 32; the same `seq` on every rank.
    pub unsafe fn moe_ht_dispatch(a: MoeHtArgs) {
        let args = &a.args;
        let cta = Cta::new();
        let Some((ctx, seq)) = shared_context(&cta, args, Kernel::Dispatch) else { return };
        if ctx.ht_per_source() {
            if cta.is_leader() {
                report::<()>(args, Err(MoeError::BadArgument));
            }
            return;
        }
        ht_send!(&cta, &a, ctx, seq, core::ptr::null_mut());
        let n = ctx.comm().nranks();
        let r = ht::dispatch_wait(&cta, ctx, seq);
        if r.is_err() {
            if cta.is_leader() {
                report(args, r);
            }
            return;
        }
        stamp(&cta, args, Stage::Waited);
        stamp(&cta, args, Stage::Counted);
        let (span, at) = Items::spans(ctx.local_experts() * n);
        for_items(&span, at, ctx.local_experts() * n, args, |i| {
            ht::dispatch_pack(
                &span, ctx, i / n, i % n, args.out as *mut u8, args.counts as *mut u32, a.recv_rows as *mut u32,
                seq,
            )
        });
        stamp(&cta, args, Stage::Done);
    }
}

kernel! {
    /// A high-throughput dispatch in the per-source layout
    /// (`HtLayout::PerSource`): prepare and send as `moe_ht_dispatch`,
    /// then, with no grid-wide wait, span `s` takes (source, channel) items
    /// `s, s + S, ...`: each waits for its channel alone and copies it out
    /// (`ht::dispatch_recv_channel`), so early channels leave while late
    /// ones travel. Its own kernel: the pack's registers stay as they were.
    /// Stage stamps: "waited" when the CTA's last channel word was seen,
    /// "counted" when its last channel was copied out.
    ///
    /// # Safety
    /// As for `moe_ht_dispatch`, on a per-source context, with the
    /// per-source tables (`recv_idx`, `recv_weights` of `nranks *
    /// max_tokens * top_k`, `source_counts` of `nranks`), `out` of `nranks *
    /// max_tokens` tokens and `counts` zeroed earlier on the stream.
    pub unsafe fn moe_ht_dispatch_per_source(a: MoeHtArgs) {
        let args = &a.args;
        let cta = Cta::new();
        let Some((ctx, seq)) = shared_context(&cta, args, Kernel::Dispatch) else { return };
        if !ctx.ht_per_source() {
            if cta.is_leader() {
                report::<()>(args, Err(MoeError::BadArgument));
            }
            return;
        }
        ht_send!(&cta, &a, ctx, seq, args.out as *mut u8);
        let (n, g) = (ctx.comm().nranks(), ctx.channels());
        let (span, at) = Items::spans(n * g);
        for_items(&span, at, n * g, args, |i| {
            let r = ht::dispatch_recv_channel_with(
                &span,
                ctx,
                i / g,
                i % g,
                args.out as *mut u8,
                a.recv_idx as *mut i32,
                a.recv_weights as *mut f32,
                args.counts as *mut u32,
                a.source_counts as *mut u32,
                true,
                seq,
                |_| stamp_span(&span, args, Stage::Waited),
            );
            stamp_span(&span, args, Stage::Counted);
            r
        });
        stamp(&cta, args, Stage::Done);
    }
}

/// A high-throughput combine of elements `T`: send the partial sums (span
/// `s` of the grid's `S` takes (source, channel) items `s, s + S, ...`),
/// then every CTA waits for every rank's partials and the grid adds them.
/// With `ROWS` (the per-source layout: its context, else refused), the
/// rows are sent as they are, and then span `s` takes channels `s, s + S,
/// ...` of this rank's tokens and adds each as soon as every rank's
/// partials of it are in (`ht::combine_reduce_channel`), no grid-wide wait.
/// With `PULL` (`HtLayout::PerSourceInWindow`'s in-place combine: `x` is
/// this rank's window rows), CTA 0 first announces the rows
/// (`ht::combine_rows_ready`), only ranks outside the LSA team get rows
/// pushed, and the reduce reads the LSA ranks' rows from their windows.
///
/// # Safety
/// As for `moe_ht_dispatch`, `a` made by `devcomm::moe::EpGroup::combine`
/// for the dispatch with the same `seq`, `T` of the context's element size.
#[inline(always)]
unsafe fn ht_combine<T: Element<Acc = f32>, const ROWS: bool, const PULL: bool>(a: &MoeHtArgs) {
    let args = &a.args;
    let cta = Cta::new();
    // SAFETY: every thread of the CTA, first; the contract.
    let Some((ctx, seq)) = (unsafe { shared_context(&cta, args, Kernel::Combine) }) else { return };
    if ctx.ht_per_source() != ROWS {
        if cta.is_leader() {
            // SAFETY: the contract.
            unsafe { report::<()>(args, Err(MoeError::BadArgument)) };
        }
        return;
    }
    let (n, g, me) = (ctx.comm().nranks(), ctx.channels(), ctx.comm().rank());
    // The closures below take these copies, not the kernel parameter: one
    // compiled out of line (LLVM did so for f16) would otherwise make every
    // thread copy the parameter to local memory at entry (`entry_copy` test).
    let (x, out) = (args.x as *const u8, args.out);
    let (rank_pos, recv_rows) = (a.rank_pos as *const u32, a.recv_rows as *const u32);
    let (span, at) = Items::spans(n * g);
    if ROWS {
        // SAFETY: (all) the contract: this group's live context, `x` one
        // row per received token, the handle's `rank_pos`, `out` of
        // `num_tokens * hidden`.
        unsafe {
            stamp(&cta, args, Stage::Start);
            if PULL && block_idx().x == 0 {
                ht::combine_rows_ready(&cta, ctx, seq);
            }
            for_items(&span, at, n * g, args, |i| {
                let src = (me + 1 + i / g) % n;
                if PULL && moe::is_lsa(ctx, src) {
                    return Ok(());
                }
                ht::combine_send_rows(&span, ctx, src, i % g, x, seq)
            });
            stamp(&cta, args, Stage::Sent);
            stamp(&cta, args, Stage::Waited);
            stamp(&cta, args, Stage::Counted);
            // The reduce's spans split the warps differently (fewer items):
            // their named barriers must not overlap the sends' (the same
            // ids with other thread counts: an illegal instruction on H100).
            cta.sync();
            let (span, at) = Items::spans(g);
            let tokens = args.num_tokens.min(ctx.max_tokens());
            for_items(&span, at, g, args, |c| {
                ht::combine_reduce_channel::<T, _, PULL>(&span, ctx, c, rank_pos, tokens, x, out as *mut T, seq)
            });
            stamp(&cta, args, Stage::Done);
        }
        return;
    }
    // SAFETY: (all three steps) the contract: this group's live context,
    // `x` the experts' outputs, the handle's tables, `out` of `num_tokens * hidden`.
    unsafe {
        combine_steps(
            &cta,
            args,
            ctx,
            || {
                for_items(&span, at, n * g, args, |i| {
                    ht::combine_send_channel::<T, _>(&span, ctx, (me + 1 + i / g) % n, i % g, x, recv_rows, seq)
                })
            },
            |cta| ht::combine_wait(cta, ctx, seq),
            |num_tokens| {
                let (t, nt) = (global_thread_x() as usize, grid_threads_x() as usize);
                ht::combine_reduce::<T>(t, nt, ctx, rank_pos, num_tokens, out as *mut T)
            },
        )
    }
}

kernel! {
    /// A high-throughput combine of f32 tokens (see `ht_combine`).
    ///
    /// # Safety
    /// As for `moe_ht_dispatch`, `a` made by `devcomm::moe::EpGroup::combine`.
    pub unsafe fn moe_ht_combine_f32(a: MoeHtArgs) {
        ht_combine::<f32, false, false>(&a);
    }

    /// A high-throughput combine of bf16 tokens.
    ///
    /// # Safety
    /// As for `moe_ht_combine_f32`.
    pub unsafe fn moe_ht_combine_bf16(a: MoeHtArgs) {
        ht_combine::<Bf16, false, false>(&a);
    }

    /// A high-throughput combine of f16 tokens.
    ///
    /// # Safety
    /// As for `moe_ht_combine_f32`.
    pub unsafe fn moe_ht_combine_f16(a: MoeHtArgs) {
        ht_combine::<F16, false, false>(&a);
    }

    /// A high-throughput combine in the per-source layout
    /// (`HtLayout::PerSource`) of f32 tokens: `a.args.x` holds one row per
    /// received token (`nranks * max_tokens` rows), sent back as they are
    /// (`ht::combine_send_rows`); then as `moe_ht_combine_f32`.
    ///
    /// # Safety
    /// As for `moe_ht_combine_f32`, on a per-source context, `x` of
    /// `nranks * max_tokens` rows.
    pub unsafe fn moe_ht_combine_rows_f32(a: MoeHtArgs) {
        ht_combine::<f32, true, false>(&a);
    }

    /// The same of bf16 tokens.
    ///
    /// # Safety
    /// As for `moe_ht_combine_rows_f32`.
    pub unsafe fn moe_ht_combine_rows_bf16(a: MoeHtArgs) {
        ht_combine::<Bf16, true, false>(&a);
    }

    /// The same of f16 tokens.
    ///
    /// # Safety
    /// As for `moe_ht_combine_rows_f32`.
    pub unsafe fn moe_ht_combine_rows_f16(a: MoeHtArgs) {
        ht_combine::<F16, true, false>(&a);
    }

    /// The in-window combine (`HtLayout::PerSourceInWindow`) of f32
    /// tokens: `a.args.x` is this rank's window rows (`ht::window_rows`),
    /// overwritten in place with its output per received token; the LSA
    /// ranks read each other's rows there (see `ht_combine`'s `PULL`).
    ///
    /// # Safety
    /// As for `moe_ht_combine_rows_f32`, `x` this rank's window rows, every
    /// rank of the group running this kernel for the dispatch.
    pub unsafe fn moe_ht_combine_window_f32(a: MoeHtArgs) {
        ht_combine::<f32, true, true>(&a);
    }

    /// The same of bf16 tokens.
    ///
    /// # Safety
    /// As for `moe_ht_combine_window_f32`.
    pub unsafe fn moe_ht_combine_window_bf16(a: MoeHtArgs) {
        ht_combine::<Bf16, true, true>(&a);
    }

    /// The same of f16 tokens.
    ///
    /// # Safety
    /// As for `moe_ht_combine_window_f32`.
    pub unsafe fn moe_ht_combine_window_f16(a: MoeHtArgs) {
        ht_combine::<F16, true, true>(&a);
    }
}
