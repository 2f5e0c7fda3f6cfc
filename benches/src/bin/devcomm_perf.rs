//! devcomm-perf: collectives measured like nccl-tests, NCCL beside them.
//!
//! ```text
//! devcomm-run -n 2 target/release/devcomm_perf -b 8 -e 128M -f 2 -o all_reduce -d f32 --nccl
//! DEVCOMM_LSA_SIZE=2 devcomm-run -n 4 target/release/devcomm_perf -o all_reduce --multi-team hier
//! ```
//!
//! Over several LSA teams (`DEVCOMM_LSA_SIZE` below the rank count) the
//! collectives run hierarchically or flat (`--multi-team`, see
//! `devcomm::coll::MultiTeam`), and a last column gives the bytes rank 0
//! sent over GIN for one operation.
//!
//! Per size: size (bytes of the larger buffer, as nccl-tests), count,
//! type, redop, root; then for devcomm out of place, devcomm in place,
//! devcomm in-kernel (`--in-kernel`: `iters` all-reduces inside one kernel,
//! what a fused kernel pays) and NCCL out of place (`--nccl`): time (µs),
//! algbw and busbw (GB/s, nccl-tests' formulas) and #wrong (elements that
//! differ from the closed-form expected value; data are small integers, so
//! sums are exact in every float type). Each time is the median over
//! `--reps` repetitions of `iters` back-to-back operations timed with CUDA
//! events, after `warmup` untimed ones and a host barrier. Rank 0 prints.

use clap::Parser;
use devcomm::coll::{Algorithm, CollConfig, CollType, Collectives, MultiTeam, Op, Operand, PartStages};
use devcomm::comm::Communicator;
use devcomm::runtime::{DeviceBuffer, Event, LaunchConfig, Stream};
use devcomm::window::WindowFlags;
use devcomm::{Error, Result};
use devcomm_device::coll::{CollArgs, CollBuffer};
use devcomm_device::comm::WindowDesc;
use devcomm_test_kernels::coll_bench::{all_reduce_loop_f32, coll_empty, coll_probe, coll_traced};
use std::process::ExitCode;

#[derive(Parser, Debug, Clone)]
#[command(about = "devcomm collectives, nccl-tests style, NCCL beside them")]
struct Args {
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', long, default_value = "8", value_parser = bytes)]
    minbytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long, default_value = "128M", value_parser = bytes)]
    maxbytes: usize,
    /// Size step factor.
    #[arg(short = 'f', long, default_value_t = 2)]
    stepfactor: usize,
    /// all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv.
    #[arg(short = 'o', long, default_value = "all_reduce")]
    op: String,
    /// f32, bf16, f16, i32, f64.
    #[arg(short = 'd', long, default_value = "f32")]
    datatype: String,
    /// Timed operations per repetition.
    #[arg(short = 'n', long, default_value_t = 20)]
    iters: usize,
    /// Untimed operations first.
    #[arg(short = 'w', long, default_value_t = 5)]
    warmup: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Check results (0: no).
    #[arg(short = 'c', long, default_value_t = 1)]
    check: u8,
    /// Operands in registered windows (zero copy) instead of device buffers.
    #[arg(long)]
    window: bool,
    /// Also time all-reduces back to back inside one kernel (f32 only).
    #[arg(long)]
    in_kernel: bool,
    /// Also run NCCL on the same buffers (libnccl loaded at run time).
    #[arg(long)]
    nccl: bool,
    /// auto, ll, one_shot, two_shot: all_reduce's (over several LSA teams:
    /// the in-team step of the two-step hierarchical all-reduce); broadcast's
    /// and reduce's ll (no barrier), one_shot (direct) or two_shot (relayed).
    #[arg(long, default_value = "auto")]
    algorithm: String,
    /// Over several LSA teams (`DEVCOMM_LSA_SIZE` below the rank count):
    /// auto, flat or hier (`devcomm::coll::MultiTeam`); default: what
    /// `DEVCOMM_COLL_MULTI_TEAM` says, else auto.
    #[arg(long)]
    multi_team: Option<String>,
    /// `CollConfig::bytes_per_cta` (default: the library's).
    #[arg(long, value_parser = bytes)]
    bytes_per_cta: Option<usize>,
    /// `CollConfig::stage_bytes` (default: the library's).
    #[arg(long, value_parser = bytes)]
    stage_bytes: Option<usize>,
    /// `CollConfig::p2p_chunk_bytes` (default: the library's): the chunks
    /// of sends and receives inside an LSA team.
    #[arg(long, value_parser = bytes)]
    p2p_chunk_bytes: Option<usize>,
    /// `CollConfig::p2p_slots` (default: the library's).
    #[arg(long)]
    p2p_slots: Option<u32>,
    /// `CollConfig::p2p_gin_chunk_bytes` (default: the library's): the
    /// chunks of sends and receives over GIN, between LSA teams.
    #[arg(long, value_parser = bytes)]
    p2p_gin_chunk_bytes: Option<usize>,
    /// `CollConfig::p2p_gin_slots` (default: the library's).
    #[arg(long)]
    p2p_gin_slots: Option<u32>,
    /// `CollConfig::max_ctas` (default: the library's).
    #[arg(long)]
    max_ctas: Option<u32>,
    /// `CollConfig::threads` (default: the library's).
    #[arg(long)]
    threads: Option<u32>,
    /// After each size's timings (all_gather, all_reduce; f32): this many
    /// more calls back to back, each CTA's start, end and SM stamped, and a
    /// line per call on every rank (where a slow call's time goes).
    #[arg(long, default_value_t = 0)]
    trace: usize,
    /// With `--trace`: only the traced calls (no timings), and every CTA's
    /// stamps of the first calls printed too.
    #[arg(long)]
    trace_only: bool,
    /// All-reduce: the stages of the last timed out-of-place call
    /// (`CollConfig::stage_stamps`, `Collectives::stage_times`), a comment
    /// line per size and rank: each stage's median over CTAs since the
    /// CTA's own start, and its latest since the earliest CTA's start. The
    /// stamps stay on for every call of the run.
    #[arg(long)]
    stages: bool,
    /// Launch plainly, not cooperatively (`CollConfig::cooperative`).
    #[arg(long)]
    no_cooperative: bool,
    /// Also the floors of the host-launched column: an empty kernel
    /// launched as the collective's (same grid, threads, launch kind,
    /// arguments), timed the same way; and the CPU time per call of the
    /// devcomm collective (when it exceeds the GPU time, the host bounds it).
    #[arg(long)]
    floor: bool,
    /// Time CUDA graphs (as nccl-tests' `-G`): the `iters` calls of a
    /// repetition captured once into a graph, each repetition one launch of
    /// it (devcomm, the floor's empty kernels and NCCL alike).
    #[arg(long)]
    graph: bool,
    /// With `--trace`: the traced all-reduces number their LL calls on the
    /// device (sequence 0, as the host collectives do) instead of taking
    /// numbers the host reserved.
    #[arg(long)]
    device_seq: bool,
    /// Only the probes: the test kernel `coll_probe` in each of its modes
    /// (nothing, one NVLink store, one local store, a 664-byte stack frame,
    /// a system fence, a load), one CTA launched as the collectives are,
    /// timed like the collectives (`--graph` for graphs): what each piece
    /// of a collective kernel costs a launch.
    #[arg(long)]
    probe: bool,
}

