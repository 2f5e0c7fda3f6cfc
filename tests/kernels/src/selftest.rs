//! Small kernels that check a runtime works: thread geometry, faults,
//! scoped atomics, coops, warp intrinsics, device math, reductions.

use devcomm_device::arch::{block_idx, dynamic_shared, global_thread_x, grid_threads_x, sync_threads, thread_idx};
use devcomm_device::kernel;

kernel! {
    /// Writes `out[i] = i` for every global thread, but the thread whose
    /// global index is `trap_index` traps first (`u32::MAX`: nobody traps).
    /// Used to check that a kernel fault surfaces as an error, not a hang:
    /// the other threads of the trapping block wait at a barrier it never
    /// reaches.
    ///
    /// # Safety
    /// `out` has `gridDim.x * blockDim.x` elements.
    pub unsafe fn trap_at(out: *mut u32, trap_index: u32) {
        let g = global_thread_x();
        if g == trap_index {
            devcomm_device::arch::trap();
        }
        sync_threads();
        *out.add(g as usize) = g;
    }
}

kernel! {
    /// Every thread writes its coordinates: six `u32`s (threadIdx x,y,z then
    /// blockIdx x,y,z) at slot `block_rank * threads_per_block + thread_rank`.
    ///
    /// # Safety
    /// `out` has `6 * total threads` elements.
    pub unsafe fn geometry(out: *mut u32) {
        use devcomm_device::arch::{block_rank_in_grid, thread_rank_in_block, threads_per_block};
        let slot = (block_rank_in_grid() * threads_per_block() + thread_rank_in_block()) as usize * 6;
        let (t, b) = (thread_idx(), block_idx());
        for (k, v) in [t.x, t.y, t.z, b.x, b.y, b.z].into_iter().enumerate() {
            *out.add(slot + k) = v;
        }
    }
}

kernel! {
    /// Every thread adds 1 to `counter` with each scoped read-modify-write
    /// flavour, then the last thread to arrive (seen through `fetch_add` on
    /// `arrivals`) publishes the total with a release store and everybody
    /// checks it after an acquire load. Leaves `counter = 3 * threads`.
    ///
    /// # Safety
    /// `counter`, `arrivals` and `published` are `u64`s in device memory,
    /// zero before the launch.
    pub unsafe fn atomics_smoke(counter: *mut u64, arrivals: *mut u32, published: *mut u64, failures: *mut u32) {
        use devcomm_device::atomic::{self, Order, Scope};
        atomic::fetch_add(counter, 1, Order::Relaxed, Scope::Gpu);
        atomic::red_add_release(counter, 1u64, Scope::Sys);
        let mut seen = atomic::load_relaxed(counter as *const u64, Scope::Gpu);
        while atomic::compare_exchange(counter, seen, seen + 1, Order::AcqRel, Scope::Gpu) != seen {
            seen = atomic::load_relaxed(counter as *const u64, Scope::Gpu);
        }
        let total = devcomm_device::arch::grid_threads_x() * devcomm_device::arch::grid_dim().y.max(1);
        let before = atomic::fetch_add(arrivals, 1, Order::AcqRel, Scope::Gpu);
        if before + 1 == total {
            let c = atomic::load_acquire(counter as *const u64, Scope::Gpu);
            atomic::store_release(published, c, Scope::Sys);
        }
        let mut p = atomic::load_acquire(published as *const u64, Scope::Sys);
        while p == 0 {
            devcomm_device::arch::spin_backoff(32);
            p = atomic::load_acquire(published as *const u64, Scope::Sys);
        }
        atomic::fence_sc(Scope::Sys);
        if p != 3 * total as u64 {
            atomic::red_add_relaxed(failures, 1u32, Scope::Gpu);
        }
    }
}

/// One round of a coop check: each member writes a value derived from its
/// rank into `smem[base + rank]`, syncs, reads its right neighbour's, syncs.
/// Returns 1 if the neighbour's value was wrong.
///
/// # Safety
/// `smem` is valid for `base + c.size()` `u32`s that only this coop uses
/// meanwhile; every thread of `c` calls it.
#[inline(always)]
unsafe fn coop_round<C: devcomm_device::coop::Coop>(c: &C, smem: *mut u32, base: u32, round: u32) -> u32 {
    let (r, n) = (c.thread_rank(), c.size());
    *smem.add((base + r) as usize) = r * 7 + round;
    c.sync();
    let next = (r + 1) % n;
    let got = *smem.add((base + next) as usize);
    c.sync();
    (got != next * 7 + round) as u32
}

