//! GIN benchmark (proxy backend): put + signal round trip, put bandwidth
//! next to the copy engine, and the rate of 8-byte `put_value`s posted from
//! many CTAs, between ranks 0 and 1.
//!
//! ```text
//! devcomm-run -n 2 target/release/gin_bench     # GPUs or emulated
//! ```
//! The copy-engine reference needs the two ranks in one LSA team (the
//! default on one host); GIN traffic goes through the proxy either way.
//!
//! `GIN_BENCH_ONLY=rtt|bw|rate` runs one part; `GIN_BENCH_DEPTH` sets the
//! queue depth (default 512); `GIN_BENCH_POSTERS` the threads posting the
//! bandwidth test's puts (1..=32, default 1); with `GIN_BENCH_ONLY=rate` more grid shapes
//! are measured, or those of `GIN_BENCH_SHAPES=BxTxN,...`; `GIN_BENCH_RTT_SIZES=0,8,...`
//! sets the round trip's sizes (default 0, 8, 4096).

use devcomm::comm::Communicator;
use devcomm::gin::GinConnectionType;
use devcomm::runtime::{Device, Event, LaunchConfig, Stream};
use devcomm::window::WindowFlags;
use devcomm::{DevCommRequirements, Error, Result};
use devcomm_benches::median;
use devcomm_test_kernels::gin::{gin_pingpong, gin_put_bw, gin_put_value_rate};
use std::process::ExitCode;

fn main() -> ExitCode {
    devcomm_benches::bench_main("gin_bench", 2, bench)
}

/// Grid shapes of the rate test from `GIN_BENCH_SHAPES`: `BxTxN,...`
/// (blocks x threads x puts per thread).
fn parse_shapes(list: &str) -> Result<Vec<(u32, u32, u32)>> {
    list.split(',')
        .map(|shape| {
            let v: Vec<u32> = shape.trim().split('x').filter_map(|n| n.parse().ok()).collect();
            match v[..] {
                [b, t, n] if b > 0 && (1..=1024).contains(&t) && n > 0 => Ok((b, t, n)),
                _ => Err(Error::invalid_argument(format!("GIN_BENCH_SHAPES: {shape:?} is not BxTxN"))),
            }
        })
        .collect()
}

/// Runs a 2-word-error kernel launch, checks its error word, returns `out[0]`.
fn timed_kernel(
    dev: &Device,
    stream: &Stream,
    what: &str,
    launch: impl FnOnce(*mut u64, *mut u32) -> Result<()>,
) -> Result<u64> {
    Ok(timed_kernel2(dev, stream, what, launch)?[0])
}

/// As [`timed_kernel`], returning both words of `out`.
fn timed_kernel2(
    dev: &Device,
    stream: &Stream,
    what: &str,
    launch: impl FnOnce(*mut u64, *mut u32) -> Result<()>,
) -> Result<[u64; 2]> {
    let out = dev.alloc_from(&[0u64; 2])?;
    let errors = dev.alloc_from(&[0u32; 2])?;
    launch(out.as_mut_ptr(), errors.as_mut_ptr())?;
    let e = stream.read_vec(&errors)?;
    if let Some(err) = Error::from_device_code(e[0], what) {
        return Err(err);
    }
    let v = stream.read_vec(&out)?;
    Ok([v[0], v[1]])
}

