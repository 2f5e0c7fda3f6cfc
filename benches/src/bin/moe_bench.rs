//! moe_bench: MoE expert-parallel dispatch and combine (`devcomm::moe`,
//! low-latency or high-throughput mode) at DeepEP's shapes, with the same
//! exchange done by NCCL and the copy engine's bandwidth beside it.
//!
//! ```text
//! cargo run --release -p devcomm-benches --bin moe_bench -- --nccl   # starts 2 ranks
//! devcomm-run -n 2 target/release/moe_bench --tokens 128,4096 --dtype bf16 --nccl
//! devcomm-run -n 2 target/release/moe_bench --tokens 128 --fp8 --nccl   # fp8 dispatch
//! devcomm-run -n 2 target/release/moe_bench --mode ht --tokens 4096 --nccl   # high-throughput
//! ```
//!
//! In high-throughput mode (`--mode ht`) a token crosses to a rank once
//! however many of its experts live there, so the bytes counted are one
//! token per (token, destination rank) (combine: one partial back per
//! pair), as the NCCL path sends.
//!
//! Per token count (tokens per rank; each rank's own random top-k routing,
//! distinct experts, fixed seed): the median over `reps × iters` of
//! dispatch and of combine (CUDA events around each call), the bytes they
//! move per second (every (token, expert) pair's token: all of them, and
//! those crossing to another rank, "NVLink"), then, with `--nccl`, the same
//! exchange with NCCL: a count exchange (send/recv of one count per peer),
//! the counts read back to the host, and an all_to_all_v (grouped
//! send/recv) of each token once per destination rank; combine the
//! reverse all_to_all_v. The NCCL path's packing by destination and the
//! weighted sum are *not* timed (that favours NCCL). Last, the copy
//! engine's bandwidth for as many bytes as the dispatch sends to one peer
//! (`cuMemcpyAsync` into the peer's window). `#wrong`: elements of the
//! combined output (identity experts) off the host's by more than a
//! rounding. Rank 0 prints.

use clap::Parser;
use devcomm::coll::DataType;
use devcomm::comm::Communicator;
use devcomm::moe::{Dispatched, EpConfig, EpGroup, EpMode, HtLayout, LlCombine, LlPack, MoeType};
use devcomm::runtime::{DeviceBuffer, Event};
use devcomm::window::WindowFlags;
use devcomm::{Error, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::process::ExitCode;

#[derive(Parser, Debug, Clone)]
#[command(
    about = "MoE dispatch/combine (devcomm low-latency or high-throughput mode), NCCL and the copy engine beside it"
)]
struct Args {
    /// Tokens per rank, a list.
    #[arg(long, default_value = "128,4096", value_delimiter = ',')]
    tokens: Vec<usize>,
    /// Elements per token.
    #[arg(long, default_value_t = 7168)]
    hidden: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 8)]
    topk: usize,
    /// Experts in all.
    #[arg(long, default_value_t = 256)]
    experts: usize,
    /// bf16, f16, f32.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Timed dispatch + combine pairs per repetition.
    #[arg(short = 'n', long, default_value_t = 20)]
    iters: usize,
    /// Untimed pairs first.
    #[arg(short = 'w', long, default_value_t = 5)]
    warmup: usize,
    /// Repetitions (a host barrier before each).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// CTAs and threads per CTA of the kernels (0: the library's default).
    #[arg(long, default_value_t = 0)]
    ctas: u32,
    /// See `ctas`.
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// Fp8 e4m3 dispatch with per-128 scales (bf16 tokens; combine in bf16).
    #[arg(long)]
    fp8: bool,
    /// `ll` (low-latency) or `ht` (high-throughput).
    #[arg(long, default_value = "ll")]
    mode: String,
    /// High-throughput channels per destination rank (0: the library's default).
    #[arg(long, default_value_t = 0)]
    channels: u32,
    /// Also each kernel's stage times (`EpConfig::stage_stamps`: every CTA
    /// syncs at each stage, in the timed runs too), medians of `iters`
    /// more pairs, a line per rank.
    #[arg(long)]
    stages: bool,
    /// Also the NCCL path (libnccl loaded at run time; CUDA only).
    #[arg(long)]
    nccl: bool,
    /// Low-latency: the token-major pack (`LlPack::TokenMajor`) instead of
    /// the default per expert.
    #[arg(long)]
    token_major_pack: bool,
    /// Low-latency: combine per expert (`LlCombine::PerExpert`) instead of
    /// the default per rank.
    #[arg(long)]
    combine_per_expert: bool,
    /// High-throughput: DeepEP's output layout (`HtLayout::PerSource`: each
    /// received token once, no pack; combine takes one row per received
    /// token, here made on the host once: the token times its local gates' sum).
    #[arg(long)]
    per_source: bool,
    /// High-throughput per source, the tokens left in the group's window
    /// (`HtLayout::PerSourceInWindow`: no copy out of the window).
    #[arg(long)]
    in_window: bool,
    /// Before each timed dispatch, line the ranks' streams up with an NCCL
    /// exchange of 4 bytes a peer (needs `--nccl`; not timed): the
    /// dispatch's time without the ranks' skew at its start.
    #[arg(long)]
    align: bool,
    /// Small shapes (hidden 256, 16 experts, top-4, 32 tokens): a smoke run.
    #[arg(long)]
    quick: bool,
}