kernel! {
    /// Exercises every coop on a block of 128 threads (4 warps): for each,
    /// adds its failures to `failures[k]` (k: 0 warp, 1 tile<8>, 2 lanes
    /// 0x0f0f0f0f, 3 warp span of warps 1..=2, 4 CTA) and its `size()` seen by
    /// the leader to `sizes[k]` (summed over leaders).
    ///
    /// Each coop uses its own 128-word region of shared memory, so a fast
    /// coop moving on cannot overwrite what a slower one still reads.
    ///
    /// # Safety
    /// `blockDim.x == 128`, 2560 bytes of dynamic shared memory, `failures`
    /// and `sizes` have 5 zeroed elements.
    pub unsafe fn coop_check(failures: *mut u32, sizes: *mut u32) {
        use devcomm_device::arch::{lane_id, warp_id};
        use devcomm_device::atomic::{red_add_relaxed, Scope};
        use devcomm_device::coop::{Coop, Cta, Lanes, Tile, Warp, WarpSpan};
        let smem = dynamic_shared::<u32>();
        let (w, l) = (warp_id(), lane_id());
        let record = |k: usize, fail: u32, leader: bool, size: u32| {
            red_add_relaxed(failures.add(k), fail, Scope::Gpu);
            if leader {
                red_add_relaxed(sizes.add(k), size, Scope::Gpu);
            }
        };
        for round in 0..3 {
            let warp = Warp::new();
            record(0, coop_round(&warp, smem, w * 32, round), warp.is_leader() && round == 0, warp.size());
            let tile = Tile::<8>::new();
            record(1, coop_round(&tile, smem, 128 + w * 32 + l / 8 * 8, round), tile.is_leader() && round == 0, tile.size());
            let lanes = Lanes::new(0x0f0f_0f0f);
            if lanes.mask() & (1 << l) != 0 {
                record(2, coop_round(&lanes, smem, 256 + w * 32, round), lanes.is_leader() && round == 0, lanes.size());
            }
            let span = WarpSpan::new(1, 2, 1);
            if (1..=2).contains(&w) {
                record(3, coop_round(&span, smem, 384 + 32, round), span.is_leader() && round == 0, span.size());
            }
            let cta = Cta::new();
            cta.sync();
            record(4, coop_round(&cta, smem, 512, round), cta.is_leader() && round == 0, cta.size());
        }
    }
}

kernel! {
    /// Checks `match_any`, `shfl` and `active_mask` in full and partial
    /// masks: thread `t` of the grid writes `out[3 t..3 t + 3]` =
    /// (match_any of the full warp on `lane % 3`, the value `lane * 7 + 1000 w`
    /// shuffled from lane `(lane + 5) % 32`, and — for the odd lanes, in a
    /// mask of odd lanes — match_any on `lane / 8` | whether `active_mask`
    /// held the caller (bit 32)).
    ///
    /// # Safety
    /// `out` has 3 words per thread of the grid; `blockDim.x` is a multiple of 32.
    pub unsafe fn warp_intrinsics(out: *mut u64) {
        use devcomm_device::arch::{active_mask, block_dim, block_idx, lane_id, match_any, shfl, warp_id};
        let t = (block_idx().x * block_dim().x + thread_idx().x) as usize;
        let (lane, w) = (lane_id(), warp_id() as u64);
        let full = u32::MAX;
        let m = match_any(full, (lane % 3) as u64);
        let v = shfl(full, lane as u64 * 7 + 1000 * w + (1 << 40), (lane + 5) % 32);
        let mut odd = 0u64;
        if lane % 2 == 1 {
            odd = match_any(0xaaaa_aaaa, (lane / 8) as u64) as u64;
        }
        let held = active_mask() & (1 << lane) != 0;
        *out.add(3 * t) = m as u64;
        *out.add(3 * t + 1) = v;
        *out.add(3 * t + 2) = odd | (held as u64) << 32;
    }
}