fn bench(quick: bool) -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let rank = comm.rank();
    let dev = comm.device().clone();
    let stream = dev.new_stream()?;
    // The benchmark kernels' module, loaded whole before any GIN kernel runs
    // (as `create_dev_comm` loads the library's: issue 13).
    let kernels = devcomm_tests::try_test_kernels(&dev)?;
    let max: u64 = if quick { 1 << 20 } else { 256 << 20 };
    let mem = comm.mem_alloc((2 * max) as usize)?;
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
    let mut req = DevCommRequirements::new();
    req.gin_connection_type = GinConnectionType::Full;
    req.gin_signal_count = 4;
    req.gin_counter_count = 1;
    req.gin_queue_depth = std::env::var("GIN_BENCH_DEPTH").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let only = std::env::var("GIN_BENCH_ONLY").unwrap_or_default();
    let part = |name: &str| only.is_empty() || only == name;
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req)?;
    let (dc, win) = (handle.dev_comm(), window.desc());
    // Between runs: everyone done, signal 3 back to 0 everywhere, everyone sees it.
    let reset = |comm: &Communicator| -> Result<()> {
        comm.bootstrap_barrier()?;
        handle.reset_gin_signal(3)?;
        comm.bootstrap_barrier()
    };
    if rank == 0 {
        let transport = match std::env::var("DEVCOMM_GIN_TRANSPORT").as_deref() {
            Ok("tcp") => "tcp".to_string(),
            _ => format!(
                "copy engine between ranks of one host (inline values {})",
                if std::env::var("DEVCOMM_GIN_CE_STAGE_INLINE").is_ok_and(|v| v == "1") {
                    "staged + copied"
                } else {
                    "as stream writes"
                }
            ),
        };
        println!(
            "# devcomm GIN benchmark: backend {}, transport: {transport}, {} x {} ({})",
            handle.gin_type(),
            comm.count(),
            dev.name(),
            dev.kind()
        );
    }

    // Round trip: signal only, 8-byte inline put + signal, 4 KiB put + signal.
    if rank == 0 && part("rtt") {
        println!();
        println!("# GIN put + signal round trip, one thread (us)");
        println!("{:>10} {:>10} {:>8}", "bytes", "rtt_us", "iters");
    }
    let rtt_sizes: Vec<u64> = match std::env::var("GIN_BENCH_RTT_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|b| b.trim().parse().map_err(|_| Error::invalid_argument(format!("GIN_BENCH_RTT_SIZES: {b:?}"))))
            .collect::<Result<_>>()?,
        Err(_) => vec![0, 8, 4096],
    };
    for &bytes in if part("rtt") { &rtt_sizes[..] } else { &[] } {
        let iters: u32 = if quick { 20 } else { 2000 };
        let mut samples = Vec::new();
        for _ in 0..if quick { 1 } else { 3 } {
            reset(&comm)?;
            // SAFETY: the window holds 2 * max >= 2 * bytes; live device communicator.
            let ns = timed_kernel(&dev, &stream, "gin ping-pong", |out, err| unsafe {
                stream.launch_in::<gin_pingpong>(&kernels, LaunchConfig::new(1, 32), (dc, win, bytes, iters, out, err))
            })?;
            samples.push(ns as f64 / iters as f64 / 1e3);
        }
        if rank == 0 {
            let us = median(samples);
            println!("{bytes:>10} {us:>10.2} {iters:>8}");
            println!("csv,gin_pingpong,{bytes},{us:.3}");
        }
    }

    // Put bandwidth next to the copy engine (CE: into the peer's LSA mapping).
    // "same": every put to one destination; "spread": up to 64 destinations
    // in turn (what a sender streaming chunks does), which lets the proxy
    // hand independent copies to the driver in one batch. ce: one
    // cuMemcpyDtoDAsync per copy, spread; ce_batch: the same copies, one
    // cuMemcpyBatchAsync per round of the destinations. post_us: the
    // kernel's time per put for posting alone (spread; credit waits included).
    // GIN_BENCH_POSTERS: threads of one warp posting the puts (default 1).
    let posters: u32 = std::env::var("GIN_BENCH_POSTERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).clamp(1, 32);
    if rank == 0 && part("bw") {
        println!();
        println!(
            "# GIN put bandwidth, rank 0 -> rank 1 (GB/s), each put with a signal, {posters} posting thread(s); \
             ce* = copies into the peer's window; gin_rel = spread, source declared released \
             (Gin::with_given_release(Sys): no fence per put)"
        );
        println!(
            "{:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "bytes",
            "gin_same",
            "gin_spr",
            "gin_rel",
            "ce",
            "ce_batch",
            "spr/ce",
            "rel/ce",
            "rel/ceb",
            "post_us",
            "relp_us"
        );
    }
    let sizes: Vec<u64> =
        if part("bw") { (12..=if quick { 20 } else { 28 }).step_by(2).map(|k| 1u64 << k).collect() } else { vec![] };
    for &bytes in &sizes {
        let iters: u32 = if quick { 4 } else { ((1u64 << 30) / bytes).clamp(4, 2000) as u32 };
        let spread = (2 * max / bytes - 1).min(64);
        let (mut gin, mut post_us) = ([Vec::new(), Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        for _ in 0..if quick { 1 } else { 3 } {
            for (k, (slots, released)) in [(1, 0u32), (spread, 0), (spread, 1)].into_iter().enumerate() {
                reset(&comm)?;
                let [ns, posting] = timed_kernel2(&dev, &stream, "gin put bandwidth", |out, err| unsafe {
                    // SAFETY: the window holds 2 * max >= (1 + slots) * bytes; live device communicator.
                    stream.launch_in::<gin_put_bw>(
                        &kernels,
                        LaunchConfig::new(1, 32),
                        (dc, win, bytes, iters, slots, posters, released, out, err),
                    )
                })?;
                gin[k].push(bytes as f64 * iters as f64 / ns as f64);
                if k >= 1 {
                    post_us[k - 1].push(posting as f64 / iters as f64 / 1e3);
                }
            }
        }
        let (mut ce, mut ce_batch) = (0.0, 0.0);
        if rank == 0 && win.lsa_size() >= 2 {
            let src = win.local_ptr::<u8>(0) as u64;
            let copies: Vec<(u64, u64, usize)> = (0..iters as u64)
                .map(|i| (win.lsa_ptr::<u8>(bytes * (1 + i % spread), 1) as u64, src, bytes as usize))
                .collect();
            let (a, b) = (Event::new(&dev)?, Event::new(&dev)?);
            let timed = |batch: bool| -> Result<f64> {
                // SAFETY: for every copy here, each range lies in a mapped window
                // of 2 * max bytes; no destination overlaps another copy's range
                // within a batch (distinct slots; the source is below them).
                unsafe { stream.memcpy_raw(copies[0].0, src, bytes as usize)? };
                stream.record(&a)?;
                if batch {
                    for group in copies.chunks(spread as usize) {
                        // SAFETY: as above.
                        unsafe { stream.memcpy_batch_raw(group)? };
                    }
                } else {
                    for &(dst, src, n) in &copies {
                        // SAFETY: as above.
                        unsafe { stream.memcpy_raw(dst, src, n)? };
                    }
                }
                stream.record(&b)?;
                Ok(bytes as f64 * iters as f64 / (a.elapsed_ms(&b)? as f64 * 1e6))
            };
            ce = timed(false)?;
            ce_batch = timed(true)?;
        }
        if rank == 0 {
            let [same, spr, rel] = gin.map(median);
            let ratio = |x: f64, r: f64| if r > 0.0 { x / r } else { 0.0 };
            let [post, relp] = post_us.map(median);
            println!(
                "{bytes:>12} {same:>9.2} {spr:>9.2} {rel:>9.2} {ce:>9.1} {ce_batch:>9.1} {:>8.3} {:>8.3} {:>8.3} \
                 {post:>8.2} {relp:>8.2}",
                ratio(spr, ce),
                ratio(rel, ce),
                ratio(rel, ce_batch),
            );
            println!("csv,gin_put,{bytes},{same:.3},{spr:.3},{rel:.3},{ce:.3},{ce_batch:.3}");
        }
    }

    // Message rate of 8-byte put_values from many CTAs (rank 0 -> 1 and 1 -> 0 at once).
    if rank == 0 && part("rate") {
        println!();
        println!(
            "# 8-byte put_value message rate, every thread of every block posting (Mops/s per rank), queue depth {}",
            req.gin_queue_depth
        );
    }
    let shapes: Vec<(u32, u32, u32)> = match (only.as_str(), std::env::var("GIN_BENCH_SHAPES")) {
        ("rate", Ok(list)) => parse_shapes(&list)?,
        ("rate", _) => {
            vec![(1, 32, 64), (8, 128, 16), (16, 128, 8), (16, 256, 4), (32, 128, 4), (32, 256, 4), (64, 128, 4)]
        }
        ("", _) => vec![(1, 32, 64), (8, 128, 16), (32, 256, 4)],
        _ => vec![],
    };
    for &(blocks, threads, per_thread) in &shapes {
        reset(&comm)?;
        let ns = timed_kernel(&dev, &stream, "put_value rate", |out, err| unsafe {
            // SAFETY: the window holds 8 bytes per (block, thread).
            stream.launch_in::<gin_put_value_rate>(
                &kernels,
                LaunchConfig::new(blocks, threads),
                (dc, win, per_thread, out, err),
            )
        })?;
        let ops = blocks as f64 * threads as f64 * per_thread as f64;
        if rank == 0 {
            println!(
                "{blocks:>4} x {threads:>4} threads x {per_thread:>3}: {:>8.3} Mops/s ({} ops in {:.1} us)",
                ops / ns as f64 * 1e3,
                ops,
                ns as f64 / 1e3
            );
            println!("csv,gin_rate,{blocks},{threads},{per_thread},{:.4}", ops / ns as f64 * 1e3);
        }
    }
    comm.bootstrap_barrier()?;
    handle.destroy()?;
    window.deregister()?;
    comm.finalize()
}