fn bytes(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().map(|v| v * mul).map_err(|e| format!("{s}: {e}"))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    /// nccl-tests' sendrecv: send to the next rank, receive from the previous (one group).
    SendRecv,
}

impl Kind {
    fn parse(s: &str) -> Result<Kind> {
        Ok(match s {
            "all_reduce" => Kind::AllReduce,
            "all_gather" => Kind::AllGather,
            "reduce_scatter" => Kind::ReduceScatter,
            "broadcast" => Kind::Broadcast,
            "reduce" => Kind::Reduce,
            "all_to_all" => Kind::AllToAll,
            "send_recv" | "sendrecv" => Kind::SendRecv,
            _ => return Err(Error::invalid_argument(format!("unknown op {s}"))),
        })
    }
    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(self, n: f64) -> f64 {
        match self {
            Kind::AllReduce => 2.0 * (n - 1.0) / n,
            Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => (n - 1.0) / n,
            Kind::Broadcast | Kind::Reduce | Kind::SendRecv => 1.0,
        }
    }
    /// (send elements, recv elements) per rank for `total` elements.
    fn lens(self, total: usize, n: usize) -> (usize, usize) {
        match self {
            Kind::AllReduce | Kind::Broadcast | Kind::Reduce | Kind::SendRecv => (total, total),
            Kind::AllGather => (total / n, total / n * n),
            Kind::ReduceScatter => (total / n * n, total / n),
            Kind::AllToAll => (total / n * n, total / n * n),
        }
    }
}

/// Element `i` of rank `r`'s input: a small integer (exact sums).
fn value(r: usize, i: usize) -> f64 {
    ((r + 1) * (i % 7)) as f64
}

/// Element `i` of rank `me`'s expected output.
fn expected(kind: Kind, n: usize, me: usize, i: usize, recv_len: usize) -> f64 {
    let sum = |j: usize| (0..n).map(|r| value(r, j)).sum::<f64>();
    match kind {
        Kind::AllReduce | Kind::Reduce => sum(i),
        Kind::Broadcast => value(0, i),
        Kind::AllGather => {
            let c = recv_len / n;
            value(i / c, i % c)
        }
        Kind::ReduceScatter => sum(me * recv_len + i),
        Kind::AllToAll => {
            let c = recv_len / n;
            value(i / c, me * c + i % c)
        }
        Kind::SendRecv => value((me + n - 1) % n, i),
    }
}