kernel! {
    /// Every thread of the block brings `values[t]` (`t` its linear thread
    /// rank) to coop `kind` (0 thread, 1 warp, 2 `Tile<8>`, 3 `Lanes` of
    /// mask `0x0f0f0f0f`, 4 `WarpSpan` of warps 1 and 2 with barrier 1,
    /// 5 CTA; threads outside the coop sit out) and writes what
    /// `Coop::sync_max` gave it to `max[t]`, then what `Coop::agree` gave it
    /// for a result that is `Err(Aborted)` when `values[t] % 11 == 5`, else
    /// `Err(Timeout)` when `values[t] % 7 == 3`, else `Ok(values[t])` to
    /// `agreed[t]` (the error's code, or the `Ok` value). Sitting-out threads
    /// leave both untouched.
    ///
    /// # Safety
    /// One block of at most 1024 threads (96 or more for kind 4); the
    /// buffers hold `blockDim.x` elements.
    pub unsafe fn coop_sync_max(kind: u32, values: *const u32, max: *mut u32, agreed: *mut u32) {
        use devcomm_device::arch::{lane_id, thread_rank_in_block, warp_id};
        use devcomm_device::coop::{Coop, Cta, Lanes, ThreadCoop, Tile, Warp, WarpSpan};
        use devcomm_device::error::ErrorCode;
        use devcomm_device::wait::WaitError;
        let t = thread_rank_in_block() as usize;
        let v = *values.add(t);
        let mine: Result<u32, WaitError> = if v % 11 == 5 {
            Err(WaitError::Aborted)
        } else if v % 7 == 3 {
            Err(WaitError::Timeout)
        } else {
            Ok(v)
        };
        /// # Safety
        /// `max` and `agreed` are valid for a `u32` write each, this thread's
        /// own; every thread of `c` calls it.
        unsafe fn run<C: Coop>(c: &C, v: u32, mine: Result<u32, WaitError>, max: *mut u32, agreed: *mut u32) {
            *max = c.sync_max(v);
            *agreed = match c.agree(mine) {
                Ok(x) => x,
                Err(e) => ErrorCode::code(e),
            };
        }
        let (m, a) = (max.add(t), agreed.add(t));
        match kind {
            0 => run(&ThreadCoop, v, mine, m, a),
            1 => run(&Warp::new(), v, mine, m, a),
            2 => run(&Tile::<8>::new(), v, mine, m, a),
            3 => {
                let lanes = Lanes::new(0x0f0f_0f0f);
                if lanes.mask() & (1 << lane_id()) != 0 {
                    run(&lanes, v, mine, m, a)
                }
            }
            4 => {
                if (1..=2).contains(&warp_id()) {
                    run(&WarpSpan::new(1, 2, 1), v, mine, m, a)
                }
            }
            _ => run(&Cta::new(), v, mine, m, a),
        }
    }
}

/// Results per element of [`math_f32()`].
pub const MATH_F32_OUTPUTS: usize = 10;
/// Results per element of [`math_f64()`].
pub const MATH_F64_OUTPUTS: usize = 5;

kernel! {
    /// Device math on `f32`, grid-stride: for each `i < n`, writes
    /// `out[10 i..10 i + 10]` = sqrt(x), rsqrt(x), exp(y), log(x), exp2(y),
    /// log2(x), fma(x, y, z), min(y, z), max(y, z), sqrt(-x) (NaN for x > 0).
    ///
    /// # Safety
    /// `x`, `y`, `z` hold `n` elements, `out` `10 n`.
    pub unsafe fn math_f32(x: *const f32, y: *const f32, z: *const f32, out: *mut f32, n: u32) {
        use devcomm_device::math;
        let mut i = global_thread_x();
        while i < n {
            let k = i as usize;
            let (a, b, c) = (*x.add(k), *y.add(k), *z.add(k));
            let r = [
                math::sqrt(a),
                math::rsqrt(a),
                math::exp(b),
                math::log(a),
                math::exp2(b),
                math::log2(a),
                math::fma(a, b, c),
                math::min(b, c),
                math::max(b, c),
                math::sqrt(-a),
            ];
            let o = out.add(k * MATH_F32_OUTPUTS);
            for (j, v) in r.into_iter().enumerate() {
                *o.add(j) = v;
            }
            i += grid_threads_x();
        }
    }

    /// Device math on `f64`, grid-stride: for each `i < n`, writes
    /// `out[5 i..5 i + 5]` = sqrt(x), rsqrt(x), fma(x, y, z), min(y, z), max(y, z).
    ///
    /// # Safety
    /// `x`, `y`, `z` hold `n` elements, `out` `5 n`.
    pub unsafe fn math_f64(x: *const f64, y: *const f64, z: *const f64, out: *mut f64, n: u32) {
        use devcomm_device::math;
        let mut i = global_thread_x();
        while i < n {
            let k = i as usize;
            let (a, b, c) = (*x.add(k), *y.add(k), *z.add(k));
            let r = [math::sqrt_f64(a), math::rsqrt_f64(a), math::fma_f64(a, b, c), math::min_f64(b, c), math::max_f64(b, c)];
            let o = out.add(k * MATH_F64_OUTPUTS);
            for (j, v) in r.into_iter().enumerate() {
                *o.add(j) = v;
            }
            i += grid_threads_x();
        }
    }
}

