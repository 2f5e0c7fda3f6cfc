//! Host RMA benchmark (`devcomm::rma`, NCCL's `ncclPutSignal` /
//! `ncclWaitSignal`) between ranks 0 and 1: the stream-to-stream round trip
//! of `put_signal` + `wait_signal`, and `put_signal` bandwidth next to the
//! raw copy engine — with, in the same call, the floors that explain them:
//! the same round trip posted from inside one kernel (`gin_pingpong`: no
//! launches), and the time to queue and run one library kernel launch.
//!
//! ```text
//! devcomm-run -n 2 target/release/rma_bench     # GPUs or emulated
//! ```
//! The copy-engine reference needs the two ranks in one LSA team (the
//! default on one host). `RMA_BENCH_ONLY=rtt|bw` runs one part.

use devcomm::comm::Communicator;
use devcomm::gin::GinConnectionType;
use devcomm::rma::{RmaConfig, RmaSource, WaitSignal};
use devcomm::runtime::{Event, LaunchConfig};
use devcomm::window::WindowFlags;
use devcomm::{DevCommRequirements, Error, Result};
use devcomm_benches::median;
use devcomm_test_kernels::gin::gin_pingpong;
use std::process::ExitCode;

fn main() -> ExitCode {
    devcomm_benches::bench_main("rma_bench", 2, bench)
}