struct Bench<'c, T: CollType> {
    comm: &'c Communicator,
    coll: &'c Collectives<'c>,
    stream: &'c Stream,
    args: &'c Args,
    kind: Kind,
    nccl: Option<&'c nccl::Nccl>,
    _t: std::marker::PhantomData<T>,
}

impl<T: CollType> Bench<'_, T> {
    fn op(&self, send: Operand<'_, T>, recv: Operand<'_, T>, algorithm: Algorithm) -> Result<()> {
        let (c, s) = (self.coll, self.stream);
        match self.kind {
            Kind::AllReduce => c.all_reduce_with(send, recv, Op::Sum, algorithm, s),
            Kind::AllGather => c.all_gather(send, recv, s),
            Kind::ReduceScatter => c.reduce_scatter(send, recv, Op::Sum, s),
            Kind::Broadcast => c.broadcast_with(send, recv, 0, algorithm, s),
            Kind::Reduce => c.reduce_with(send, recv, Op::Sum, 0, algorithm, s),
            Kind::AllToAll => c.all_to_all(send, recv, s),
            Kind::SendRecv => {
                let (n, me) = (self.comm.count(), self.comm.rank());
                c.group(s, |g| {
                    g.send(send, (me + 1) % n)?;
                    g.recv(recv, (me + n - 1) % n)
                })
            }
        }
    }

    /// Median µs per operation of `f` (iters back to back, reps times;
    /// with `--graph`, the iters captured once and the graph launched once
    /// per repetition).
    fn time(&self, f: &dyn Fn() -> Result<()>) -> Result<f64> {
        let dev = self.comm.device();
        for _ in 0..self.args.warmup {
            f()?;
        }
        self.coll.synchronize(self.stream)?;
        let iters = || -> Result<()> {
            for _ in 0..self.args.iters {
                f()?;
            }
            Ok(())
        };
        let graph = if self.args.graph { Some(self.stream.capture(|_| iters())?) } else { None };
        let run = || -> Result<()> {
            match &graph {
                // SAFETY: the graph's buffers are this size's, alive until
                // the synchronize after the last repetition.
                Some(g) => unsafe { g.launch(self.stream) },
                None => iters(),
            }
        };
        if graph.is_some() {
            // One untimed launch: uploads the graph.
            run()?;
            self.coll.synchronize(self.stream)?;
        }
        let mut t = Vec::new();
        for _ in 0..self.args.reps {
            self.comm.bootstrap_barrier()?;
            let (a, b) = (Event::new(dev)?, Event::new(dev)?);
            self.stream.record(&a)?;
            run()?;
            self.stream.record(&b)?;
            self.coll.synchronize(self.stream)?;
            t.push(a.elapsed_ms(&b)? as f64 * 1000.0 / self.args.iters as f64);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    }

    fn wrong(&self, recv: &DeviceBuffer<T>, len: usize) -> Result<usize> {
        if self.args.check == 0 || (self.kind == Kind::Reduce && self.comm.rank() != 0) {
            return Ok(0);
        }
        let got = self.stream.read_vec(recv)?;
        let (n, me) = (self.comm.count(), self.comm.rank());
        Ok((0..len).filter(|&i| got[i].to_f64() != expected(self.kind, n, me, i, len)).count())
    }

    fn size(&self, total_bytes: usize) -> Result<Vec<String>> {
        let (n, me) = (self.comm.count(), self.comm.rank());
        let size = std::mem::size_of::<T>();
        let (slen, rlen) = self.kind.lens(total_bytes / size, n);
        let dev = self.comm.device();
        let input: Vec<T> = (0..slen).map(|i| T::from_f64(value(me, i))).collect();
        let send = dev.alloc_from(&input)?;
        let recv = dev.alloc::<T>(rlen.max(1))?;
        let mem = if self.args.window { Some(self.comm.mem_alloc((slen + rlen).max(1) * size)?) } else { None };
        let window = match &mem {
            Some(m) => Some(self.comm.register_window(m, WindowFlags::COLL_SYMMETRIC)?),
            None => None,
        };
        if let Some(w) = &window {
            w.write(self.stream, 0, &input)?;
        }
        let src = || match &window {
            Some(w) => Operand::window(w, 0, slen),
            None => Operand::range(&send, 0, slen),
        };
        let algorithm = match self.args.algorithm.as_str() {
            "ll" => Algorithm::Ll,
            "one_shot" => Algorithm::OneShot,
            "two_shot" => Algorithm::TwoShot,
            _ => Algorithm::Auto,
        };
        if self.args.trace_only {
            self.trace(src()?, &recv, slen, algorithm)?;
            return Ok(vec![format!("# traced {total_bytes} bytes")]);
        }
        let bus = self.kind.bus_factor(n as f64);
        let bytes = (slen.max(rlen) * size) as f64;
        let cols = |t: f64, wrong: usize| {
            let algbw = bytes / t / 1e3;
            vec![format!("{t:9.2}"), format!("{algbw:7.2}"), format!("{:7.2}", algbw * bus), format!("{wrong:6}")]
        };
        let mut out = vec![
            format!("{:>12}", slen.max(rlen) * size),
            format!("{:>12}", slen.max(rlen)),
            format!("{:>6}", self.args.datatype),
            format!(
                "{:>6}",
                if matches!(self.kind, Kind::AllGather | Kind::Broadcast | Kind::AllToAll | Kind::SendRecv) {
                    "none"
                } else {
                    "sum"
                }
            ),
            format!("{:>4}", if matches!(self.kind, Kind::Broadcast | Kind::Reduce) { "0" } else { "-1" }),
        ];
        // devcomm, out of place.
        let recv_op = || Operand::range(&recv, 0, rlen);
        let gin_before = self.coll.gin_bytes_sent();
        self.op(src()?, recv_op()?, algorithm)?;
        self.coll.synchronize(self.stream)?;
        let gin_bytes = self.coll.gin_bytes_sent() - gin_before;
        let wrong = self.wrong(&recv, rlen)?;
        let t = self.time(&|| self.op(src()?, recv_op()?, algorithm))?;
        out.extend(cols(t, wrong));
        if self.args.stages && self.kind == Kind::AllReduce {
            println!("{}", self.stages_line(total_bytes)?);
        }
        // devcomm, in place (all_reduce, broadcast: the input buffer itself).
        if matches!(self.kind, Kind::AllReduce | Kind::Broadcast) {
            let buf = dev.alloc_from(&input)?;
            self.op((&buf).into(), (&buf).into(), algorithm)?;
            self.coll.synchronize(self.stream)?;
            let wrong = self.wrong(&buf, rlen)?;
            // In place repeatedly changes the data (sums grow); only the
            // first result was checked.
            let t = self.time(&|| self.op((&buf).into(), (&buf).into(), algorithm))?;
            out.extend(cols(t, wrong));
        } else {
            out.extend(["      n/a".into(), "    n/a".into(), "    n/a".into(), "   n/a".into()]);
        }
        // devcomm, in kernel.
        if self.args.in_kernel && self.kind == Kind::AllReduce && T::DTYPE == devcomm::coll::DataType::F32 {
            let t = self.in_kernel(src()?, &recv, rlen, algorithm)?;
            let wrong = self.wrong(&recv, rlen)?;
            out.extend(cols(t, wrong));
        }
        if self.args.floor {
            let op = || self.op(src()?, recv_op()?, algorithm);
            let (launch, plain, cpu) = self.floor(src()?, &recv, slen.max(rlen), algorithm, &op)?;
            out.push(format!("| {launch:9.2} {plain:9.2} {cpu:9.2}"));
        }
        if self.args.trace > 0
            && matches!(self.kind, Kind::AllReduce | Kind::AllGather)
            && T::DTYPE == devcomm::coll::DataType::F32
        {
            self.trace(src()?, &recv, slen, algorithm)?;
        }
        // NCCL, out of place, same buffers.
        if let Some(nc) = self.nccl {
            let f = || nc.run(self.kind, T::DTYPE, send.device_addr(), recv.device_addr(), slen, rlen, self.stream);
            f()?;
            self.stream.synchronize()?;
            let wrong = self.wrong(&recv, rlen)?;
            let t = self.time(&f)?;
            out.extend(cols(t, wrong));
        }
        if self.comm.lsa_size()? < n {
            out.push(format!("| {gin_bytes:>12}"));
        }
        drop(window);
        Ok(out)
    }

    /// `--stages`: the latest all-reduce kernel's stages on this rank, as a
    /// comment line.
    fn stages_line(&self, bytes: usize) -> Result<String> {
        let parts = self.coll.stage_times(self.stream)?;
        let us = |ns: u64| ns as f64 / 1e3;
        let show = |x: Option<f64>| x.map_or("    -".into(), |x| format!("{x:5.2}"));
        let mut line = format!(
            "# stages rank {} bytes {bytes}: {} CTAs, starts spread {:.2} us; per stage, median since the CTA's start / latest since the first start (us):",
            self.comm.rank(),
            parts.len(),
            us(parts.iter().map(|p| p.start_ns).max().unwrap_or(0))
        );
        type Stage = fn(&PartStages) -> Option<u64>;
        let stages: [(&str, Stage); 4] = [
            ("ready", |p| p.ready_ns),
            ("sent", |p| p.sent_ns),
            ("synced", |p| p.synced_ns),
            ("done", |p| Some(p.done_ns)),
        ];
        for (name, f) in stages {
            let own: Vec<f64> = parts.iter().filter_map(|p| f(p).map(|v| us(v - p.start_ns))).collect();
            let median = (!own.is_empty()).then(|| devcomm_benches::median(own));
            let latest = parts.iter().filter_map(f).max().map(us);
            line.push_str(&format!(" {name} {} / {}", show(median), show(latest)));
        }
        Ok(line)
    }

    /// The algorithm the host collectives run for `bytes` of this
    /// collective when asked for `algorithm`: `Auto` resolved as they resolve
    /// it (all-reduce: `Algorithm::resolve`; broadcast and reduce:
    /// `Algorithm::resolve_rooted` for one part); the others have one
    /// algorithm (`Auto`).
    fn resolve(&self, bytes: usize, algorithm: Algorithm) -> Algorithm {
        let ctx = self.coll.context();
        match self.kind {
            Kind::AllReduce => algorithm.resolve(bytes as u64, &ctx),
            Kind::Broadcast | Kind::Reduce => algorithm.resolve_rooted(bytes as u64, &ctx, 1),
            _ => Algorithm::Auto,
        }
    }

    /// The CTAs the host collectives give a `bytes`-byte all-reduce or
    /// all-gather with `algorithm` (LL: one).
    fn grid(&self, bytes: usize, algorithm: Algorithm) -> u32 {
        let config = self.coll.config();
        if algorithm == Algorithm::Ll {
            1
        } else {
            bytes.div_ceil(config.bytes_per_cta).clamp(1, config.max_ctas as usize) as u32
        }
    }

    /// The arguments of a collective (operator 0: sum) over `len` elements
    /// from `src` into `recv` on the collectives' context, as the host
    /// collectives launch it.
    fn args_for(
        &self,
        src: CollBuffer,
        recv: &DeviceBuffer<T>,
        len: usize,
        algorithm: Algorithm,
        errors: u64,
        seq: u32,
    ) -> CollArgs {
        CollArgs {
            ctx: self.coll.context(),
            src,
            dst: CollBuffer { ptr: recv.device_addr(), window: WindowDesc::NONE, offset: 0, in_window: 0, reserved: 0 },
            count: len as u64,
            scalar: 0,
            scalar_ptr: 0,
            errors,
            op: 0,
            root: 0,
            algorithm: algorithm as u32,
            seq,
        }
    }

    /// `--floor`: the median µs per launch of an empty kernel launched as
    /// the host collective launches this one (its grid for `len` elements
    /// with `algorithm`, its threads, cooperative or not, its arguments)
    /// and launched plainly (not cooperatively),
    /// and the median CPU µs per call of the devcomm collective itself
    /// (`op`: `iters` calls queued back to back, the stream synchronised
    /// after).
    fn floor(
        &self,
        src: Operand<'_, T>,
        recv: &DeviceBuffer<T>,
        len: usize,
        algorithm: Algorithm,
        op: &dyn Fn() -> Result<()>,
    ) -> Result<(f64, f64, f64)> {
        let module = devcomm_tests::test_kernels(self.comm.device());
        let bytes = len * std::mem::size_of::<T>();
        let algorithm = self.resolve(bytes, algorithm);
        let plain = LaunchConfig::new(self.grid(bytes, algorithm), self.coll.threads());
        let cfg = self.as_collectives_launch(plain);
        let args = self.args_for(src.kernel_buffer(), recv, len, algorithm, 0, 0);
        // SAFETY: the kernel touches nothing.
        let empty = |cfg: LaunchConfig| unsafe { self.stream.launch_in::<coll_empty>(&module, cfg, (args,)) };
        let launch = self.time(&|| empty(cfg))?;
        let launch_plain = self.time(&|| empty(plain))?;
        let mut cpu = Vec::new();
        for _ in 0..self.args.reps {
            self.comm.bootstrap_barrier()?;
            let t0 = std::time::Instant::now();
            for _ in 0..self.args.iters {
                op()?;
            }
            cpu.push(t0.elapsed().as_secs_f64() * 1e6 / self.args.iters as f64);
            self.coll.synchronize(self.stream)?;
        }
        Ok((launch, launch_plain, devcomm_benches::median(cpu)))
    }

    /// The nccl-tests-like table: a header, then a line per size.
    fn table(&self, config: &CollConfig, lsa: usize) -> Result<()> {
        if self.comm.rank() == 0 {
            let teams = if lsa < self.comm.count() {
                format!(" in {} LSA teams of {lsa} ({:?} across teams)", self.comm.count() / lsa, config.multi_team)
            } else {
                String::new()
            };
            println!(
                "# devcomm-perf {:?} {} on {} ranks{teams} ({} runtime), iters {} warmup {} reps {} (median), {}{}",
                self.kind,
                self.args.datatype,
                self.comm.count(),
                self.comm.device().kind(),
                self.args.iters,
                self.args.warmup,
                self.args.reps,
                if self.args.window { "operands in windows" } else { "operands in device buffers" },
                if self.args.graph { ", each repetition one CUDA graph of iters calls" } else { "" }
            );
            let mut head = "#        size        count   type  redop root |  devcomm out of place: time algbw busbw #wrong |  in place: time algbw busbw #wrong".to_string();
            if self.args.in_kernel {
                head += " |  in kernel: time algbw busbw #wrong";
            }
            if self.args.floor {
                head += " | floor: empty kernel as launched, plainly; CPU per call";
            }
            if self.args.nccl {
                head += " |  NCCL out of place: time algbw busbw #wrong";
            }
            if lsa < self.comm.count() {
                head += " | GIN bytes/op (this rank)";
            }
            println!("{head}");
            println!("#  (B)                                            (us)  (GB/s) (GB/s)");
        }
        let unit = std::mem::size_of::<T>() * self.comm.count();
        let mut size = self.args.minbytes.max(unit) / unit * unit;
        while size <= self.args.maxbytes {
            let cols = self.size(size)?;
            if self.comm.rank() == 0 {
                println!("{}", cols.join(" "));
            }
            size = (size * self.args.stepfactor.max(2)).div_ceil(unit) * unit;
        }
        Ok(())
    }

    /// `plain`, launched as the host collectives launch their kernels:
    /// co-resident (cooperative) unless `--no-cooperative`.
    fn as_collectives_launch(&self, plain: LaunchConfig) -> LaunchConfig {
        if self.coll.config().cooperative {
            plain.co_resident()
        } else {
            plain
        }
    }

    /// `--probe`: µs per launch of `coll_probe` in each mode.
    fn probe(&self) -> Result<()> {
        const MODES: [&str; 6] =
            ["nothing", "16 B NVLink store", "16 B local store", "664 B stack frame", "fence.sc.sys", "local load"];
        let module = devcomm_tests::test_kernels(self.comm.device());
        let word = self.comm.device().alloc_from(&[0u64])?;
        let recv = self.comm.device().alloc::<T>(1)?;
        let src = CollBuffer { ptr: 0, window: WindowDesc::NONE, offset: 0, in_window: 0, reserved: 0 };
        let args = self.args_for(src, &recv, 1, Algorithm::Auto, word.device_addr(), 0);
        let cfg = self.as_collectives_launch(LaunchConfig::new(1, self.coll.threads()));
        for (mode, what) in MODES.iter().enumerate() {
            // SAFETY: the context is live and no collective runs meanwhile;
            // `word` is a device u64 (mode 5).
            let launch = || unsafe { self.stream.launch_in::<coll_probe>(&module, cfg, (args, mode as u32)) };
            let t = self.time(&launch)?;
            if self.comm.rank() == 0 {
                println!("probe mode {mode} ({what}): {t:.2} us per launch");
            }
        }
        self.coll.synchronize(self.stream)
    }

    /// `--trace`: that many calls launched back to back, each CTA's start,
    /// end and SM stamped; prints a line per call (this rank's clock).
    fn trace(&self, src: Operand<'_, T>, recv: &DeviceBuffer<T>, len: usize, algorithm: Algorithm) -> Result<()> {
        let module = devcomm_tests::test_kernels(self.comm.device());
        let bytes = len * std::mem::size_of::<T>();
        let which = if self.kind == Kind::AllGather { 0u32 } else { 1 };
        let algorithm = self.resolve(bytes, algorithm);
        let ctas = self.grid(bytes, algorithm) as usize;
        let calls = self.args.trace;
        let stamps = self.comm.device().alloc_from(&vec![0u64; calls * ctas * 4])?;
        let src_buf = src.kernel_buffer();
        let launches = || -> Result<()> {
            for c in 0..calls {
                let seq = if self.args.device_seq { 0 } else { self.coll.reserve_seq(1) };
                let args = self.args_for(src_buf, recv, len, algorithm, 0, seq);
                let at = stamps.device_addr() + (c * ctas * 4 * 8) as u64;
                // SAFETY: `args` describes the live context and buffers (`len`
                // floats in, `len` or `n * len` out) on every rank, each call with
                // its reserved sequence number or 0 (numbered on the device, a
                // single CTA for LL); `at` holds `4 * ctas` u64s.
                unsafe {
                    self.stream.launch_in::<coll_traced>(
                        &module,
                        LaunchConfig::new(ctas as u32, self.coll.threads()).co_resident(),
                        (args, which, at),
                    )?
                };
            }
            Ok(())
        };
        // With `--graph`: the calls captured into one graph, launched once.
        if self.args.graph {
            let graph = self.stream.capture(|_| launches())?;
            // SAFETY: the buffers are alive until the read below waits.
            unsafe { graph.launch(self.stream)? };
        } else {
            launches()?;
        }
        let v = self.stream.read_vec(&stamps)?;
        let me = self.comm.rank();
        let mut prev_end = 0u64;
        for c in 0..calls {
            let cta = |b: usize| &v[(c * ctas + b) * 4..(c * ctas + b + 1) * 4];
            let (s0, s1) =
                ((0..ctas).map(|b| cta(b)[0]).min().unwrap_or(0), (0..ctas).map(|b| cta(b)[0]).max().unwrap_or(0));
            let (e0, e1) =
                ((0..ctas).map(|b| cta(b)[1]).min().unwrap_or(0), (0..ctas).map(|b| cta(b)[1]).max().unwrap_or(0));
            let slow = (0..ctas).max_by_key(|&b| cta(b)[1] - cta(b)[0]).unwrap_or(0);
            let mut sms: Vec<u64> = (0..ctas).map(|b| cta(b)[2]).collect();
            sms.sort_unstable();
            sms.dedup();
            let errs = (0..ctas).filter(|&b| cta(b)[3] != 0).count();
            let us = |ns: u64| ns as f64 / 1e3;
            println!(
                "trace rank {me} bytes {bytes} call {c:>3}: span {:>8.2} us, starts spread {:>7.2}, ends spread {:>7.2}, gap after previous {:>8.2}; slowest CTA {slow:>3} (sm {:>3}) {:>8.2} us from start {:>7.2}; {} SMs for {ctas} CTAs; {errs} errors",
                us(e1 - s0),
                us(s1 - s0),
                us(e1 - e0),
                if c == 0 { 0.0 } else { us(s0.saturating_sub(prev_end)) },
                cta(slow)[2],
                us(cta(slow)[1] - cta(slow)[0]),
                us(cta(slow)[0] - s0),
                sms.len(),
            );
            prev_end = e1;
            if self.args.trace_only && (1..=4).contains(&c) {
                for b in 0..ctas {
                    println!(
                        "trace rank {me} bytes {bytes} call {c:>3} cta {b:>3} sm {:>3}: start {:>7.2} end {:>8.2}",
                        cta(b)[2],
                        us(cta(b)[0] - s0),
                        us(cta(b)[1] - s0)
                    );
                }
            }
        }
        Ok(())
    }

    /// µs per all-reduce with `iters` of them inside one kernel.
    fn in_kernel(&self, src: Operand<'_, T>, recv: &DeviceBuffer<T>, len: usize, algorithm: Algorithm) -> Result<f64> {
        let module = devcomm_tests::test_kernels(self.comm.device());
        let errors = self.comm.device().alloc_from(&[0u32])?;
        let bytes = len * std::mem::size_of::<T>();
        let algorithm = self.resolve(bytes, algorithm);
        let ctas = self.grid(bytes, algorithm);
        let iters = self.args.iters as u32;
        let launch = || -> Result<()> {
            let base = self.coll.reserve_seq(iters.max(1));
            let args = self.args_for(src.kernel_buffer(), recv, len, algorithm, errors.device_addr(), base);
            // SAFETY: `args` describes the live context and buffers of `len`
            // floats on every rank; `iters` sequence numbers from `base` were
            // reserved above (every rank the same).
            unsafe {
                self.stream.launch_in::<all_reduce_loop_f32>(
                    &module,
                    LaunchConfig::new(ctas, self.coll.threads()).co_resident(),
                    (args, iters),
                )
            }
        };
        launch()?;
        self.stream.synchronize()?;
        if let Some(e) = Error::from_device_code(self.stream.read_vec(&errors)?[0], "all_reduce_loop_f32") {
            return Err(e);
        }
        let t = self.time(&launch)?;
        Ok(t / iters as f64)
    }
}

