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
    /// Does nothing. `devcomm-perf --floor` launches it the way the host
    /// collectives launch theirs (the same grid, threads, launch kind and
    /// arguments) to time the launch alone.
    ///
    /// # Safety
    /// None needed; `unsafe` as every kernel entry.
    pub unsafe fn coll_empty(args: CollArgs) {
        let _ = args;
    }
}

kernel! {
    /// One piece of what a collective kernel does, alone (`devcomm-perf
    /// --probe`: launched in a graph back to back, to find what makes two
    /// graphed collective kernels 2.9 µs apart where empty ones are 0.8).
    /// `mode`: 0 nothing; 1 the leader stores 16 bytes into the next LSA
    /// rank's staging area (NVLink, system scope); 2 the same into this
    /// rank's own; 3 every thread writes and reads a 664-byte local array
    /// (the collective kernels' stack frame); 4 the leader runs a
    /// system-scope fence; 5 the leader reads the first word of this rank's
    /// own staging area into `args.errors` (so it is not optimised away:
    /// pass a device word).
    ///
    /// # Safety
    /// `args.ctx` live; no collective runs on it meanwhile (the staging
    /// area is overwritten); `args.errors` a valid `u64` for mode 5.
    pub unsafe fn coll_probe(args: CollArgs, mode: u32) {
        let cta = Cta::new();
        let scratch = args.ctx.scratch();
        let at = args.ctx.stage_area_offset(0);
        match mode {
            1 | 2 if cta.is_leader() => {
                let n = scratch.lsa_size();
                let peer = if mode == 1 { (scratch.lsa_rank() + 1) % n } else { scratch.lsa_rank() };
                atomic::store_pair_relaxed(scratch.lsa_ptr::<u64>(at, peer), [mode as u64, args.count], Scope::Sys);
            }
            3 => {
                let mut frame = [0u64; 83];
                let t = cta.thread_rank() as usize;
                for (i, f) in frame.iter_mut().enumerate() {
                    core::ptr::write_volatile(f, (i + t) as u64);
                }
                let k = (t * 7 + args.count as usize) % frame.len();
                if core::ptr::read_volatile(&frame[k]) == u64::MAX {
                    (args.errors as *mut u64).write_volatile(0);
                }
            }
            4 if cta.is_leader() => atomic::fence_sc(Scope::Sys),
            5 if cta.is_leader() => {
                let v = atomic::load_relaxed(scratch.local_ptr::<u64>(at), Scope::Sys);
                (args.errors as *mut u64).write_volatile(v);
            }
            _ => {}
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

/// The value rank `src` sends rank `dst` from thread `t` of block `b` in
/// epoch `e` of `ll_a2a_exchange` (`dst == 0xff`: its broadcast value).
pub const fn a2a_value(e: u32, src: u32, dst: u32, b: u32, t: u32) -> u64 {
    ((e as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        ^ (src as u64) << 40
        ^ (dst as u64) << 32
        ^ (b as u64) << 16
        ^ t as u64
}

kernel! {
    /// `epochs` epochs of an LL all-to-all session per block (block `b`,
    /// `nt` threads, `n` ranks): thread `t` sends [`a2a_value`] to slot `me
    /// * nt + t` of every rank and broadcasts one to slot `(n + me) * nt +
    /// t`, then receives every source's two and the lane-wise `u32` sum of
    /// the broadcasts (`recv_reduce`), into `out[(((e * blocks + b) * n +
    /// s) * nt + t) * 3 + {0, 1, 2}]`; the first failure's code goes to
    /// `errors`.
    ///
    /// # Safety
    /// `ctx` live with LL all-to-all slots (at least `2 * n * nt`), at
    /// least `gridDim.x` parts; `out` holds the outputs; launched
    /// co-resident on every rank alike.
    pub unsafe fn ll_a2a_exchange(ctx: coll::CollContext, out: *mut u64, epochs: u32, errors: u64) {
        let cta = Cta::new();
        let (b, blocks) = (devcomm_device::arch::block_idx().x, devcomm_device::arch::grid_dim().x);
        let (t, nt) = (cta.thread_rank(), cta.size());
        let (me, n) = (ctx.scratch().lsa_rank(), ctx.scratch().lsa_size());
        let red = Reduction::new(RedOp::Sum, 0u32, n);
        let mut session = match coll::LlA2aSession::new(&cta, &ctx, b) {
            Ok(s) => s,
            Err(e) => {
                if cta.is_leader() {
                    atomic::compare_exchange(errors as *mut u32, 0, e.code(), Order::Relaxed, Scope::Sys);
                }
                return;
            }
        };
        for e in 0..epochs {
            let mut r = Ok(());
            for p in 0..n {
                r = r.and(session.send(p, me * nt + t, a2a_value(e, me, p, b, t)));
            }
            r = r.and(session.bcast((n + me) * nt + t, a2a_value(e, me, 0xff, b, t)));
            let sum = session.recv_reduce(n * nt + t, n, nt, &red);
            for s in 0..n {
                let at = out.add(((((e * blocks + b) * n + s) * nt + t) * 3) as usize);
                match (session.recv(s * nt + t), session.recv((n + s) * nt + t), sum) {
                    (Ok(x), Ok(y), Ok(z)) => {
                        *at = x;
                        *at.add(1) = y;
                        *at.add(2) = z;
                    }
                    (x, y, z) => r = r.and(x.and(y).and(z).map(|_| ())),
                }
            }
            if let Err(err) = session.end_epoch(&cta, r) {
                if cta.is_leader() {
                    atomic::compare_exchange(errors as *mut u32, 0, err.code(), Order::Relaxed, Scope::Sys);
                }
                return;
            }
        }
    }
}

kernel! {
    /// One collective (`which`: 0 all-gather, 1 all-reduce f32 sum) by
    /// every CTA of the grid, as the host collectives run it, with each
    /// CTA's start and end (`%globaltimer`) and SM stamped into `trace`
    /// (`[start, end, sm, error]` per CTA, `u64`s): where a slow call's
    /// time goes (`devcomm-perf --trace`).
    ///
    /// # Safety
    /// As for `devcomm-kernels`' `all_gather` / `all_reduce_f32`; `trace`
    /// holds `4 * grid_dim.x` `u64`s of device memory.
    pub unsafe fn coll_traced(args: CollArgs, which: u32, trace: u64) {
        let cta = Cta::new();
        let start = devcomm_device::arch::global_timer_ns();
        let src = if args.src.in_window != 0 {
            Input::Window(SymPtr::new(args.src.window, args.src.offset))
        } else {
            Input::Local(args.src.ptr as *const f32)
        };
        let r = if which == 0 {
            let args = core::hint::black_box(args);
            coll::all_gather(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut f32, args.count as usize)
        } else {
            let red = Reduction::new(RedOp::Sum, 0.0f32, args.ctx.scratch().lsa_size());
            let algorithm = Algorithm::from_code(args.algorithm).unwrap_or(Algorithm::Auto);
            // As the library's all-reduce kernels do: only the paths other
            // than LL copy the arguments to local memory (black_box).
            match algorithm.resolve(args.count * 4, &args.ctx) {
                Algorithm::Ll => coll::all_reduce(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut f32, args.count as usize, &red, Algorithm::Ll, args.seq),
                algorithm => {
                    let args = core::hint::black_box(args);
                    coll::all_reduce(&cta, &args.ctx, Part::block(), src, args.dst.ptr as *mut f32, args.count as usize, &red, algorithm, args.seq)
                }
            }
        };
        cta.sync();
        if cta.is_leader() {
            let at = (trace as *mut u64).wrapping_add(4 * devcomm_device::arch::block_idx().x as usize);
            at.write_volatile(start);
            at.add(1).write_volatile(devcomm_device::arch::global_timer_ns());
            at.add(2).write_volatile(devcomm_device::arch::sm_id() as u64);
            at.add(3).write_volatile(match r { Ok(()) => 0, Err(e) => e.code() as u64 });
        }
    }
}
