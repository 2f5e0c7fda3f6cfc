//! A whole MoE layer in one kernel, on the device API of
//! [`devcomm_device::moe`]: dispatch, each local expert started as soon as
//! its own tokens are in (the per-expert receive wait), its output sent
//! back at once, then combine: what `tests/moe.rs` checks the fused path
//! and the receive hook with; and the high-throughput dispatch with its
//! per-expert hook ([`devcomm_device::moe::ht`]) fused with the experts.

use devcomm_device::arch::{block_dim, block_idx, global_thread_x, grid_dim, grid_threads_x, warp_id, WARP_SIZE};
use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::coop::{Coop, Cta, Warp};
use devcomm_device::kernel;
use devcomm_device::moe::{self, ht, CombineForm, MoeArgs, MoeError, MoeHtArgs};

/// Records the first error in `errors[0]`.
///
/// # Safety
/// `errors` is a valid device `u32`.
unsafe fn report<T>(errors: u64, r: Result<T, MoeError>) {
    if let Err(e) = r {
        // SAFETY: the contract.
        unsafe { atomic::compare_exchange(errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys) };
    }
}

/// Local expert `l` once its receive hook returned `r` (its token count,
/// or an error: reported, no tokens): `y = x * (e + 1) + 0.5` with `e` the
/// global expert id, from its packed rows of `args.out` into the same rows
/// of `expert_out`; records `count | (k << 24)` in `order[l]`; then joins
/// the warp.
///
/// # Safety
/// As for the kernels below; every lane of the warp calls it.
unsafe fn run_expert(
    warp: &Warp,
    args: &MoeArgs,
    l: u32,
    r: Result<u32, MoeError>,
    expert_out: *mut f32,
    order: *mut u32,
    k: u32,
) {
    let ctx = &args.ctx;
    let (n, m, h) = (ctx.comm().nranks() as usize, ctx.max_tokens() as usize, ctx.hidden() as usize);
    let count = match r {
        Ok(c) => c as usize,
        Err(e) => {
            if warp.is_leader() {
                // SAFETY: the contract.
                unsafe { report(args.errors, Err::<(), _>(e)) };
            }
            0
        }
    };
    let expert = (ctx.comm().rank() * ctx.local_experts() + l) as f32;
    let base = l as usize * n * m * h;
    let mut j = warp.thread_rank() as usize;
    while j < count * h {
        // SAFETY: rows of expert `l` (`count` of them) of both buffers.
        unsafe {
            let xin = *(args.out as *const f32).add(base + j);
            *expert_out.add(base + j) = xin * (expert + 1.0) + 0.5;
        }
        j += WARP_SIZE as usize;
    }
    if warp.is_leader() {
        // SAFETY: `l < L`: inside `order`.
        unsafe { *order.add(l as usize) = count as u32 | (k << 24) };
    }
    warp.sync();
}

