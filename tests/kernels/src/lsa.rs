//! LSA kernels: self-tests of the device API and the benchmarks' kernels.
//!
//! Window layout the tests use (all ranks alike, `slot` a multiple of 16):
//! `[0, lsa_size * slot)` one inbox slot per source LSA rank; after it,
//! whatever the test puts at the offsets it passes.

use devcomm_device::arch::{block_idx, global_timer_ns, grid_dim, thread_idx};
use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::comm::{DevComm, WindowDesc};
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::kernel;
use devcomm_device::lsa::{self, LsaBarrierSession, ReduceOp};

use crate::report::{order_of, report};

/// `rounds` syncs of LSA barrier `index` over the CTA with `order`; the
/// first error is reported and ends the rounds.
///
/// # Safety
/// As for [`LsaBarrierSession::new`] and [`LsaBarrierSession::sync`] (`comm`
/// live with its resource window mapped, barrier `index` used by this CTA
/// alone, every thread of the CTA calls); `errors` as for [`report`].
#[inline(always)]
unsafe fn barrier_rounds(comm: &DevComm, cta: &Cta, index: u32, rounds: u32, order: Order, errors: *mut u32) {
    match LsaBarrierSession::new(cta, comm, index) {
        Ok(mut bar) => {
            for _ in 0..rounds {
                if let Err(e) = bar.sync(cta, order) {
                    report(errors, e.code());
                    break;
                }
            }
        }
        Err(e) => report(errors, e.code()),
    }
}

/// LSA barrier 0 with acq_rel over the CTA, errors reported.
///
/// # Safety
/// As for [`barrier_rounds`] with `index` 0.
#[inline(always)]
unsafe fn barrier0_acq_rel(comm: &DevComm, cta: &Cta, errors: *mut u32) {
    barrier_rounds(comm, cta, 0, 1, Order::AcqRel, errors)
}

/// This LSA rank's ping-pong partner, `lsa_rank ^ pair_xor`, and whether
/// this rank is the lower of the pair (the one that starts each round);
/// `None` when it has none (`pair_xor` 0, or the partner past the team).
fn partner(comm: &DevComm, pair_xor: u32) -> Option<(u32, bool)> {
    let me = comm.lsa_rank();
    let peer = me ^ pair_xor;
    (pair_xor != 0 && peer < comm.lsa_size()).then_some((peer, me < peer))
}

fn op_of(op: u32) -> ReduceOp {
    match op {
        1 => ReduceOp::Prod,
        2 => ReduceOp::Min,
        3 => ReduceOp::Max,
        _ => ReduceOp::Sum,
    }
}