fn bench(quick: bool) -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let (rank, peer) = (comm.rank(), 1 - comm.rank().min(1));
    if comm.count() != 2 {
        return Err(Error::invalid_usage("rma_bench runs on 2 ranks"));
    }
    let dev = comm.device().clone();
    let stream = dev.new_stream()?;
    let kernels = devcomm_tests::try_test_kernels(&dev)?;
    let max: usize = if quick { 1 << 20 } else { 256 << 20 };
    let mem = comm.mem_alloc(2 * max)?;
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
    let config = RmaConfig { queue_depth: 512, ..RmaConfig::default() };
    let rma = comm.host_rma_with(&[&window], &config)?;
    let only = std::env::var("RMA_BENCH_ONLY").unwrap_or_default();
    let part = |name: &str| only.is_empty() || only == name;
    let win = window.desc();
    if rank == 0 {
        let transport = match std::env::var("DEVCOMM_GIN_TRANSPORT").as_deref() {
            Ok("tcp") => "tcp",
            _ => "copy engine between ranks of one host",
        };
        let direct = match (rma.config().sm_copy_max_bytes, rma.config().direct_min_bytes) {
            (0, usize::MAX) => "none".to_string(),
            (sm, ce) => format!("SM copy up to {sm} B, copy engine from {ce} B"),
        };
        println!(
            "# devcomm host RMA benchmark: GIN backend {}, transport: {transport}, direct paths within the node: {direct}, {} x {} ({})",
            rma.dev_comm().gin_type(),
            comm.count(),
            dev.name(),
            dev.kind()
        );
    }

    if part("rtt") {
        if rank == 0 {
            println!();
            println!("# put_signal + wait_signal round trip, stream to stream (us); window source, or a device buffer (staged)");
            println!("{:>10} {:>10} {:>10} {:>8}", "bytes", "window_us", "buffer_us", "iters");
        }
        let iters = if quick { 20 } else { 2000 };
        for bytes in [8usize, 4096, 1 << 20] {
            let buf = dev.alloc_from(&vec![7u8; bytes])?;
            let mut us = [0.0f64; 2];
            for (k, from_window) in [true, false].into_iter().enumerate() {
                let mut samples = Vec::new();
                for _ in 0..if quick { 1 } else { 3 } {
                    comm.bootstrap_barrier()?;
                    let (a, b) = (Event::new(&dev)?, Event::new(&dev)?);
                    stream.record(&a)?;
                    for _ in 0..iters {
                        let put = || {
                            if from_window {
                                rma.put_signal(
                                    RmaSource::<u8>::window(&window, max, bytes)?,
                                    peer,
                                    &window,
                                    0,
                                    0,
                                    &stream,
                                )
                            } else {
                                rma.put_signal(&buf, peer, &window, 0, 0, &stream)
                            }
                        };
                        if rank == 0 {
                            put()?;
                            rma.wait_signal(&[WaitSignal::new(peer, 1)], &stream)?;
                        } else {
                            rma.wait_signal(&[WaitSignal::new(peer, 1)], &stream)?;
                            put()?;
                        }
                    }
                    stream.record(&b)?;
                    rma.synchronize(&stream)?;
                    samples.push(a.elapsed_ms(&b)? as f64 * 1e3 / iters as f64);
                }
                us[k] = median(samples);
            }
            if rank == 0 {
                println!("{bytes:>10} {:>10.2} {:>10.2} {iters:>8}", us[0], us[1]);
                println!("csv,rma_rtt,{bytes},{:.3},{:.3}", us[0], us[1]);
            }
        }
        // Floors, same call: (1) the same 8-byte put + signal round trip posted
        // from inside one kernel (the proxy path alone, no launches), on a
        // device communicator of its own; (2) one library kernel launch,
        // queued and run (a `signal` to oneself, waited for by the next).
        let mut req = DevCommRequirements::new();
        req.gin_connection_type = GinConnectionType::Full;
        req.gin_signal_count = 4;
        req.use_window(&window);
        let handle = comm.create_dev_comm(&req)?;
        comm.bootstrap_barrier()?;
        let out = dev.alloc_from(&[0u64; 2])?;
        let errors = dev.alloc_from(&[0u32; 2])?;
        let kiters: u32 = if quick { 20 } else { 2000 };
        // SAFETY: the window holds 2 * max >= 16 bytes; live device communicator
        // with 4 signals (signal 3 starts at 0); `out` and `errors` outlive the launch.
        unsafe {
            stream.launch_in::<gin_pingpong>(
                &kernels,
                LaunchConfig::new(1, 32),
                (handle.dev_comm(), win, 8u64, kiters, out.as_mut_ptr(), errors.as_mut_ptr()),
            )?
        };
        if let Some(e) = Error::from_device_code(stream.read_vec(&errors)?[0], "gin_pingpong") {
            return Err(e);
        }
        let in_kernel = stream.read_vec(&out)?[0] as f64 / kiters as f64 / 1e3;
        comm.bootstrap_barrier()?;
        handle.destroy()?;
        let (a, b) = (Event::new(&dev)?, Event::new(&dev)?);
        let me = comm.rank();
        stream.record(&a)?;
        for _ in 0..iters {
            rma.signal(me, 0, &stream)?;
            rma.wait_signal(&[WaitSignal::new(me, 1)], &stream)?;
        }
        stream.record(&b)?;
        rma.synchronize(&stream)?;
        let self_us = a.elapsed_ms(&b)? as f64 * 1e3 / iters as f64;
        if rank == 0 {
            println!("# floors: 8 B put + signal round trip inside one kernel {in_kernel:.2} us; signal to oneself + wait (two launches and the proxy) {self_us:.2} us");
            println!("csv,rma_floor,{in_kernel:.3},{self_us:.3}");
        }
        comm.bootstrap_barrier()?;
    }

    if part("bw") {
        if rank == 0 {
            println!();
            println!(
                "# put_signal bandwidth rank 0 -> rank 1 (GB/s), one stream, each put waited for by rank 1's stream; \
                 ce = cuMemcpyAsync into the peer's window"
            );
            println!("{:>12} {:>9} {:>9} {:>9} {:>8} {:>8}", "bytes", "window", "buffer", "ce", "win/ce", "buf/ce");
        }
        let sizes: Vec<usize> = (12..=if quick { 20 } else { 28 }).step_by(2).map(|k| 1usize << k).collect();
        let src_buf = dev.alloc_from(&vec![3u8; max])?;
        for &bytes in &sizes {
            let iters = if quick { 4 } else { ((1usize << 30) / bytes).clamp(8, 1000) };
            let mut gbs = [0.0f64; 2];
            for (k, from_window) in [true, false].into_iter().enumerate() {
                let mut samples = Vec::new();
                for _ in 0..if quick { 1 } else { 3 } {
                    comm.bootstrap_barrier()?;
                    if rank == 0 {
                        let (a, b) = (Event::new(&dev)?, Event::new(&dev)?);
                        stream.record(&a)?;
                        for _ in 0..iters {
                            if from_window {
                                let src = RmaSource::<u8>::window(&window, max, bytes)?;
                                rma.put_signal(src, peer, &window, 0, 0, &stream)?;
                            } else {
                                let src = RmaSource::range(&src_buf, 0, bytes)?;
                                rma.put_signal(src, peer, &window, 0, 0, &stream)?;
                            }
                        }
                        stream.record(&b)?;
                        rma.synchronize(&stream)?;
                        samples.push(bytes as f64 * iters as f64 / (a.elapsed_ms(&b)? as f64 * 1e6));
                    } else {
                        rma.wait_signal(&[WaitSignal::new(peer, iters as u64)], &stream)?;
                        rma.synchronize(&stream)?;
                    }
                }
                gbs[k] = median(samples);
            }
            let mut ce = 0.0;
            if rank == 0 && win.lsa_size() >= 2 {
                let (a, b) = (Event::new(&dev)?, Event::new(&dev)?);
                let src = win.local_ptr::<u8>(max as u64) as u64;
                let dst = win.lsa_ptr::<u8>(0, 1) as u64;
                stream.record(&a)?;
                for _ in 0..iters {
                    // SAFETY: both ranges lie in the window (2 * max bytes, the
                    // peer's mapped into this process), disjoint.
                    unsafe { stream.memcpy_raw(dst, src, bytes)? };
                }
                stream.record(&b)?;
                stream.synchronize()?;
                ce = bytes as f64 * iters as f64 / (a.elapsed_ms(&b)? as f64 * 1e6);
            }
            if rank == 0 {
                let ratio = |x: f64| if ce > 0.0 { x / ce } else { 0.0 };
                println!(
                    "{bytes:>12} {:>9.2} {:>9.2} {ce:>9.1} {:>8.3} {:>8.3}",
                    gbs[0],
                    gbs[1],
                    ratio(gbs[0]),
                    ratio(gbs[1])
                );
                println!("csv,rma_bw,{bytes},{:.3},{:.3},{ce:.3}", gbs[0], gbs[1]);
            }
        }
    }
    comm.bootstrap_barrier()?;
    rma.destroy()?;
    window.deregister()?;
    comm.finalize()
}
