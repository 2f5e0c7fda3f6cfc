//! LSA benchmark: put bandwidth (SM stores, bulk-copy engine, copy engine),
//! put + signal round trip, and LSA barrier latency, between two GPUs or
//! more: puts go from LSA rank 0 to 1 (one way) or between the pairs
//! `r`, `r ^ 1` (both directions); the round trip pairs every rank `r` with
//! `r ^ x`, all pairs at once; the barrier spans the whole team.
//!
//! ```text
//! devcomm-run -n 2 target/release/lsa_bench            # GPUs (or emulated)
//! lsa_bench --quick                                      # starts 2 ranks itself, small sizes
//! ```
//!
//! Every measurement: warm-up, then the median of several repetitions of
//! many back-to-back operations timed with events (bandwidth) or with the
//! GPU's global timer inside one kernel (latency). Each put variant's
//! destination is checked against the source once before it is timed.
//! Rank 0 prints nccl-tests-like tables and `csv,` lines.

use devcomm::comm::Communicator;
use devcomm::dev_comm::DevCommRequirements;
use devcomm::runtime::{Device, Event, LaunchConfig, Module, Stream};
use devcomm::window::{Window, WindowFlags};
use devcomm::{Error, Result};
use devcomm_benches::median;
use devcomm_device::comm::{DevComm, WindowDesc};
use devcomm_device::lsa::ops::copy_bulk_smem_bytes;
use devcomm_test_kernels::lsa::{
    lsa_barrier_bench, lsa_copy, lsa_copy_bulk, lsa_copy_repeat, lsa_pingpong, lsa_pingpong_ll,
};
use rand::{Rng, SeedableRng};
use std::process::ExitCode;

const BULK_CHUNK: u32 = 32 * 1024;
const BULK_STAGES: u32 = 4;

fn main() -> ExitCode {
    devcomm_benches::bench_main("lsa_bench", 2, bench)
}

/// Median microseconds per call of `op`, `iters` calls per repetition.
fn time_us(dev: &Device, stream: &Stream, iters: u32, reps: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    let dev_events = (Event::new(dev)?, Event::new(dev)?);
    for _ in 0..2 {
        op()?;
    }
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        stream.record(&dev_events.0)?;
        for _ in 0..iters {
            op()?;
        }
        stream.record(&dev_events.1)?;
        samples.push(dev_events.0.elapsed_ms(&dev_events.1)? as f64 * 1e3 / iters as f64);
    }
    Ok(median(samples))
}

struct Ctx<'a> {
    dev: Device,
    window: &'a Window<'a>,
    stream: Stream,
    win: WindowDesc,
    dev_comm: DevComm,
    /// Our source region (offset 0) and where peers write to us (offset `max`).
    max: u64,
    sms: u32,
    /// The benchmark kernels' module (`devcomm-test-kernels`) on `dev`.
    kernels: Module,
}

