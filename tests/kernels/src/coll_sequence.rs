//! Device-callable collectives back to back in one kernel, each on its own
//! data, by coops that change from call to call: what a fused kernel does,
//! checked element by element by the tests (`tests/coll.rs`).

use devcomm_device::arch::thread_rank_in_block;
use devcomm_device::coll::{self, Algorithm, CollContext, Input, Part, RedOp, Reduction};
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