kernel! {
    /// Puts `bytes` of `src` into slot `lsa_rank` of every LSA peer's window
    /// (one block, the CTA as coop), then runs LSA barrier 0 with acq_rel so
    /// every rank's slots are complete when the kernel ends. Errors (code)
    /// go to `errors[0]`, their count to `errors[1]`.
    ///
    /// # Safety
    /// `win` holds `lsa_size` slots of `slot >= bytes` bytes; `src` has `bytes`.
    pub unsafe fn lsa_put_all(comm: DevComm, win: WindowDesc, src: *const u8, bytes: u64, slot: u64, errors: *mut u32) {
        let cta = Cta::new();
        lsa::copy_to_all(&cta, &win, win.lsa_rank() as u64 * slot, src, bytes as usize);
        barrier0_acq_rel(&comm, &cta, errors);
    }

    /// Every thread `t < lsa_size * values` puts `value_base + me * 1000 + t %
    /// values` as a `u64` into peer `t / values`'s slot `lsa_rank`, index
    /// `t % values`, with [`lsa::put_value`]; then LSA barrier 0 (acq_rel).
    ///
    /// # Safety
    /// One block with at least `lsa_size * values` threads; slots of `slot`
    /// bytes hold `values` u64s.
    pub unsafe fn lsa_put_values(comm: DevComm, win: WindowDesc, values: u32, slot: u64, value_base: u64, errors: *mut u32) {
        let cta = Cta::new();
        let t = thread_idx().x;
        if t < comm.lsa_size() * values {
            let (peer, k) = (t / values, t % values);
            let dst = win.lsa_ptr::<u64>(win.lsa_rank() as u64 * slot + k as u64 * 8, peer);
            lsa::put_value(dst, value_base + comm.lsa_rank() as u64 * 1000 + k as u64);
        }
        barrier0_acq_rel(&comm, &cta, errors);
    }

    /// Opens LSA barrier `index` and syncs `rounds` times with `order`
    /// (0 relaxed, 1 acquire, 2 release, 3 acq_rel); reports errors (an index
    /// out of range, a timeout, an abort) in `errors`. With `timeout_ns` > 0
    /// it replaces the communicator's timeout.
    ///
    /// # Safety
    /// `comm` is live.
    pub unsafe fn lsa_barrier_rounds(comm: DevComm, index: u32, rounds: u32, order: u32, timeout_ns: u64, errors: *mut u32) {
        let comm = if timeout_ns > 0 { comm.with_timeout_ns(timeout_ns) } else { comm };
        barrier_rounds(&comm, &Cta::new(), index, rounds, order_of(order), errors);
    }

    /// Waits for the `u64` signal at window offset `sig_off` to reach `least`
    /// (the communicator's abort flag and `timeout_ns` end the wait);
    /// reports the error code, or writes the value seen to `seen`.
    ///
    /// # Safety
    /// `sig_off` is an 8-aligned offset inside `win`.
    pub unsafe fn lsa_wait_signal(comm: DevComm, win: WindowDesc, sig_off: u64, least: u64, timeout_ns: u64, seen: *mut u64, errors: *mut u32) {
        let abort = comm.abort().with_timeout_ns(timeout_ns);
        match lsa::wait_signal(win.local_ptr::<u64>(sig_off), least, &abort) {
            Ok(v) => *seen = v,
            Err(e) => report(errors, e.code()),
        }
    }
}

macro_rules! reduce_kernels {
    ($($name:ident: $t:ty),*) => {$(
        kernel! {
            /// `dst[i] = op over LSA peers of window[offset + i]` for `i < count`
            /// (op: 0 sum, 1 prod, 2 min, 3 max), grid-stride over blocks.
            ///
            /// # Safety
            /// Every peer's window holds `count` elements at `offset`, complete
            /// before the launch; `dst` holds `count`.
            pub unsafe fn $name(win: WindowDesc, offset: u64, count: u64, dst: *mut $t, op: u32) {
                // Each block reduces a contiguous share with the CTA as coop.
                let (b, nb) = (block_idx().x as u64, grid_dim().x as u64);
                let per = count.div_ceil(nb);
                let first = (b * per).min(count);
                let n = per.min(count - first);
                let esz = core::mem::size_of::<$t>() as u64;
                lsa::reduce(&Cta::new(), dst.add(first as usize), &win, offset + first * esz, n as usize, op_of(op));
            }
        }
    )*};
}
reduce_kernels!(
    lsa_reduce_f32: f32,
    lsa_reduce_f64: f64,
    lsa_reduce_i32: i32,
    lsa_reduce_u32: u32,
    lsa_reduce_i64: i64,
    lsa_reduce_u64: u64,
    lsa_reduce_i8: i8,
    lsa_reduce_u8: u8
);