impl Ctx<'_> {
    /// Our partner in the puts: LSA ranks pair up `r` with `r ^ 1` (0 and
    /// 1 for the one-way rows; every pair at once for "both directions").
    fn peer(&self) -> u32 {
        self.win.lsa_rank() ^ 1
    }
    /// Whether we have a partner (not the last rank of an odd team).
    fn has_peer(&self) -> bool {
        self.peer() < self.win.lsa_size()
    }
    fn src(&self) -> u64 {
        self.win.local_ptr::<u8>(0) as u64
    }
    fn dst(&self) -> u64 {
        self.win.lsa_ptr::<u8>(self.max, self.peer()) as u64
    }

    fn sm_put(&self, bytes: u64) -> Result<()> {
        let blocks = (bytes / (64 * 1024)).clamp(1, 2 * self.sms as u64) as u32;
        // SAFETY: src and dst are 16-aligned regions of `max >= bytes` bytes
        // in mapped windows that outlive the stream's work (synchronised below).
        unsafe {
            self.stream.launch_in::<lsa_copy>(
                &self.kernels,
                LaunchConfig::new(blocks, 512),
                (self.dst() as *mut u8, self.src() as *const u8, bytes),
            )
        }
    }

    fn bulk_put(&self, bytes: u64) -> Result<()> {
        let blocks = (bytes / (BULK_CHUNK as u64 * 2)).clamp(1, self.sms as u64) as u32;
        let smem = copy_bulk_smem_bytes(BULK_CHUNK, BULK_STAGES);
        // SAFETY: as in `sm_put`; shared memory sized for the pipeline.
        unsafe {
            self.stream.launch_in::<lsa_copy_bulk>(
                &self.kernels,
                LaunchConfig::new(blocks, 32).with_shared_mem(smem),
                (self.dst() as *mut u8, self.src() as *const u8, bytes, BULK_CHUNK, BULK_STAGES),
            )
        }
    }

    fn ce_put(&self, bytes: u64) -> Result<()> {
        // SAFETY: as in `sm_put`.
        unsafe { self.stream.memcpy_raw(self.dst(), self.src(), bytes as usize) }
    }

    /// Runs `put` once on fresh random data and checks what landed in the
    /// peer's window (read back through our mapping of it).
    fn verify(&self, what: &str, bytes: u64, put: impl Fn(&Self, u64) -> Result<()>) -> Result<()> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(bytes ^ self.win.lsa_rank() as u64);
        let data: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
        let peer = self.peer() as usize;
        self.window.write(&self.stream, 0, &data)?;
        self.window.write_lsa(&self.stream, peer, self.max as usize, &vec![0xCBu8; bytes as usize])?;
        put(self, bytes)?;
        self.stream.synchronize()?;
        let mut got = vec![0u8; bytes as usize];
        self.window.read_lsa(&self.stream, peer, self.max as usize, &mut got)?;
        if got != data {
            let first = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
            return Err(Error::internal(format!("{what} put of {bytes} B: wrong byte at {first}")));
        }
        Ok(())
    }
}

