//! The examples' kernels, written as a user writes a kernel crate: `no_std`,
//! kernels declared with `devcomm_device::kernel!`, a panic handler for the
//! GPU target. `examples/build.rs` turns this crate into PTX with
//! `devcomm-build` (from its committed copy in `examples/ptx/` when that is
//! fresh, so that running the examples needs no nightly toolchain); the
//! programs load it with `Device::load_module` and launch with
//! `Stream::launch_in`. On the emulated runtime the same functions run from
//! their host form.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![warn(missing_docs)]

use devcomm_device::atomic::{self, Scope};
use devcomm_device::comm::{DevComm, WindowDesc};
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::gin::{Gin, LocalAction, RemoteAction};
use devcomm_device::{arch, kernel, lsa};

devcomm_device::kernel_crate!();

/// Records the first non-zero error `code` in `*errors`.
///
/// # Safety
/// `errors` points to a `u32` the kernel may write.
unsafe fn report(errors: *mut u32, code: u32) {
    if code != 0 {
        // SAFETY: the caller's contract.
        unsafe { atomic::compare_exchange(errors, 0, code, atomic::Order::Relaxed, Scope::Gpu) };
    }
}

kernel! {
    /// One round of an LSA ring: the block copies `bytes` from the caller's
    /// window at `src_off` into the next LSA peer's window at `dst_off`
    /// (NVLink stores), then adds 1 to that peer's `u64` signal at `sig_off`
    /// with release, then waits until its own signal has reached `round`.
    /// A failed wait writes its device error code to `*errors`.
    ///
    /// # Safety
    /// `win` is a window of `comm`'s communicator holding `src_off + bytes`,
    /// `dst_off + bytes` and the 8-aligned `sig_off + 8` bytes; one block.
    pub unsafe fn lsa_put_signal(comm: DevComm, win: WindowDesc, src_off: u64, dst_off: u64, sig_off: u64, bytes: u64, round: u64, errors: *mut u32) {
        let cta = Cta::new();
        let next = (comm.lsa_rank() + 1) % comm.lsa_size();
        lsa::copy(&cta, win.lsa_ptr(dst_off, next), win.local_ptr(src_off), bytes as usize);
        cta.sync(); // every thread's stores come before the signal
        if cta.is_leader() {
            lsa::signal_add(win.lsa_ptr::<u64>(sig_off, next), 1);
            if let Err(e) = lsa::wait_signal(win.local_ptr::<u64>(sig_off), round, &comm.abort()) {
                report(errors, e.code());
            }
        }
        cta.sync();
    }

    /// `iters` rounds of GIN ping-pong between world ranks 0 and 1: rank 0
    /// puts `bytes` from its window at offset 0 to rank 1's window at
    /// `bytes` with an increment of signal 0 there, and waits for rank 1 to
    /// do the same back; rank 1 waits, then answers. `out[0]` gets the
    /// elapsed nanoseconds on rank 0; the first failure's device error code
    /// goes to `*errors`. Other ranks return at once.
    ///
    /// # Safety
    /// `win` is registered for GIN (`DevCommRequirements::use_window`) and
    /// holds `2 * bytes`; `comm` has GIN with signal 0; one block.
    pub unsafe fn gin_pingpong(comm: DevComm, win: WindowDesc, bytes: u64, iters: u32, out: *mut u64, errors: *mut u32) {
        let me = comm.rank();
        if me > 1 {
            return;
        }
        let peer = 1 - me;
        let cta = Cta::new();
        let gin = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => { report(errors, e.code()); return; }
        };
        let world = comm.world();
        let signal = RemoteAction::SignalInc { signal: 0, strong: true };
        let t0 = arch::global_timer_ns();
        for round in 1..=iters as u64 {
            let step = |wait_first: bool| -> Result<(), devcomm_device::gin::GinError> {
                if wait_first {
                    gin.wait_signal(&cta, 0, round)?;
                }
                gin.put(&cta, &world, peer, &win, bytes, &win, 0, bytes, signal, LocalAction::None)?;
                if !wait_first {
                    gin.wait_signal(&cta, 0, round)?;
                }
                Ok(())
            };
            if let Err(e) = step(me == 1) {
                report(errors, e.code());
                break;
            }
        }
        if let Err(e) = gin.flush(&cta) {
            report(errors, e.code());
        }
        if me == 0 && cta.is_leader() {
            *out = arch::global_timer_ns() - t0;
        }
    }
}

