//! Device-callable collectives back to back in one kernel, each on its own
//! data, by coops that change from call to call: what a fused kernel does,
//! checked element by element by the tests (`tests/coll.rs`).

use devcomm_device::arch::thread_rank_in_block;
use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::coll::{self, Algorithm, CollContext, CollError, Input, Part, RedOp, Reduction};
use devcomm_device::coop::{Coop, Cta, Warp};
use devcomm_device::kernel;

use crate::report::report;

kernel! {
    /// `iters` one-shot f32 sum all-reduces of `count` elements, the
    /// `i`-th from `src + i * count` (local device memory) into `dst + i *
    /// count`, by every CTA of the grid (CTA `b` is part `b`): odd calls by
    /// the CTA's first warp alone (a [`Warp`] coop; the others wait at the
    /// block's barrier), even calls by the whole CTA (any block size, a
    /// partial last warp too). The first failure ends the calls; its code
    /// goes to `errors` (two `u32`s, as `report` keeps them).
    ///
    /// # Safety
    /// `ctx` is a live context of at least `grid_dim.x` parts on every
    /// rank, launched co-resident with the same grid and block on every
    /// rank; `src` and `dst` hold `iters * count` floats.
    pub unsafe fn all_reduce_sequence_f32(ctx: CollContext, src: u64, dst: u64, count: u64, iters: u32, errors: u64) {
        let cta = Cta::new();
        let red = Reduction::new(RedOp::Sum, 0.0f32, ctx.scratch().lsa_size());
        let n = count as usize;
        for i in 0..iters as usize {
            let s = Input::Local((src as *const f32).wrapping_add(i * n));
            let d = (dst as *mut f32).wrapping_add(i * n);
            let r = if i % 2 == 1 {
                let r = if thread_rank_in_block() < 32 {
                    // SAFETY: the kernel's contract; warp 0 is this part's
                    // only coop until the block's barrier below.
                    unsafe { coll::all_reduce(&Warp::new(), &ctx, Part::block(), s, d, n, &red, Algorithm::OneShot, 0) }
                } else {
                    Ok(())
                };
                cta.agree(r)
            } else {
                // SAFETY: the kernel's contract; the block is the part's coop.
                unsafe { coll::all_reduce(&cta, &ctx, Part::block(), s, d, n, &red, Algorithm::OneShot, 0) }
            };
            if let Err(e) = r {
                if cta.is_leader() {
                    // SAFETY: the kernel's contract.
                    unsafe { report(errors as *mut u32, e.code()) };
                }
                return;
            }
        }
    }
}

kernel! {
    /// The pushed one-shot all-reduce whose reduction fails on every rank,
    /// then the same call that works: `coll::all_reduce_pushed_by` makes
    /// the reduction after the part's pushes, and an error there must
    /// return on every rank before anyone arrives at the barrier (nothing
    /// waits) and leave the barrier's epochs as they were (the next call
    /// meets). f32 sums of `count` elements from `src` into `dst`, by every
    /// CTA (CTA `b` is part `b`). `codes[0]` counts the CTAs whose first
    /// call returned `BadArgument`; `codes[1]` gets the second call's first
    /// error code (0 when every CTA's worked).
    ///
    /// # Safety
    /// As for [`all_reduce_sequence_f32`]; `src` and `dst` hold `count`
    /// floats; `codes` two `u32`s, zeroed.
    pub unsafe fn all_reduce_pushed_failing_f32(ctx: CollContext, src: u64, dst: u64, count: u64, codes: u64) {
        let cta = Cta::new();
        let (s, d, n) = (src as *const f32, dst as *mut f32, count as usize);
        let codes = codes as *mut u32;
        let failing = || Err(CollError::BadArgument);
        // SAFETY: the kernel's contract; the block is the part's coop;
        // `failing` fails alike on every rank.
        let first = unsafe { coll::all_reduce_pushed_by(&cta, &ctx, Part::block(), s, d, n, failing) };
        let red = Reduction::new(RedOp::Sum, 0.0f32, ctx.scratch().lsa_size());
        // SAFETY: as above.
        let second = unsafe { coll::all_reduce_pushed(&cta, &ctx, Part::block(), s, d, n, &red) };
        if cta.is_leader() {
            // SAFETY: the kernel's contract: `codes` holds two `u32`s.
            unsafe {
                if matches!(first, Err(CollError::BadArgument)) {
                    atomic::red_add_relaxed(codes, 1u32, Scope::Gpu);
                }
                if let Err(e) = second {
                    atomic::compare_exchange(codes.add(1), 0, e.code(), Order::Relaxed, Scope::Gpu);
                }
            }
        }
    }
}