mod nccl {
    use super::Kind;
    use devcomm::coll::DataType;
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

        fn dtype(d: DataType) -> sys::ncclDataType_t {
            match d {
                DataType::F32 => sys::ncclDataType_t::ncclFloat32,
                DataType::F16 => sys::ncclDataType_t::ncclFloat16,
                DataType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
                DataType::F64 => sys::ncclDataType_t::ncclFloat64,
                _ => sys::ncclDataType_t::ncclInt32,
            }
        }

        /// One collective on `stream` from `send` to `recv` (device addresses).
        #[allow(clippy::too_many_arguments)]
        pub fn run(
            &self,
            kind: Kind,
            d: DataType,
            send: u64,
            recv: u64,
            slen: usize,
            rlen: usize,
            stream: &Stream,
        ) -> Result<()> {
            let s = cuda_stream(stream)?;
            let (dt, sum, comm) = (Self::dtype(d), sys::ncclRedOp_t::ncclSum, self.comm.raw());
            let (sp, rp) = (send as *const std::ffi::c_void, recv as *mut std::ffi::c_void);
            // SAFETY: `send`/`recv` are live device buffers of `slen`/`rlen`
            // elements on this rank's device; the stream is bound (above).
            let r = unsafe {
                match kind {
                    Kind::AllReduce => result::all_reduce(sp, rp, slen, dt, sum, comm, s),
                    Kind::AllGather => result::all_gather(sp, rp, slen, dt, comm, s),
                    Kind::ReduceScatter => result::reduce_scatter(sp, rp, rlen, dt, sum, comm, s),
                    Kind::Broadcast => result::broadcast(sp, rp, slen, dt, 0, comm, s),
                    Kind::Reduce => result::reduce(sp, rp, slen, dt, sum, 0, comm, s),
                    Kind::AllToAll => {
                        let n = result::comm_count(comm).map_err(|e| err("comm_count", e))? as usize;
                        let c = slen / n;
                        let size = match d {
                            DataType::F16 | DataType::Bf16 => 2,
                            DataType::F64 => 8,
                            _ => 4,
                        };
                        result::group_start().map_err(|e| err("group_start", e))?;
                        for p in 0..n {
                            let off = (p * c * size) as u64;
                            result::send((send + off) as *const _, c, dt, p as i32, comm, s)
                                .map_err(|e| err("send", e))?;
                            result::recv((recv + off) as *mut _, c, dt, p as i32, comm, s)
                                .map_err(|e| err("recv", e))?;
                        }
                        result::group_end()
                    }
                    Kind::SendRecv => {
                        let n = result::comm_count(comm).map_err(|e| err("comm_count", e))?;
                        let me = result::comm_user_rank(comm).map_err(|e| err("comm_user_rank", e))?;
                        result::group_start().map_err(|e| err("group_start", e))?;
                        result::send(sp, slen, dt, (me + 1) % n, comm, s).map_err(|e| err("send", e))?;
                        result::recv(rp, rlen, dt, (me + n - 1) % n, comm, s).map_err(|e| err("recv", e))?;
                        result::group_end()
                    }
                }
            };
            r.map(|_| ()).map_err(|e| err("collective", e))
        }
    }
}