/// Rank `r`'s routing: distinct random experts per token, random gates.
fn routing(a: &Args, r: usize, tokens: usize) -> (Vec<i32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(0x5EED ^ (r as u64) << 20 ^ tokens as u64);
    let all: Vec<i32> = (0..a.experts as i32).collect();
    let idx = (0..tokens).flat_map(|_| all.choose_multiple(&mut rng, a.topk).cloned().collect::<Vec<_>>()).collect();
    let w = (0..tokens * a.topk).map(|_| rng.gen_range(0.05f32..1.0)).collect();
    (idx, w)
}

/// The ranks token `t`'s top-k experts live on (`l` experts per rank), each once, in order.
fn dest_ranks(a: &Args, idx: &[i32], l: usize, t: usize) -> Vec<usize> {
    let mut ranks: Vec<usize> = idx[t * a.topk..(t + 1) * a.topk].iter().map(|&e| e as usize / l).collect();
    ranks.sort();
    ranks.dedup();
    ranks
}

fn events(dev: &devcomm::Device, n: usize) -> Result<Vec<Event>> {
    (0..n).map(|_| Event::new(dev)).collect()
}

fn median(v: Vec<f64>) -> f64 {
    devcomm_benches::median(v)
}

/// Elements of `y` off `sum of gates * x` by more than `eps` relative.
fn count_wrong<T: MoeType, U: MoeType>(a: &Args, w: &[f32], xs: &[T], y: &[U], tokens: usize, eps: f64) -> usize {
    let mut wrong = 0;
    for t in 0..tokens {
        let g: f32 = w[t * a.topk..(t + 1) * a.topk].iter().sum();
        for c in 0..a.hidden {
            let want = g as f64 * xs[t * a.hidden + c].to_f64();
            if (y[t * a.hidden + c].to_f64() - want).abs() > eps * want.abs().max(1.0) {
                wrong += 1;
            }
        }
    }
    wrong
}

