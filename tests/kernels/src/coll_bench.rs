//! Collectives back to back inside one kernel: what a fused kernel pays per
//! collective (the "in-kernel" column of `devcomm-perf`).

use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::coll::{self, Algorithm, CollArgs, Input, Part, RedOp, Reduction};
use devcomm_device::comm::SymPtr;
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::kernel;

kernel! {
    /// `iters` f32 sum all-reduces of `args.count` elements from `args.src`
    /// into `args.dst`, by every CTA of the grid (CTA `b` is part `b`), the
    /// `i`-th with sequence number `args.seq + i`; the first failure's code
    /// goes to `args.errors`.
    ///
    /// # Safety
    /// As for `devcomm-kernels`' `all_reduce_f32`; the host reserved
    /// `iters` sequence numbers from `args.seq` on.
    pub unsafe fn all_reduce_loop_f32(args: CollArgs, iters: u32) {
        let cta = Cta::new();
        let red = Reduction::new(RedOp::Sum, 0.0f32, args.ctx.scratch().lsa_size());
        let src = if args.src.in_window != 0 {
            Input::Window(SymPtr::new(args.src.window, args.src.offset))
        } else {
            Input::Local(args.src.ptr as *const f32)
        };
        let algorithm = Algorithm::from_code(args.algorithm).unwrap_or(Algorithm::Auto);
        for i in 0..iters {
            let r = coll::all_reduce(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut f32, args.count as usize, &red, algorithm, args.seq.wrapping_add(i));
            if let Err(e) = r {
                if cta.is_leader() {
                    atomic::compare_exchange(args.errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys);
                }
                return;
            }
        }
    }
}

kernel! {
    /// A user kernel's own point-to-point exchange: CTA 0 sends `send`,
    /// CTA 1 receives `recv` (each [`Part::WHOLE`]), on `ctx`'s channels;
    /// the first failure's code goes to `errors`. Launch co-resident with
    /// 2 CTAs.
    ///
    /// # Safety
    /// `ctx` live with channels; the operations' buffers valid for their
    /// bytes; sequence numbers reserved with `Collectives::reserve_p2p`,
    /// the peers' matching alike; `errors` a device `u32`.
    pub unsafe fn p2p_exchange(ctx: coll::CollContext, send: coll::P2pOp, recv: coll::P2pOp, errors: u64) {
        let cta = Cta::new();
        let r = if devcomm_device::arch::block_idx().x == 0 {
            coll::send(&cta, &ctx, Part::WHOLE, &send)
        } else {
            coll::recv(&cta, &ctx, Part::WHOLE, &recv)
        };
        if let Err(e) = r {
            if cta.is_leader() {
                atomic::compare_exchange(errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys);
            }
        }
    }
}