fn run_typed<T: CollType>(comm: &Communicator, args: &Args, kind: Kind) -> Result<()> {
    let mut config = CollConfig::default();
    if let Some(m) = &args.multi_team {
        config.multi_team = MultiTeam::parse(m)?;
    }
    config.bytes_per_cta = args.bytes_per_cta.unwrap_or(config.bytes_per_cta);
    config.max_ctas = args.max_ctas.unwrap_or(config.max_ctas);
    config.stage_bytes = args.stage_bytes.unwrap_or(config.stage_bytes);
    config.p2p_chunk_bytes = args.p2p_chunk_bytes.unwrap_or(config.p2p_chunk_bytes);
    config.p2p_slots = args.p2p_slots.unwrap_or(config.p2p_slots);
    config.p2p_gin_chunk_bytes = args.p2p_gin_chunk_bytes.unwrap_or(config.p2p_gin_chunk_bytes);
    config.p2p_gin_slots = args.p2p_gin_slots.unwrap_or(config.p2p_gin_slots);
    config.threads = args.threads.unwrap_or(config.threads);
    config.cooperative &= !args.no_cooperative;
    config.stage_stamps = args.stages;
    let lsa = comm.lsa_size()?;
    if args.in_kernel && lsa < comm.count() {
        return Err(Error::invalid_argument(format!(
            "--in-kernel runs the device all-reduce over one LSA team; this world has {} teams of {lsa} (DEVCOMM_LSA_SIZE)",
            comm.count() / lsa
        )));
    }
    let coll = comm.collectives_with(&config)?;
    let stream = comm.device().stream();
    let nccl = if args.nccl { Some(nccl::Nccl::new(comm, stream)?) } else { None };
    let b = Bench::<T> { comm, coll: &coll, stream, args, kind, nccl: nccl.as_ref(), _t: std::marker::PhantomData };
    if args.probe {
        b.probe()?;
    } else {
        b.table(&config, lsa)?;
    }
    drop(nccl);
    drop(coll);
    comm.finalize()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let run = || -> Result<()> {
        let kind = Kind::parse(&args.op)?;
        let comm = Communicator::init_from_env()?;
        match args.datatype.as_str() {
            "f32" => run_typed::<f32>(&comm, &args, kind),
            "bf16" => run_typed::<half::bf16>(&comm, &args, kind),
            "f16" => run_typed::<half::f16>(&comm, &args, kind),
            "f64" => run_typed::<f64>(&comm, &args, kind),
            "i32" => run_typed::<i32>(&comm, &args, kind),
            d => Err(Error::invalid_argument(format!("datatype {d}: f32, bf16, f16, f64, i32"))),
        }
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devcomm-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