/// Median µs of `step(0)` (dispatch) and `step(1)` (combine), CUDA events
/// around each, `iters` pairs per repetition after `warmup` untimed ones;
/// `align()` queued before each pair, outside the events. Then the median
/// µs of a pair back to back: `iters` pairs between two events (no event
/// or `align()` between them; session 23's plain-CUDA floors were timed so).
fn time_pairs(
    comm: &Communicator,
    a: &Args,
    step: &mut dyn FnMut(u32) -> Result<()>,
    align: &dyn Fn() -> Result<()>,
    ep: &EpGroup,
) -> Result<(f64, f64, f64)> {
    let (dev, stream) = (comm.device(), comm.device().stream());
    for _ in 0..a.warmup {
        step(0)?;
        step(1)?;
    }
    ep.synchronize(stream)?;
    let (mut td, mut tc) = (Vec::new(), Vec::new());
    for _ in 0..a.reps {
        comm.bootstrap_barrier()?;
        let ev = events(dev, 3 * a.iters)?;
        for i in 0..a.iters {
            align()?;
            stream.record(&ev[3 * i])?;
            step(0)?;
            stream.record(&ev[3 * i + 1])?;
            step(1)?;
            stream.record(&ev[3 * i + 2])?;
        }
        ep.synchronize(stream)?;
        for i in 0..a.iters {
            td.push(ev[3 * i].elapsed_ms(&ev[3 * i + 1])? as f64 * 1e3);
            tc.push(ev[3 * i + 1].elapsed_ms(&ev[3 * i + 2])? as f64 * 1e3);
        }
    }
    let mut tp = Vec::new();
    for _ in 0..a.reps {
        comm.bootstrap_barrier()?;
        let ev = events(dev, 2)?;
        stream.record(&ev[0])?;
        for _ in 0..a.iters {
            step(0)?;
            step(1)?;
        }
        stream.record(&ev[1])?;
        ep.synchronize(stream)?;
        tp.push(ev[0].elapsed_ms(&ev[1])? as f64 * 1e3 / a.iters.max(1) as f64);
    }
    Ok((median(td), median(tc), median(tp)))
}

/// With `--stages`: `iters` more dispatch/combine pairs, each read back
/// with `EpGroup::stage_times`; the median of each stage, in µs, as a
/// line (None without `--stages`).
fn stage_medians(a: &Args, step: &mut dyn FnMut(u32) -> Result<()>, ep: &EpGroup) -> Result<Option<String>> {
    if !a.stages {
        return Ok(None);
    }
    let stream = ep.comm().device().stream();
    let mut all: Vec<[f64; 7]> = Vec::new();
    for _ in 0..a.iters.max(1) {
        step(0)?;
        step(1)?;
        ep.synchronize(stream)?;
        let s = ep.stage_times(stream)?;
        let (d, c) = (s.dispatch, s.combine);
        // The combine has no counting step (its stamp is the wait's).
        let t = [d.sent_ns, d.waited_ns, d.counted_ns, d.done_ns, c.sent_ns, c.waited_ns, c.done_ns];
        all.push(t.map(|t| t as f64 / 1e3));
    }
    let m: Vec<f64> = (0..7).map(|i| median(all.iter().map(|v| v[i]).collect())).collect();
    Ok(Some(format!(
        "# rank {} stages (us, slowest CTA, from the first CTA's start): dispatch sent {:.1} waited {:.1} counted {:.1} packed {:.1} | combine sent {:.1} waited {:.1} reduced {:.1}",
        ep.comm().rank(),
        m[0], m[1], m[2], m[3], m[4], m[5], m[6]
    )))
}