kernel! {
    /// Bandwidth kernel: copies `bytes` from `src` to `dst` (either may be a
    /// peer's LSA address) with every thread of the grid.
    ///
    /// # Safety
    /// Both valid for `bytes`, 16-byte aligned, not overlapping.
    pub unsafe fn lsa_copy(dst: *mut u8, src: *const u8, bytes: u64) {
        // The whole grid shares the copy: neighbouring threads (and blocks)
        // move neighbouring vectors, so the bytes in flight stay contiguous.
        let t = devcomm_device::arch::global_thread_x() as usize;
        let n = devcomm_device::arch::grid_threads_x() as usize;
        lsa::ops::copy_strided(t, n, dst, src, bytes as usize);
    }

    /// `iters` back-to-back copies of `bytes` from `src` to `dst` by the whole
    /// grid inside one kernel (no synchronisation between them): the rate at
    /// which a running kernel can issue puts of that size.
    ///
    /// # Safety
    /// As for [`lsa_copy`].
    pub unsafe fn lsa_copy_repeat(dst: *mut u8, src: *const u8, bytes: u64, iters: u32) {
        let t = devcomm_device::arch::global_thread_x() as usize;
        let n = devcomm_device::arch::grid_threads_x() as usize;
        for _ in 0..iters {
            lsa::ops::copy_strided(t, n, dst, src, bytes as usize);
        }
    }

    /// As [`lsa_copy`] with the bulk-copy engine: block `b` streams chunks
    /// `b, b + gridDim.x, ...` of `chunk` bytes through `stages` shared
    /// buffers (dynamic shared memory: `lsa::ops::copy_bulk_smem_bytes(chunk, stages)`).
    ///
    /// # Safety
    /// As for [`lsa_copy`]; `chunk` a multiple of 16, `stages >= 2`.
    pub unsafe fn lsa_copy_bulk(dst: *mut u8, src: *const u8, bytes: u64, chunk: u32, stages: u32) {
        // Chunk c goes to block c % gridDim.x: the blocks' chunks interleave.
        let (b, nb) = (block_idx().x as usize, grid_dim().x as usize);
        let smem = devcomm_device::arch::dynamic_shared::<u8>();
        lsa::ops::copy_bulk_strided(&Cta::new(), dst, src, bytes as usize, smem, chunk, stages, b, nb);
    }

    /// Put + signal ping-pong between the LSA ranks paired by `pair_xor`
    /// (rank `r` with rank `r ^ pair_xor`; every pair at once; one block).
    ///
    /// The lower rank of a pair, `iters` times: copy `bytes` from its window
    /// at `src_off` to its partner's window at `dst_off`, `sync`, add 1 to
    /// the partner's signal at `sig_off` with release; wait for its own
    /// signal to reach the round. The higher rank mirrors it. `out[0]` gets
    /// the elapsed ns (on the lower rank: the round trips), errors go to
    /// `errors`. Signals must start at 0.
    ///
    /// # Safety
    /// Offsets inside the window; a rank without a partner (`pair_xor` 0,
    /// or `r ^ pair_xor >= lsa_size`) returns.
    pub unsafe fn lsa_pingpong(comm: DevComm, win: WindowDesc, pair_xor: u32, src_off: u64, dst_off: u64, sig_off: u64, bytes: u64, iters: u32, out: *mut u64, errors: *mut u32) {
        let Some((peer, first)) = partner(&comm, pair_xor) else {
            return;
        };
        let me = if first { 0 } else { 1 };
        let cta = Cta::new();
        let leader = cta.is_leader();
        let t0 = global_timer_ns();
        for round in 1..=iters as u64 {
            if me == 1 {
                if leader {
                    if let Err(e) = lsa::wait_signal(win.local_ptr::<u64>(sig_off), round, &comm.abort()) {
                        report(errors, e.code());
                    }
                }
                cta.sync();
            }
            lsa::copy(&cta, win.lsa_ptr(dst_off, peer), win.local_ptr(src_off), bytes as usize);
            cta.sync();
            if leader {
                lsa::signal_add(win.lsa_ptr::<u64>(sig_off, peer), 1);
            }
            if me == 0 {
                if leader {
                    if let Err(e) = lsa::wait_signal(win.local_ptr::<u64>(sig_off), round, &comm.abort()) {
                        report(errors, e.code());
                    }
                }
                cta.sync();
            }
            if atomic::load_relaxed(errors as *const u32, Scope::Gpu) != 0 {
                break;
            }
        }
        if leader {
            *out = global_timer_ns() - t0;
        }
    }

    /// LL ping-pong between the LSA ranks paired by `pair_xor`, as in
    /// [`lsa_pingpong`] (the first `ceil(bytes/4)` lanes of warp 0, at most
    /// 32): each round, the lower rank sends `bytes` from its window at
    /// `src_off` into its partner's LL slot at `slot_off` with flag = round,
    /// and waits for the reply in its own slot (copied to `dst_off`); the
    /// higher rank mirrors it. `out[0]`: elapsed ns. Slots must start zeroed.
    ///
    /// # Safety
    /// Offsets inside the window, the slot `ll::slot_bytes(bytes)` long and
    /// 8-aligned; a rank without a partner returns.
    pub unsafe fn lsa_pingpong_ll(comm: DevComm, win: WindowDesc, pair_xor: u32, src_off: u64, dst_off: u64, slot_off: u64, bytes: u64, iters: u32, out: *mut u64, errors: *mut u32) {
        let Some((peer, first)) = partner(&comm, pair_xor) else {
            return;
        };
        let me = if first { 0 } else { 1 };
        // As many lanes as the message has LL words (at most a warp).
        let lanes = (bytes.div_ceil(4)).clamp(1, 32) as u32;
        if devcomm_device::arch::lane_id() >= lanes || devcomm_device::arch::warp_id() > 0 {
            return;
        }
        let warp = devcomm_device::coop::Lanes::new(if lanes == 32 { u32::MAX } else { (1u32 << lanes) - 1 });
        let (src, dst) = (win.local_ptr::<u8>(src_off), win.local_ptr::<u8>(dst_off));
        let (mine, theirs) = (win.local_ptr::<u64>(slot_off), win.lsa_ptr::<u64>(slot_off, peer));
        let t0 = global_timer_ns();
        for round in 1..=iters {
            if me == 1 {
                if let Err(e) = lsa::ll::wait(&warp, mine, dst, bytes as usize, round, &comm.abort()) {
                    report(errors, e.code());
                    break;
                }
            }
            lsa::ll::put(&warp, theirs, src, bytes as usize, round);
            if me == 0 {
                if let Err(e) = lsa::ll::wait(&warp, mine, dst, bytes as usize, round, &comm.abort()) {
                    report(errors, e.code());
                    break;
                }
            }
        }
        if warp.is_leader() {
            *out = global_timer_ns() - t0;
        }
    }

    /// Every LSA rank sends `bytes` from its window at `src_off` into the LL
    /// slot at `slot_off` of LSA rank `lsa_rank + 1` (mod size) with `flag`,
    /// then waits for its own slot and copies the payload to `dst_off`.
    ///
    /// # Safety
    /// As for [`lsa_pingpong_ll`]; one warp.
    pub unsafe fn lsa_ll_ring(comm: DevComm, win: WindowDesc, src_off: u64, dst_off: u64, slot_off: u64, bytes: u64, flag: u32, errors: *mut u32) {
        let warp = devcomm_device::coop::Warp::new();
        let next = (comm.lsa_rank() + 1) % comm.lsa_size();
        lsa::ll::put(&warp, win.lsa_ptr::<u64>(slot_off, next), win.local_ptr::<u8>(src_off), bytes as usize, flag);
        if let Err(e) = lsa::ll::wait(&warp, win.local_ptr::<u64>(slot_off), win.local_ptr::<u8>(dst_off), bytes as usize, flag, &comm.abort()) {
            report(errors, e.code());
        }
    }

    /// `rounds` LSA barrier syncs (barrier 0, order as in
    /// `lsa_barrier_rounds`) in one block; `out[0]` gets the elapsed ns.
    ///
    /// # Safety
    /// `comm` is live with at least one LSA barrier.
    pub unsafe fn lsa_barrier_bench(comm: DevComm, rounds: u32, order: u32, out: *mut u64, errors: *mut u32) {
        let cta = Cta::new();
        let t0 = global_timer_ns();
        barrier_rounds(&comm, &cta, 0, rounds, order_of(order), errors);
        if cta.is_leader() {
            *out = global_timer_ns() - t0;
        }
    }

    /// One thread adds `value` to the `u64` signal at window offset `sig_off`
    /// of LSA peer `peer` with release at system scope.
    ///
    /// # Safety
    /// `sig_off` is an 8-aligned offset inside `win`; `peer < lsa_size`.
    pub unsafe fn lsa_signal(win: WindowDesc, peer: u32, sig_off: u64, value: u64) {
        if thread_idx().x == 0 && block_idx().x == 0 {
            lsa::signal_add(win.lsa_ptr::<u64>(sig_off, peer), value);
        }
    }

    /// One thread stores `value` at `dst` with a release store at system
    /// scope (a host-visible flag for tests).
    ///
    /// # Safety
    /// `dst` is a valid `u32`.
    pub unsafe fn store_flag(dst: *mut u32, value: u32) {
        if thread_idx().x == 0 && block_idx().x == 0 {
            atomic::store_release(dst, value, Scope::Sys);
        }
    }
}