kernel! {
    /// The `devcomm` crate's walkthrough kernel: word 0 of the next rank's
    /// window := my rank + 100 (an LSA store), an LSA barrier, then word 2
    /// of the next rank's window := my word 1 (a GIN put with signal 0),
    /// waiting for the previous rank's. The first failure's device error
    /// code goes to `*errors`.
    ///
    /// # Safety
    /// `win` holds 24 bytes, is registered for GIN, and every rank is in
    /// the LSA team; `comm` has LSA barrier 0 and GIN signal 0; one block.
    pub unsafe fn ring_step(comm: DevComm, win: WindowDesc, errors: *mut u32) {
        use devcomm_device::atomic::Order;
        use devcomm_device::lsa::LsaBarrierSession;
        let cta = Cta::new();
        let next = (comm.rank() + 1) % comm.nranks();
        if cta.is_leader() {
            *win.lsa_ptr::<u64>(0, next) = comm.rank() as u64 + 100;
        }
        let r = LsaBarrierSession::new(&cta, &comm, 0).and_then(|mut b| b.sync(&cta, Order::AcqRel));
        if let Err(e) = r {
            report(errors, e.code());
            return;
        }
        let gin = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => { report(errors, e.code()); return; }
        };
        let signal = RemoteAction::SignalInc { signal: 0, strong: true };
        let r = gin
            .put(&cta, &comm.world(), next, &win, 16, &win, 8, 8, signal, LocalAction::None)
            .and_then(|()| gin.wait_signal(&cta, 0, 1).map(drop))
            .and_then(|()| gin.flush(&cta));
        if let Err(e) = r {
            report(errors, e.code());
        }
    }
}

/// `out[r][c] = x[r][c] * weight[c] / sqrt(mean over c of x[r][c]^2 + eps)`
/// for the rows `row0..row0 + rows` of `x` (`cols` columns), one block per
/// row at a time (grid-stride over rows); the block's sum of squares goes
/// through `dynamic_shared` (launch with at least 128 bytes of it).
///
/// # Safety
/// `x` and `out` hold the rows, `weight` `cols` elements; the caller is
/// every thread of the block.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rms_norm_rows(
    x: *const f32,
    out: *mut f32,
    weight: *const f32,
    rows: usize,
    cols: usize,
    eps: f32,
    cta: &Cta,
    block: usize,
    blocks: usize,
) {
    let scratch = arch::dynamic_shared::<f32>();
    let (t, nt) = (cta.thread_rank() as usize, cta.size() as usize);
    let mut r = block;
    while r < rows {
        let row = x.add(r * cols);
        let mut ss = 0.0f32;
        let mut c = t;
        while c < cols {
            let v = *row.add(c);
            ss = devcomm_device::math::fma(v, v, ss);
            c += nt;
        }
        // SAFETY: every thread of the block calls; `scratch` holds 32 floats.
        let ss = unsafe { devcomm_device::reduce::block_sum(cta, ss, scratch) };
        let inv = devcomm_device::math::rsqrt(ss / cols as f32 + eps);
        let mut c = t;
        while c < cols {
            *out.add(r * cols + c) = *row.add(c) * inv * *weight.add(c);
            c += nt;
        }
        r += blocks;
    }
}