fn run_tokens<T: MoeType>(
    comm: &Communicator,
    a: &Args,
    tokens: usize,
    nccl: Option<&nccl::Nccl>,
) -> Result<(Vec<String>, Option<String>, String)> {
    let (n, me) = (comm.count(), comm.rank());
    let dev = comm.device();
    let stream = dev.stream();
    let mut cfg = EpConfig::new(a.experts, a.hidden, a.topk, tokens).with_dtype(T::DTYPE);
    cfg.fp8_dispatch = a.fp8;
    cfg.ctas = a.ctas;
    cfg.threads = a.threads;
    cfg.channels = a.channels;
    cfg.stage_stamps = a.stages;
    cfg.ll_pack = if a.token_major_pack { LlPack::TokenMajor } else { LlPack::PerExpert };
    cfg.ll_combine = if a.combine_per_expert { LlCombine::PerExpert } else { LlCombine::PerRank };
    let ht = a.mode == "ht";
    if ht {
        cfg = cfg.with_mode(EpMode::HighThroughput);
        if a.in_window {
            cfg.ht_layout = HtLayout::PerSourceInWindow;
        } else if a.per_source {
            cfg.ht_layout = HtLayout::PerSource;
        }
    }
    let ep = EpGroup::new(comm, &cfg)?;
    let (idx, w) = routing(a, me, tokens);
    let (bar_s, bar_r) = (dev.alloc::<u32>(n)?, dev.alloc::<u32>(n)?);
    let four = vec![4usize; n];
    let align = || -> Result<()> {
        match nccl {
            Some(nc) if a.align => nc.exchange_v(bar_s.device_addr(), bar_r.device_addr(), &four, &four, stream),
            _ => Ok(()),
        }
    };
    let mut rng = StdRng::seed_from_u64(me as u64 + 7);
    let xs: Vec<T> = (0..tokens * a.hidden).map(|_| T::from_f64(rng.gen_range(-1.0..1.0))).collect();
    let (x, idxd, wd) = (dev.alloc_from(&xs)?, dev.alloc_from(&idx)?, dev.alloc_from(&w)?);
    let (td, tc, tp, wrong, stages) = if a.fp8 {
        let xb = dev.alloc_from(bytemuck::cast_slice::<T, half::bf16>(&xs))?;
        let mut out = ep.alloc_output_fp8()?;
        let mut eo = dev.alloc::<half::bf16>(out.recv_x.len())?;
        let mut y = dev.alloc::<half::bf16>(tokens * a.hidden)?;
        // Identity experts on the dequantized tokens (made on the host once).
        ep.dispatch_fp8_into(&xb, &idxd, &wd, &mut out, stream)?;
        ep.synchronize(stream)?;
        let (q, sc) = (stream.read_vec(&out.recv_x)?, stream.read_vec(&out.recv_scales)?);
        let deq: Vec<half::bf16> = (0..q.len()).map(|i| half::bf16::from_f32(q[i].to_f32() * sc[i / 128])).collect();
        stream.write(&mut eo, &deq)?;
        ep.combine_into(&eo, &out.handle, &mut y, stream)?;
        ep.synchronize(stream)?;
        let wrong = count_wrong(a, &w, &xs, &stream.read_vec(&y)?, tokens, 1.0 / 8.0);
        let mut step = |phase: u32| {
            if phase == 0 {
                ep.dispatch_fp8_into(&xb, &idxd, &wd, &mut out, stream)
            } else {
                ep.combine_into(&eo, &out.handle, &mut y, stream)
            }
        };
        let (td, tc, tp) = time_pairs(comm, a, &mut step, &align, &ep)?;
        (td, tc, tp, wrong, stage_medians(a, &mut step, &ep)?)
    } else {
        let mut out = ep.alloc_output::<T>()?;
        let mut y = dev.alloc::<T>(tokens * a.hidden)?;
        ep.dispatch_into(&x, &idxd, &wd, &mut out, stream)?;
        // Identity experts: y = sum of gates * x. Per expert, combine
        // weighs the received rows itself; per source it takes each
        // received row times its local gates' sum (made on the host once:
        // the routing stays the same).
        let rows_in = if ht && a.per_source && !a.in_window {
            ep.synchronize(stream)?;
            let rx = stream.read_vec(&out.recv_x)?;
            let rw = stream.read_vec(out.handle.recv_topk_weights().expect("per-source tables"))?;
            let rows: Vec<T> = (0..rx.len())
                .map(|i| {
                    let r = i / a.hidden;
                    let g: f32 = rw[r * a.topk..(r + 1) * a.topk].iter().sum();
                    T::from_f64((rx[i].to_f64() as f32 * g) as f64)
                })
                .collect();
            Some(dev.alloc_from(&rows)?)
        } else {
            None
        };
        // In the window (`--in-window`), combine in place: the rows are the
        // tokens as they arrived (identity experts, weight 1 on each
        // rank), so each token comes back times the ranks it went to.
        let combine = |out: &Dispatched<T>, y: &mut DeviceBuffer<T>| {
            if a.in_window {
                ep.combine_in_window_into(&out.handle, y, stream)
            } else {
                ep.combine_into(rows_in.as_ref().unwrap_or(&out.recv_x), &out.handle, y, stream)
            }
        };
        combine(&out, &mut y)?;
        ep.synchronize(stream)?;
        let eps = if T::DTYPE == DataType::F32 { 1e-5 } else { 1.0 / 64.0 };
        let gates = if a.in_window {
            let l = a.experts / n;
            let mut g = vec![0.0f32; tokens * a.topk];
            for t in 0..tokens {
                g[t * a.topk] = dest_ranks(a, &idx, l, t).len() as f32;
            }
            g
        } else {
            w.clone()
        };
        let wrong = count_wrong(a, &gates, &xs, &stream.read_vec(&y)?, tokens, eps);
        let mut step = |phase: u32| {
            if phase == 0 {
                ep.dispatch_into(&x, &idxd, &wd, &mut out, stream)
            } else {
                combine(&out, &mut y)
            }
        };
        let (td, tc, tp) = time_pairs(comm, a, &mut step, &align, &ep)?;
        (td, tc, tp, wrong, stage_medians(a, &mut step, &ep)?)
    };
    let token_bytes = a.hidden * std::mem::size_of::<T>();
    let sent_bytes = if a.fp8 { a.hidden + a.hidden / 32 } else { token_bytes };
    let l = a.experts / n;
    // Token copies that travel: per (token, expert) pair, or in
    // high-throughput mode per (token, destination rank).
    let (pairs, remote) = if ht {
        let ranks: Vec<usize> = (0..tokens).flat_map(|t| dest_ranks(a, &idx, l, t)).collect();
        (ranks.len(), ranks.iter().filter(|&&d| d != me).count())
    } else {
        (idx.iter().filter(|&&e| e >= 0).count(), idx.iter().filter(|&&e| e >= 0 && e as usize / l != me).count())
    };
    let (all_b, nv_b) = ((pairs * sent_bytes) as f64, (remote * sent_bytes) as f64);
    let comb_b = (pairs * token_bytes) as f64;
    let mut row = vec![
        format!("{tokens:>7}"),
        format!("{td:10.2}"),
        format!("{:8.1}", all_b / td / 1e3),
        format!("{:8.1}", nv_b / td / 1e3),
        format!("{tc:10.2}"),
        format!("{:8.1}", comb_b / tc / 1e3),
        format!("{wrong:6}"),
    ];
    drop(ep);
    // NCCL: one copy of each token per destination rank.
    if let Some(nc) = nccl {
        let mut send_rows: Vec<Vec<T>> = vec![Vec::new(); n];
        for t in 0..tokens {
            for d in dest_ranks(a, &idx, l, t) {
                send_rows[d].extend_from_slice(&xs[t * a.hidden..(t + 1) * a.hidden]);
            }
        }
        let counts: Vec<u32> = send_rows.iter().map(|r| (r.len() / a.hidden) as u32).collect();
        let send = dev.alloc_from(&send_rows.concat())?;
        let cnt = dev.alloc_from(&counts)?;
        let rcnt = dev.alloc::<u32>(n)?;
        let recv = dev.alloc::<T>(n * tokens * a.hidden)?;
        let back = dev.alloc::<T>((send.len()).max(1))?;
        let base = send.device_addr();
        let once = |ev: Option<(&Event, &Event, &Event)>| -> Result<()> {
            if let Some((e0, _, _)) = ev {
                stream.record(e0)?;
            }
            nc.exchange_v(cnt.device_addr(), rcnt.device_addr(), &vec![4; n], &vec![4; n], stream)?;
            let rc = stream.read_vec(&rcnt)?; // the host round trip
            let sb: Vec<usize> = counts.iter().map(|&c| c as usize * token_bytes).collect();
            let rb: Vec<usize> = rc.iter().map(|&c| c as usize * token_bytes).collect();
            nc.exchange_v(base, recv.device_addr(), &sb, &rb, stream)?;
            if let Some((_, e1, _)) = ev {
                stream.record(e1)?;
            }
            nc.exchange_v(recv.device_addr(), back.device_addr(), &rb, &sb, stream)?;
            if let Some((_, _, e2)) = ev {
                stream.record(e2)?;
            }
            Ok(())
        };
        for _ in 0..a.warmup {
            once(None)?;
        }
        stream.synchronize()?;
        let (mut nd, mut ncb) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            comm.bootstrap_barrier()?;
            for _ in 0..a.iters {
                let ev = events(dev, 3)?;
                once(Some((&ev[0], &ev[1], &ev[2])))?;
                stream.synchronize()?;
                nd.push(ev[0].elapsed_ms(&ev[1])? as f64 * 1e3);
                ncb.push(ev[1].elapsed_ms(&ev[2])? as f64 * 1e3);
            }
        }
        let (nd, ncb) = (median(nd), median(ncb));
        row.extend([
            format!("{nd:10.2}"),
            format!("{ncb:10.2}"),
            format!("{:6.2}x", nd / td),
            format!("{:6.2}x", ncb / tc),
        ]);
    } else {
        row.extend(["       n/a".into(), "       n/a".into(), "    n/a".into(), "    n/a".into()]);
    }
    // The copy engine: the dispatch's bytes to one peer, into its window.
    let per_peer = ((remote.max(1) * token_bytes) / (n - 1).max(1)).max(16);
    let mem = comm.mem_alloc(per_peer)?;
    let win = comm.register_window(&mem, WindowFlags::empty())?;
    let src = dev.alloc::<u8>(per_peer)?;
    let peer = (comm.lsa_rank()? + 1) % comm.lsa_size()?;
    let dst = win.lsa_pointer(0, peer)?;
    let copy = || -> Result<()> {
        // SAFETY: `src` is `per_peer` bytes of this device; `dst` the peer's
        // window of `per_peer` bytes, mapped here; they do not overlap.
        unsafe { stream.memcpy_raw(dst, src.device_addr(), per_peer) }
    };
    for _ in 0..a.warmup {
        copy()?;
    }
    stream.synchronize()?;
    let mut tce = Vec::new();
    for _ in 0..a.reps {
        comm.bootstrap_barrier()?;
        let ev = events(dev, 2)?;
        stream.record(&ev[0])?;
        for _ in 0..a.iters {
            copy()?;
        }
        stream.record(&ev[1])?;
        stream.synchronize()?;
        tce.push(ev[0].elapsed_ms(&ev[1])? as f64 * 1e3 / a.iters as f64);
    }
    let tce = median(tce);
    row.push(format!("{:8.1}", per_peer as f64 / tce / 1e3));
    comm.bootstrap_barrier()?;
    drop(win);
    let pairs_line = format!(
        "# back to back: {tp:.2} us a dispatch + combine pair ({} pairs between two events), against {:.2} = dispatch + combine with events around each",
        a.iters,
        td + tc
    );
    Ok((row, stages, pairs_line))
}