/// Results per thread of [`reductions()`].
pub const REDUCTION_OUTPUTS: usize = 8;

kernel! {
    /// Reductions over every coop kind: thread `t` of the grid (one value of
    /// `fx[t]` and `ux[t]` each) writes, at `fout[8 t..]`: its warp's f32 sum
    /// and max, its tile<8>'s f32 sum, its block's f32 sum and max (twice in
    /// a row through the same scratch, the second time of `-fx`), and at
    /// `uout[8 t..]`: the same of the `u32` values (sums wrapping). Warp and
    /// tile results are only written where the warp is full (`uout`/`fout`
    /// keep their contents elsewhere).
    ///
    /// # Safety
    /// `fx`, `ux` hold one value per thread of the grid, `fout`, `uout` 8;
    /// at least 256 bytes of dynamic shared memory.
    pub unsafe fn reductions(fx: *const f32, ux: *const u32, fout: *mut f32, uout: *mut u32) {
        use devcomm_device::arch::{block_rank_in_grid, thread_rank_in_block, threads_per_block};
        use devcomm_device::coop::{Cta, Tile, Warp};
        use devcomm_device::reduce;
        let threads = threads_per_block();
        let rank = thread_rank_in_block();
        let t = (block_rank_in_grid() * threads + rank) as usize;
        let (f, u) = (*fx.add(t), *ux.add(t));
        let (fo, uo) = (fout.add(t * REDUCTION_OUTPUTS), uout.add(t * REDUCTION_OUTPUTS));
        let full_warp = (rank / 32 + 1) * 32 <= threads;
        if full_warp {
            let (warp, tile) = (Warp::new(), Tile::<8>::new());
            *fo = reduce::warp_sum(&warp, f);
            *fo.add(1) = reduce::warp_max(&warp, f);
            *fo.add(2) = reduce::tile_sum(&tile, f);
            *uo = reduce::warp_sum(&warp, u);
            *uo.add(1) = reduce::warp_max(&warp, u);
            *uo.add(2) = reduce::tile_sum(&tile, u);
        }
        let cta = Cta::new();
        let fs = dynamic_shared::<f32>();
        let us = dynamic_shared::<u32>().add(32);
        *fo.add(3) = reduce::block_sum(&cta, f, fs);
        *fo.add(4) = reduce::block_max(&cta, f, fs);
        *fo.add(5) = reduce::block_sum(&cta, -f, fs);
        *fo.add(6) = reduce::block_max(&cta, -f, fs);
        *fo.add(7) = reduce::block_reduce(&cta, f, devcomm_device::math::min, fs);
        *uo.add(3) = reduce::block_sum(&cta, u, us);
        *uo.add(4) = reduce::block_max(&cta, u, us);
        *uo.add(5) = reduce::block_sum(&cta, u.wrapping_neg(), us);
        *uo.add(6) = reduce::block_max(&cta, u.wrapping_neg(), us);
        *uo.add(7) = reduce::block_reduce(&cta, u, |a: u32, b: u32| a.min(b), us);
    }
}

kernel! {
    /// `F16`'s conversions as the device runs them, grid-stride: for each
    /// `i < 65536`, `wide[i]` = the bits of `F16(i).to_f32()`; for each
    /// `i < n`, `narrow[i] = F16::from_f32(x[i])` (its bits, widened).
    ///
    /// # Safety
    /// `wide` holds 65536 elements, `x` and `narrow` `n`.
    pub unsafe fn f16_conversions(x: *const f32, n: u32, wide: *mut u32, narrow: *mut u32) {
        use devcomm_device::coll::F16;
        let mut i = global_thread_x();
        while i < 65536 {
            *wide.add(i as usize) = F16(i as u16).to_f32().to_bits();
            i += grid_threads_x();
        }
        let mut i = global_thread_x();
        while i < n {
            *narrow.add(i as usize) = F16::from_f32(*x.add(i as usize)).0 as u32;
            i += grid_threads_x();
        }
    }
}