kernel! {
    /// RMSNorm of `rows` rows of `cols` floats (`x` → `out`, per-column
    /// `weight`), one block per row, grid-stride: the second half of the
    /// unfused "all-reduce, then normalise" that `fused_allreduce_rmsnorm`
    /// is timed against.
    ///
    /// # Safety
    /// `x`, `out`: `rows * cols` floats; `weight`: `cols`; launched with at
    /// least 128 bytes of dynamic shared memory.
    pub unsafe fn rms_norm(x: *const f32, out: *mut f32, weight: *const f32, rows: u32, cols: u32, eps: f32) {
        let cta = Cta::new();
        rms_norm_rows(x, out, weight, rows as usize, cols as usize, eps, &cta, arch::block_idx().x as usize, arch::grid_dim().x as usize);
    }

    /// All-reduce (sum over the ranks) of the `rows × cols` floats at `x`,
    /// then RMSNorm of every row into `out`, in one kernel of one block:
    /// `coll::reduce_scatter` gives this rank its shard of rows (`rows /
    /// ranks` of them) summed, the block normalises just those rows (each
    /// row once in the whole team, not once per rank), and
    /// `coll::all_gather` assembles every rank's normalised rows in `out`.
    /// `shard` is `rows / ranks * cols` floats of scratch. A failure
    /// writes its device error code to `*errors`.
    ///
    /// # Safety
    /// `ctx` is live and not used by anything else meanwhile; `x` holds the
    /// rows in a window on every rank; `out` holds `rows * cols` floats;
    /// `rows` a multiple of the rank count; one block, at least 128 bytes of
    /// dynamic shared memory.
    pub unsafe fn allreduce_rmsnorm(ctx: devcomm_device::coll::CollContext, x: devcomm_device::comm::SymPtr<f32>, shard: *mut f32, out: *mut f32, weight: *const f32, rows: u32, cols: u32, eps: f32, errors: *mut u32) {
        use devcomm_device::coll::{self, Input, Part, RedOp, Reduction};
        let cta = Cta::new();
        let n = ctx.scratch().lsa_size();
        let (rows_mine, cols) = ((rows / n) as usize, cols as usize);
        let count = rows_mine * cols;
        let red = Reduction::new(RedOp::Sum, 0.0f32, n);
        // SAFETY: the caller's contract: `x` holds `n` shards of `count`
        // floats on every rank, `shard` holds `count`.
        let r = unsafe { coll::reduce_scatter(&cta, &ctx, Part::WHOLE, Input::Window(x), shard, count, &red) };
        if let Err(e) = r {
            report(errors, e.code());
            return;
        }
        rms_norm_rows(shard, shard, weight, rows_mine, cols, eps, &cta, 0, 1);
        cta.sync(); // the shard, written by this block, is the all-gather's input
        // SAFETY: as above; `out` holds `n * count` floats.
        let r = unsafe { coll::all_gather(&cta, &ctx, Part::WHOLE, Input::Local(shard as *const f32), out, count) };
        if let Err(e) = r {
            report(errors, e.code());
        }
    }
}

kernel! {
    /// Every local expert's matmul for the `moe` example: `out[l][r][c] =
    /// sum over i of x[l][r][i] * w[l][i][c]` (in `i` order, f32) for the
    /// `counts[l]` rows local expert `l` received (rows of `hidden`,
    /// `rows` per expert); one thread per output element, grid-stride.
    ///
    /// # Safety
    /// `x` and `out` hold `experts * rows * hidden` f32, `w` `experts *
    /// hidden * hidden`, `counts` `experts` `u32`s (each at most `rows`).
    pub unsafe fn expert_matmul_f32(x: *const f32, w: *const f32, counts: *const u32, out: *mut f32, experts: u32, rows: u32, hidden: u32) {
        let (rows, h) = (rows as usize, hidden as usize);
        let total = experts as usize * rows * h;
        let mut k = arch::global_thread_x() as usize;
        while k < total {
            let (l, r, c) = (k / (rows * h), k / h % rows, k % h);
            if r < *counts.add(l) as usize {
                let mut acc = 0.0f32;
                for i in 0..h {
                    acc += *x.add((l * rows + r) * h + i) * *w.add((l * h + i) * h + c);
                }
                *out.add(k) = acc;
            }
            k += arch::grid_threads_x() as usize;
        }
    }
}