fn run<T: MoeType>(a: &Args) -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let stream = comm.device().stream();
    let nc = if a.nccl { Some(nccl::Nccl::new(&comm, stream)?) } else { None };
    if comm.rank() == 0 {
        println!(
            "# moe_bench: {} ranks ({} runtime), {} experts, hidden {}, top-{}, {}{}, {} mode{}; iters {} warmup {} reps {} (median)",
            comm.count(),
            comm.device().kind(),
            a.experts,
            a.hidden,
            a.topk,
            a.dtype,
            if a.fp8 { " (fp8 e4m3 dispatch, per-128 scales)" } else { "" },
            match (a.mode == "ht", a.in_window, a.per_source) {
                (false, ..) => "low-latency",
                (true, true, _) => "high-throughput (per source, in the window)",
                (true, false, true) => "high-throughput (per source)",
                (true, false, false) => "high-throughput (per expert)",
            },
            if a.align { ", ranks lined up before each dispatch (--align)" } else { "" },
            a.iters,
            a.warmup,
            a.reps
        );
        println!("# tokens |   dispatch   GB/s  NVLink GB/s |   combine    GB/s | #wrong | NCCL dispatch  NCCL combine  (NCCL / devcomm: dispatch, combine) | copy engine GB/s");
        println!("#  /rank |      (us)  (all)  (to peers)  |      (us)   (all) |        |        (us)          (us)");
    }
    for &t in &a.tokens {
        let (row, stages, pairs_line) = run_tokens::<T>(&comm, a, t, nc.as_ref())?;
        if comm.rank() == 0 {
            println!("{}", row.join(" "));
            println!("{pairs_line}");
        }
        if let Some(line) = stages {
            // A rank at a time, in order.
            for r in 0..comm.count() {
                comm.bootstrap_barrier()?;
                if r == comm.rank() {
                    println!("{line}");
                    std::io::Write::flush(&mut std::io::stdout()).ok();
                }
            }
        }
    }
    drop(nc);
    comm.finalize()
}