fn bench(quick: bool) -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let rank = comm.rank();
    let dev = comm.device().clone();
    let max: u64 = if quick { 1 << 20 } else { 1 << 30 };
    let mem = comm.mem_alloc((2 * max + (2 << 20)) as usize)?;
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
    let mut req = DevCommRequirements::new();
    req.lsa_barrier_count = 1;
    req.use_window(&window);
    let dc = comm.create_dev_comm(&req)?;
    let win = window.desc();
    if win.lsa_size() < 2 {
        return Err(Error::invalid_usage("lsa_bench needs two ranks in one LSA team"));
    }
    let ctx = Ctx {
        dev: dev.clone(),
        window: &window,
        stream: dev.new_stream()?,
        win,
        dev_comm: dc.dev_comm(),
        max,
        sms: dev.multiprocessor_count(),
        kernels: devcomm_tests::try_test_kernels(&dev)?,
    };
    if rank == 0 {
        println!(
            "# devcomm LSA benchmark: {} x {} ({} runtime), {} SMs",
            comm.count(),
            dev.name(),
            dev.kind(),
            ctx.sms
        );
    }

    // ---- optional sweep of launch shapes at one large size (LSA_BENCH_SWEEP=1) ----
    // (Every rank puts to its partner: the team must pair up.)
    if std::env::var("LSA_BENCH_SWEEP").is_ok_and(|v| v == "1") && win.lsa_size() % 2 == 0 {
        let bytes = max / 4;
        if rank == 0 {
            println!();
            println!("# sweep at {bytes} B, GPU0 -> GPU1: GB/s");
        }
        let ce = time_us(&ctx.dev, &ctx.stream, 5, 5, || ctx.ce_put(bytes))?;
        if rank == 0 {
            println!("sweep,ce,{:.1}", bytes as f64 / ce / 1e3);
        }
        for (blocks, threads) in [(132u32, 512u32), (264, 512), (528, 512), (132, 1024), (264, 1024), (1056, 256)] {
            let us = time_us(&ctx.dev, &ctx.stream, 5, 5, || unsafe {
                // SAFETY: as in `sm_put`.
                ctx.stream.launch_in::<lsa_copy>(
                    &ctx.kernels,
                    LaunchConfig::new(blocks, threads),
                    (ctx.dst() as *mut u8, ctx.src() as *const u8, bytes),
                )
            })?;
            if rank == 0 {
                println!("sweep,sm,{blocks}x{threads},{:.1},{:.3}", bytes as f64 / us / 1e3, ce / us);
            }
        }
        // Pull: read the peer's window into our own (what a "get" does).
        let (pull_dst, pull_src) =
            (ctx.win.local_ptr::<u8>(ctx.max) as u64, ctx.win.lsa_ptr::<u8>(0, ctx.peer()) as u64);
        for (blocks, threads) in [(132u32, 512u32), (264, 1024)] {
            let us = time_us(&ctx.dev, &ctx.stream, 5, 5, || unsafe {
                // SAFETY: both regions are `max >= bytes` bytes of mapped windows.
                ctx.stream.launch_in::<lsa_copy>(
                    &ctx.kernels,
                    LaunchConfig::new(blocks, threads),
                    (pull_dst as *mut u8, pull_src as *const u8, bytes),
                )
            })?;
            if rank == 0 {
                println!("sweep,sm_pull,{blocks}x{threads},{:.1},{:.3}", bytes as f64 / us / 1e3, ce / us);
            }
        }
        let us = time_us(&ctx.dev, &ctx.stream, 5, 5, || unsafe {
            // SAFETY: as above.
            ctx.stream.launch_in::<lsa_copy_bulk>(
                &ctx.kernels,
                LaunchConfig::new(132, 32).with_shared_mem(copy_bulk_smem_bytes(32768, 4)),
                (pull_dst as *mut u8, pull_src as *const u8, bytes, 32768u32, 4u32),
            )
        })?;
        if rank == 0 {
            println!("sweep,bulk_pull,132x32768x4,{:.1},{:.3}", bytes as f64 / us / 1e3, ce / us);
        }
        let us = time_us(&ctx.dev, &ctx.stream, 5, 5, || unsafe {
            // SAFETY: as above: both regions are `max >= bytes` bytes of
            // mapped windows (ours and the peer's), which do not overlap.
            ctx.stream.memcpy_raw(pull_dst, pull_src, bytes as usize)
        })?;
        if rank == 0 {
            println!("sweep,ce_pull,{:.1}", bytes as f64 / us / 1e3);
        }
        for (blocks, chunk, stages) in
            [(132u32, 32768u32, 4u32), (132, 16384, 8), (132, 65536, 3), (264, 16384, 4), (66, 65536, 3)]
        {
            let us = time_us(&ctx.dev, &ctx.stream, 5, 5, || unsafe {
                // SAFETY: as in `bulk_put`.
                ctx.stream.launch_in::<lsa_copy_bulk>(
                    &ctx.kernels,
                    LaunchConfig::new(blocks, 32).with_shared_mem(copy_bulk_smem_bytes(chunk, stages)),
                    (ctx.dst() as *mut u8, ctx.src() as *const u8, bytes, chunk, stages),
                )
            })?;
            if rank == 0 {
                println!("sweep,bulk,{blocks}x{chunk}x{stages},{:.1},{:.3}", bytes as f64 / us / 1e3, ce / us);
            }
        }
        comm.bootstrap_barrier()?;
    }

    // ---- put bandwidth, one direction and both at once ----
    let sizes: Vec<u64> = (10..=if quick { 20 } else { 30 }).step_by(2).map(|k| 1u64 << k).collect();
    for both in [false, true] {
        if rank == 0 {
            println!();
            println!(
                "# LSA put bandwidth, {} (GB/s per direction; ratio vs copy engine)",
                if both { "both directions at once" } else { "GPU0 -> GPU1" }
            );
            println!(
                "{:>12} {:>10} {:>9} {:>10} {:>9} {:>6} {:>10} {:>9} {:>6}",
                "bytes", "ce_us", "ce_GB/s", "sm_us", "sm_GB/s", "sm/ce", "bulk_us", "bulk_GB/s", "bulk/ce"
            );
        }
        for &bytes in &sizes {
            let active = (both && ctx.has_peer()) || rank == 0;
            comm.bootstrap_barrier()?;
            if active && !both {
                ctx.verify("sm", bytes, Ctx::sm_put)?;
                ctx.verify("bulk", bytes, Ctx::bulk_put)?;
                ctx.verify("ce", bytes, Ctx::ce_put)?;
            }
            comm.bootstrap_barrier()?;
            let iters = if quick {
                3
            } else if bytes <= 1 << 20 {
                200
            } else if bytes <= 64 << 20 {
                20
            } else {
                5
            };
            let mut row = [0.0f64; 3];
            for (k, slot) in row.iter_mut().enumerate() {
                comm.bootstrap_barrier()?;
                if active {
                    let reps = if quick { 3 } else { 7 };
                    *slot = time_us(&ctx.dev, &ctx.stream, iters, reps, || match k {
                        0 => ctx.ce_put(bytes),
                        1 => ctx.sm_put(bytes),
                        _ => ctx.bulk_put(bytes),
                    })?;
                }
            }
            if rank == 0 {
                let gbps = |us: f64| bytes as f64 / us / 1e3;
                println!(
                    "{:>12} {:>10.2} {:>9.1} {:>10.2} {:>9.1} {:>6.3} {:>10.2} {:>9.1} {:>6.3}",
                    bytes,
                    row[0],
                    gbps(row[0]),
                    row[1],
                    gbps(row[1]),
                    row[0] / row[1],
                    row[2],
                    gbps(row[2]),
                    row[0] / row[2]
                );
                println!(
                    "csv,put,{},{},{:.3},{:.3},{:.3}",
                    if both { "bidir" } else { "oneway" },
                    bytes,
                    row[0],
                    row[1],
                    row[2]
                );
            }
        }
    }

    // ---- puts issued from inside one running kernel ----
    if rank == 0 {
        println!();
        println!("# puts issued back to back inside one kernel, GPU0 -> GPU1 (no launch per put)");
        println!("{:>12} {:>8} {:>10} {:>10} {:>12}", "bytes", "blocks", "us/put", "GB/s", "Mputs/s");
    }
    for &bytes in sizes.iter().filter(|&&b| b <= 16 << 20) {
        comm.bootstrap_barrier()?;
        if rank == 0 {
            let blocks = (bytes / (32 * 1024)).clamp(1, 2 * ctx.sms as u64) as u32;
            let threads = (bytes / 16).clamp(32, 512) as u32;
            let puts: u32 = if quick { 4 } else { ((256u64 << 20) / bytes).clamp(16, 100_000) as u32 };
            let us = time_us(&ctx.dev, &ctx.stream, 1, if quick { 3 } else { 7 }, || unsafe {
                // SAFETY: as in `sm_put`.
                ctx.stream.launch_in::<lsa_copy_repeat>(
                    &ctx.kernels,
                    LaunchConfig::new(blocks, threads),
                    (ctx.dst() as *mut u8, ctx.src() as *const u8, bytes, puts),
                )
            })? / puts as f64;
            println!("{bytes:>12} {blocks:>8} {us:>10.4} {:>10.1} {:>12.3}", bytes as f64 / us / 1e3, 1.0 / us);
            println!("csv,put_in_kernel,{bytes},{us:.5}");
        }
    }
    comm.bootstrap_barrier()?;

    // ---- put + signal round trip: generic (copy + release signal) and LL ----
    if rank == 0 {
        println!();
        println!("# put + signal round trip, LSA rank 0 <-> 1 (every pair r, r ^ 1 at once; us per round trip)");
        println!(
            "#   generic: CTA copy, sync, red.release.sys signal, acquire wait; LL: data+flag in each 8-byte store"
        );
        println!("{:>10} {:>12} {:>10} {:>8}", "bytes", "generic_us", "ll_us", "iters");
    }
    let sig_off = 2 * max;
    let data_off = 2 * max + 4096;
    let ll_src = 2 * max + 256 * 1024;
    let ll_dst = 2 * max + 384 * 1024;
    let ll_slot = 2 * max + 512 * 1024;
    let pp_sizes: &[u64] = if quick { &[8, 4096] } else { &[8, 64, 512, 4096, 65536] };
    // Median µs per round trip between the ranks paired by `pair_xor`, every
    // pair at once (rank 0's pair reported): variant 0 generic, 1 LL.
    let pp_iters = |bytes: u64| -> u32 {
        if quick {
            50
        } else if bytes <= 4096 {
            20_000
        } else {
            5_000
        }
    };
    let pingpong = |pair_xor: u32, bytes: u64, variant: usize| -> Result<f64> {
        let iters = pp_iters(bytes);
        let threads = if bytes <= 512 { 32 } else { 512 };
        let mut samples = Vec::new();
        for rep in 0..if quick { 1 } else { 5 } {
            window.write(&ctx.stream, sig_off as usize, &[0u64])?;
            window.write(&ctx.stream, ll_slot as usize, &vec![0u8; 2 * bytes as usize + 8])?;
            comm.bootstrap_barrier()?;
            let out = dev.alloc_from(&[0u64])?;
            let errors = dev.alloc_from(&[0u32; 2])?;
            // SAFETY: offsets inside the window; out/errors live until the reads below.
            unsafe {
                if variant == 0 {
                    ctx.stream.launch_in::<lsa_pingpong>(
                        &ctx.kernels,
                        LaunchConfig::new(1, threads),
                        (
                            ctx.dev_comm,
                            win,
                            pair_xor,
                            0u64,
                            data_off,
                            sig_off,
                            bytes,
                            iters,
                            out.as_mut_ptr(),
                            errors.as_mut_ptr(),
                        ),
                    )?;
                } else {
                    ctx.stream.launch_in::<lsa_pingpong_ll>(
                        &ctx.kernels,
                        LaunchConfig::new(1, 32),
                        (
                            ctx.dev_comm,
                            win,
                            pair_xor,
                            ll_src,
                            ll_dst,
                            ll_slot,
                            bytes,
                            iters,
                            out.as_mut_ptr(),
                            errors.as_mut_ptr(),
                        ),
                    )?;
                }
            }
            let errs = ctx.stream.read_vec(&errors)?;
            if let Some(err) = Error::from_device_code(errs[0], &format!("ping-pong of {bytes} B")) {
                return Err(err);
            }
            let ns = ctx.stream.read_vec(&out)?[0];
            if rep > 0 || quick {
                samples.push(ns as f64 / iters as f64 / 1e3);
            }
            comm.bootstrap_barrier()?;
        }
        Ok(median(samples))
    };
    for &bytes in pp_sizes {
        let generic = pingpong(1, bytes, 0)?;
        let ll = pingpong(1, bytes, 1)?;
        if rank == 0 {
            println!("{bytes:>10} {generic:>12.3} {ll:>10.3} {:>8}", pp_iters(bytes));
            println!("csv,pingpong,{bytes},{generic:.4},{ll:.4}");
        }
    }

    // ---- the same at 8 B with every rank paired (r with r ^ x), per x ----
    let n = win.lsa_size();
    if n > 2 {
        if rank == 0 {
            println!();
            println!(
                "# put + signal round trip of 8 B, every rank r paired with r ^ x at once (us; rank 0 <-> rank x)"
            );
            println!("{:>6} {:>6} {:>12} {:>10}", "x", "pairs", "generic_us", "ll_us");
        }
        for x in 1..n {
            let generic = pingpong(x, 8, 0)?;
            let ll = pingpong(x, 8, 1)?;
            if rank == 0 {
                let pairs = (0..n).filter(|&r| (r ^ x) < n).count() / 2;
                println!("{x:>6} {pairs:>6} {generic:>12.3} {ll:>10.3}");
                println!("csv,pingpong_pairs,{n},{x},{pairs},{generic:.4},{ll:.4}");
            }
        }
    }

    // ---- LSA barrier ----
    if rank == 0 {
        println!();
        println!(
            "# LSA barrier across the {} ranks of the team (one block of 32 threads; us per barrier)",
            win.lsa_size()
        );
    }
    for (order, name) in [(0u32, "relaxed"), (3, "acq_rel")] {
        let rounds: u32 = if quick { 50 } else { 20_000 };
        let mut samples = Vec::new();
        for rep in 0..if quick { 1 } else { 5 } {
            comm.bootstrap_barrier()?;
            let out = dev.alloc_from(&[0u64])?;
            let errors = dev.alloc_from(&[0u32; 2])?;
            // SAFETY: the device communicator is live; buffers outlive the reads.
            unsafe {
                ctx.stream.launch_in::<lsa_barrier_bench>(
                    &ctx.kernels,
                    LaunchConfig::new(1, 32),
                    (ctx.dev_comm, rounds, order, out.as_mut_ptr(), errors.as_mut_ptr()),
                )?;
            }
            let errs = ctx.stream.read_vec(&errors)?;
            if let Some(err) = Error::from_device_code(errs[0], "barrier bench") {
                return Err(err);
            }
            if rep > 0 || quick {
                samples.push(ctx.stream.read_vec(&out)?[0] as f64 / rounds as f64 / 1e3);
            }
        }
        if rank == 0 {
            let us = median(samples);
            println!("{name:>10} {us:>10.3} us");
            println!("csv,barrier,{name},{us:.4}");
        }
    }
    comm.bootstrap_barrier()?;
    drop(ctx);
    drop(dc);
    window.deregister()?;
    comm.finalize()
}