kernel! {
    /// One MoE layer on f32 tokens: dispatch (as the library's kernel),
    /// then warp `w` of the grid, for local experts `L - 1 - w, L - 1 - w -
    /// W, ...` (the last first), waits for that expert's tokens (its receive
    /// hook, `dispatch_wait_expert`, whose count must match the packing's),
    /// packs them into `args.out`, computes the expert, `y = x * (e + 1) +
    /// 0.5` with `e` the global expert id, into `expert_out` (same layout),
    /// records the expert's count in `order[l]` together with its rank in
    /// the warp's order (`count | (k << 24)`), and sends the outputs back
    /// per expert (`CombineForm::PerExpert`, where the library's combine
    /// sends per rank); then every CTA waits for every expert's outputs and
    /// the grid combines into `y` (`args.topk_idx`/`topk_weights` are the
    /// handle's copies made by the dispatch step).
    ///
    /// # Safety
    /// `args` as `devcomm::moe::EpGroup::dispatch_into` fills it (f32
    /// group), `expert_out` of `args.out`'s size, `y` of `num_tokens *
    /// hidden` f32, `order` of `L` `u32`s; launched co-resident, block size
    /// a multiple of 32; the same `seq` on every rank.
    pub unsafe fn moe_fused_layer_f32(args: MoeArgs, expert_out: *mut f32, y: *mut f32, order: *mut u32) {
        let ctx = &args.ctx;
        let num_tokens = args.num_tokens;
        let pos = args.pos as *mut u32;
        let r = moe::dispatch_prepare(
            global_thread_x() as usize, grid_threads_x() as usize, ctx, args.topk_idx as *const i32,
            args.topk_weights as *const f32, num_tokens, pos, args.handle_idx as *mut i32,
            args.handle_weights as *mut f32,
        );
        report(args.errors, r);
        let warp = Warp::new();
        let per_block = block_dim().x / WARP_SIZE;
        let (w, nw) = (block_idx().x * per_block + warp_id(), grid_dim().x * per_block);
        let mut t = w;
        while t < ctx.max_tokens() {
            let r = moe::dispatch_send_token(&warp, ctx, t, args.x as *const u8, args.topk_idx as *const i32, args.topk_weights as *const f32, num_tokens, args.seq);
            if warp.is_leader() {
                report(args.errors, r);
            }
            t += nw;
        }
        let mut e = w;
        while e < ctx.num_experts() {
            let r = moe::dispatch_send_expert(&warp, ctx, e, args.x as *const u8, args.topk_idx as *const i32, num_tokens, pos, args.seq);
            if warp.is_leader() {
                report(args.errors, r);
            }
            e += nw;
        }
        let l_all = ctx.local_experts();
        let mut k = 0u32;
        let mut i = w;
        while i < l_all {
            let l = l_all - 1 - i;
            // The hook alone first (it counts), then the hook that packs:
            // both must see the same count.
            let waited = moe::dispatch_wait_expert(&warp, ctx, l, args.seq);
            let r = moe::dispatch_recv_expert(&warp, ctx, l, args.out as *mut u8, args.scales as *mut u8, args.counts as *mut u32, args.seq);
            let r = match (waited, r) {
                (Ok(w), Ok(c)) if w != c => Err(MoeError::OutOfStep),
                (Err(e), _) => Err(e),
                (_, r) => r,
            };
            run_expert(&warp, &args, l, r, expert_out, order, k);
            let r = moe::combine_send_expert(&warp, ctx, l, expert_out as *const u8, CombineForm::PerExpert, args.seq);
            if warp.is_leader() {
                report(args.errors, r);
            }
            k += 1;
            i += nw;
        }
        let cta = Cta::new();
        let r = moe::combine_wait(&cta, ctx, CombineForm::PerExpert, args.seq);
        if r.is_err() {
            if cta.is_leader() {
                report(args.errors, r);
            }
            return;
        }
        moe::combine_reduce::<f32>(
            global_thread_x() as usize, grid_threads_x() as usize, ctx, CombineForm::PerExpert, args.handle_idx as *const i32,
            args.handle_weights as *const f32, pos, num_tokens, y,
        );
    }
}

kernel! {
    /// A high-throughput dispatch fused with the experts, on f32 tokens:
    /// prepare, then warp `w` of the grid sends (destination, channel)
    /// items `w, w + W, ...`, then takes local experts `L - 1 - w, L - 1 -
    /// w - W, ...` (the last first), each started by its own receive hook
    /// (`ht::dispatch_recv_expert`: the wait and that expert's packing),
    /// computes it (`y = x * (e + 1) + 0.5`) into `expert_out`, and
    /// records `count | (k << 24)` in `order[l]` (`k`: its turn in the
    /// warp). The library's high-throughput combine kernel follows.
    ///
    /// # Safety
    /// `a` as `devcomm::moe::EpGroup::dispatch_into` fills it on a
    /// high-throughput f32 group (with the handle's tables), `expert_out`
    /// of `a.args.out`'s size, `order` of `L` `u32`s; launched
    /// co-resident, block size a multiple of 32; the same `seq` on every rank.
    pub unsafe fn moe_ht_fused_experts_f32(a: MoeHtArgs, expert_out: *mut f32, order: *mut u32) {
        let args = &a.args;
        let ctx = &args.ctx;
        let num_tokens = args.num_tokens;
        let r = moe::dispatch_prepare(
            global_thread_x() as usize, grid_threads_x() as usize, ctx, args.topk_idx as *const i32,
            args.topk_weights as *const f32, num_tokens, args.pos as *mut u32, args.handle_idx as *mut i32,
            args.handle_weights as *mut f32,
        );
        report(args.errors, r);
        let warp = Warp::new();
        let per_block = block_dim().x / WARP_SIZE;
        let (w, nw) = (block_idx().x * per_block + warp_id(), grid_dim().x * per_block);
        let (n, g) = (ctx.comm().nranks(), ctx.channels());
        let mut i = w;
        while i < n * g {
            let r = ht::dispatch_send_channel(
                &warp, ctx, i / g, i % g, args.x as *const u8, args.topk_idx as *const i32,
                args.topk_weights as *const f32, num_tokens, a.rank_pos as *mut u32, core::ptr::null_mut(), args.seq,
            );
            if warp.is_leader() {
                report(args.errors, r);
            }
            i += nw;
        }
        let l_all = ctx.local_experts();
        let mut k = 0u32;
        let mut i = w;
        while i < l_all {
            let l = l_all - 1 - i;
            let r = ht::dispatch_recv_expert(
                &warp, ctx, l, args.out as *mut u8, args.counts as *mut u32, a.recv_rows as *mut u32, args.seq,
            );
            run_expert(&warp, args, l, r, expert_out, order, k);
            k += 1;
            i += nw;
        }
    }
}