mod nccl {
    use devcomm::comm::Communicator;
    use devcomm::runtime::Stream;
    use devcomm::Result;
    use devcomm_benches::nccl::{cuda_stream, err, result, sys, NcclComm};

    /// An NCCL communicator over the same ranks and devices.
    pub struct Nccl {
        comm: NcclComm,
    }

    impl Nccl {
        pub fn new(comm: &Communicator, stream: &Stream) -> Result<Nccl> {
            Ok(Nccl { comm: NcclComm::over(comm, stream)? })
        }

        /// `send_bytes[p]` bytes from `send + sum of earlier send_bytes` to
        /// rank `p`, `recv_bytes[p]` from rank `p` likewise (an
        /// all_to_all_v of bytes: one group of send/recv).
        pub fn exchange_v(
            &self,
            send: u64,
            recv: u64,
            send_bytes: &[usize],
            recv_bytes: &[usize],
            stream: &Stream,
        ) -> Result<()> {
            let (s, comm) = (cuda_stream(stream)?, self.comm.raw());
            let u8t = sys::ncclDataType_t::ncclUint8;
            result::group_start().map_err(|e| err("group_start", e))?;
            let (mut so, mut ro) = (0u64, 0u64);
            for p in 0..send_bytes.len() {
                // SAFETY: the caller's buffers hold the sums of the byte counts.
                unsafe {
                    result::send((send + so) as *const _, send_bytes[p], u8t, p as i32, comm, s)
                        .map_err(|e| err("send", e))?;
                    result::recv((recv + ro) as *mut _, recv_bytes[p], u8t, p as i32, comm, s)
                        .map_err(|e| err("recv", e))?;
                }
                so += send_bytes[p] as u64;
                ro += recv_bytes[p] as u64;
            }
            result::group_end().map(|_| ()).map_err(|e| err("group_end", e))
        }
    }
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        args = Args { tokens: vec![32], hidden: 256, experts: 16, topk: 4, iters: 3, warmup: 1, reps: 2, ..args };
    }
    if args.mode != "ll" && args.mode != "ht" {
        eprintln!("moe_bench: --mode ll or ht");
        return ExitCode::FAILURE;
    }
    if args.align && !args.nccl {
        eprintln!("moe_bench: --align lines the ranks up with NCCL (add --nccl)");
        return ExitCode::FAILURE;
    }
    if args.fp8 && args.mode == "ht" {
        eprintln!("moe_bench: --fp8 is a low-latency feature (--mode ll)");
        return ExitCode::FAILURE;
    }
    if args.fp8 && args.dtype != "bf16" {
        eprintln!("moe_bench: --fp8 dispatches bf16 tokens (--dtype bf16)");
        return ExitCode::FAILURE;
    }
    devcomm_benches::bench_main("moe_bench", 2, |_| match args.dtype.as_str() {
        "bf16" => run::<half::bf16>(&args),
        "f16" => run::<half::f16>(&args),
        "f32" => run::<f32>(&args),
        d => Err(Error::invalid_argument(format!("dtype {d}: bf16, f16, f32"))),
    })
}