kernel! {
    /// The low-latency steps' refusals, each thread's own result: thread
    /// `g` of the grid writes `codes[REFUSAL_CODES * g + k]` (0 for `Ok`,
    /// else the error's code) for `k` =
    /// 0. `moe::lsa::dispatch_send_token` of slot 0 (called only when bit
    ///    0 of `calls` is set: on a group it serves it would send);
    /// 1. `moe::lsa::dispatch_pack_expert` of local expert 0 (only with
    ///    bit 1: on a group it serves it would pack);
    /// 2. `moe::dispatch_pack_expert_part` with part 2 of 2 (always);
    /// 3. `moe::lsa::dispatch_send_token_streamed` of slot 0 (bit 0);
    /// 4. `moe::lsa::dispatch_recv_token` of slot (0, 0), part 2 of 2 (always);
    /// 5. the same, part 0 of 1 (bit 1: it would wait for the slot);
    /// 6. `moe::lsa::dispatch_recv_count` of local expert 0 (bit 2: it
    ///    would wait for the counts);
    /// 7. `moe::lsa::dispatch_send_count` of expert `(calls >> 8) - 1`
    ///    (when `calls >> 8` is not 0: an expert of a rank outside the LSA
    ///    team).
    /// Codes of calls not made are left as they were.
    ///
    /// Each refuses before anything is read or written but `codes`.
    ///
    /// # Safety
    /// `args` as `devcomm::moe::EpGroup::dispatch_into` fills it, `codes`
    /// of [`REFUSAL_CODES`] `u32`s per thread of the grid; block size a
    /// multiple of 32.
    pub unsafe fn moe_lsa_refusals(args: MoeArgs, calls: u32, codes: *mut u32) {
        let ctx = &args.ctx;
        let cta = Cta::new();
        let at = REFUSAL_CODES * global_thread_x() as usize;
        let code = |r: Result<u32, MoeError>| match r {
            Ok(_) => 0,
            Err(e) => e.code(),
        };
        let (x, idx, w) = (args.x as *const u8, args.topk_idx as *const i32, args.topk_weights as *const f32);
        let (out, counts) = (args.out as *mut u8, args.counts as *mut u32);
        if calls & 1 != 0 {
            let r = moe::lsa::dispatch_send_token(&cta, ctx, 0, x, idx, w, args.num_tokens, args.seq);
            *codes.add(at) = code(r.map(|_| 0));
            let r = moe::lsa::dispatch_send_token_streamed(&cta, ctx, 0, x, idx, w, args.num_tokens, args.seq);
            *codes.add(at + 3) = code(r.map(|_| 0));
        }
        if calls & 2 != 0 {
            let r = moe::lsa::dispatch_pack_expert(&cta, ctx, 0, out, counts, args.seq);
            *codes.add(at + 1) = code(r);
            let r = moe::lsa::dispatch_recv_token(&cta, ctx, 0, 0, moe::PackPart::WHOLE, out, args.seq);
            *codes.add(at + 5) = code(r.map(|_| 0));
        }
        if calls & 4 != 0 {
            *codes.add(at + 6) = code(moe::lsa::dispatch_recv_count(&cta, ctx, 0, counts, args.seq));
        }
        if calls >> 8 != 0 {
            let r = moe::lsa::dispatch_send_count(&cta, ctx, (calls >> 8) - 1, idx, args.num_tokens, args.seq);
            *codes.add(at + 7) = code(r);
        }
        let r = moe::dispatch_pack_expert_part(
            &cta, ctx, 0, moe::PackPart::new(2, 2), out, args.scales as *mut u8, counts, args.seq,
        );
        *codes.add(at + 2) = code(r);
        let r = moe::lsa::dispatch_recv_token(&cta, ctx, 0, 0, moe::PackPart::new(2, 2), out, args.seq);
        *codes.add(at + 4) = code(r.map(|_| 0));
    }
}

/// Codes per thread that `moe_lsa_refusals` writes.
pub const REFUSAL_CODES: usize = 8;
