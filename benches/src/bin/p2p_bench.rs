//! p2p_bench: the point-to-point engine (`devcomm::p2p`) between two
//! processes, per message size, next to its floors measured in the same run.
//!
//! ```text
//! p2p_bench --role server [--port 19999] [--gpu 0]                  # on host A
//! p2p_bench --role client --remote-ip A [--port 19999] [--gpu 1]    # on host B (or A)
//! p2p_bench                  # both roles on this host: starts the server itself (GPU 0 and GPU 1)
//! ```
//!
//! Per size (256 B to 1 GiB, ×`--factor`), measured by the client (each
//! bandwidth the median of `--reps` repetitions, 5 by default):
//!
//! * send/recv: `lat` (µs, ping-pong of one message each way, half the
//!   round trip), `uni` (GB/s, `iters` messages client → server in flight
//!   at once, until the server acknowledged the last), `tx` (GB/s of the
//!   same, until the client's sends completed: the copies done, before the
//!   server hears of the last), `bi` (GB/s, both
//!   directions at once, the two directions' bytes summed);
//! * write: `lat` (µs, one blocking write: the bytes are in the peer's
//!   memory when it returns), `uni`, `bi` (GB/s, as above);
//! * the floor: on a same-host (IPC) connection the **copy engine** itself
//!   (`cuMemcpyDtoDAsync` of the same bytes into the peer's memory, mapped
//!   here: latency of one copy, GB/s of `iters` copies queued back to back),
//!   over TCP a **plain TCP socket** moving the same bytes from host memory
//!   (one socket; latency: ping-pong);
//! * with `--nccl` (CUDA): NCCL `ncclSend`/`ncclRecv` between the same two
//!   GPUs and processes (lat: ping-pong; uni: `iters` sends queued);
//! * the header line names the connection's control path: on one host the
//!   shared-memory rings by default (`--control tcp`: the control socket,
//!   the path before them), so `sr_lat_us` of the small sizes is the
//!   shared-memory control path's latency;
//! * `#wrong`: bytes of the last received message (send/recv) and of the
//!   written region that differ from what was sent (for messages above 64
//!   MiB, the first and last 8 MiB are compared).
#![allow(clippy::too_many_arguments)]

use clap::{Parser, ValueEnum};
use devcomm::p2p::{Conn, ControlPath, Endpoint, Mr, P2pConfig, P2pTransport, RemoteRegion};
use devcomm::runtime::{Device, RuntimeSelection};
use devcomm::{Error, Result, SymmetricMemory};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Server,
    Client,
}

#[derive(Parser, Debug, Clone)]
#[command(about = "devcomm's point-to-point engine between two processes, floors beside it")]
struct Args {
    /// This process's role; without it, both run on this host (the server as a child process).
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// The server's address (client).
    #[arg(long, default_value = "127.0.0.1")]
    remote_ip: String,
    /// The server's port.
    #[arg(long, default_value_t = 19999)]
    port: u16,
    /// This process's GPU (default: server 0, client 1 when there are two).
    #[arg(long)]
    gpu: Option<usize>,
    /// The server's GPU (client).
    #[arg(long)]
    remote_gpu: Option<usize>,
    /// Data sockets per connection.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// `tcp` to force TCP on one host.
    #[arg(long, default_value = "auto")]
    transport: String,
    /// Control messages of a same-host connection: `shm` (shared-memory
    /// rings, the default) or `tcp` (the control socket).
    #[arg(long, default_value = "shm")]
    control: String,
    /// Smallest message.
    #[arg(long, default_value_t = 256)]
    min_bytes: usize,
    /// Largest message.
    #[arg(long, default_value_t = 1 << 30)]
    max_bytes: usize,
    /// Size factor between rows.
    #[arg(long, default_value_t = 4)]
    factor: usize,
    /// Messages per bandwidth measurement (default: enough for 512 MiB, 4 ..= 200).
    #[arg(long)]
    iters: Option<usize>,
    /// Repetitions of each bandwidth measurement; the median is printed.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// One-way send/recv: the client waits this long after the server has
    /// posted its receives before it starts the clock and sends (the
    /// receives' notices surely in): tells a late notice from a slow send.
    #[arg(long, default_value_t = 0)]
    settle_us: u64,
    /// Also NCCL send/recv (CUDA; libnccl loaded at run time).
    #[arg(long)]
    nccl: bool,
    /// Small sizes only (up to 4 MiB), for a smoke run.
    #[arg(long)]
    quick: bool,
}

fn main() -> ExitCode {
    devcomm_benches::init_logging();
    let args = Args::parse();
    let r = match args.role {
        Some(Role::Server) => run(&args, Role::Server),
        Some(Role::Client) => run(&args, Role::Client),
        None => both(&args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("p2p_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Both roles on this host: the server as a child process.
fn both(args: &Args) -> Result<()> {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::system("finding a free port", e))?;
        l.local_addr().map_err(|e| Error::system("local_addr", e))?.port()
    };
    let exe = std::env::current_exe().map_err(|e| Error::system("locating this program", e))?;
    let mut child_args: Vec<String> = std::env::args().skip(1).collect();
    child_args.extend(["--role".into(), "server".into(), "--port".into(), port.to_string()]);
    let mut child = std::process::Command::new(exe)
        .args(&child_args)
        .spawn()
        .map_err(|e| Error::system("starting the server process", e))?;
    let mut a = args.clone();
    a.port = port;
    a.remote_ip = "127.0.0.1".into();
    let r = run(&a, Role::Client);
    if r.is_err() {
        let _ = child.kill();
    }
    let st = child.wait().map_err(|e| Error::system("waiting for the server", e))?;
    r?;
    if !st.success() {
        return Err(Error::remote(format!("the server process failed: {st}")));
    }
    Ok(())
}

struct Side<'a> {
    role: Role,
    ep: &'a Endpoint,
    dev: Device,
    /// Client: client → server. Server: server → client.
    out: Conn,
    /// Client: server → client. Server: client → server.
    inc: Conn,
    send: SymmetricMemory,
    recv: SymmetricMemory,
    mail: SymmetricMemory,
    send_mr: Mr,
    recv_mr: Mr,
    mail_mr: Mr,
    /// The peer's receive buffer, advertised.
    peer_recv: RemoteRegion,
    plain: TcpStream,
    nccl: Option<nccl::Nccl>,
    /// Repetitions of each bandwidth measurement (`--reps`, at least 1).
    reps: usize,
    /// `--settle-us`.
    settle: Duration,
}

impl Side<'_> {
    fn send_mail(&self, conn: &Conn, bytes: &[u8]) -> Result<()> {
        self.mail.write(self.dev.stream(), 0, bytes)?;
        self.ep.send(conn, &self.mail_mr, self.mail.device_addr(), bytes.len())
    }

    fn recv_mail(&self, conn: &Conn) -> Result<Vec<u8>> {
        let n = self.ep.recv(conn, &self.mail_mr, self.mail.device_addr() + 2048, 2048)?;
        let mut b = vec![0u8; n];
        self.mail.read(self.dev.stream(), 2048, &mut b)?;
        Ok(b)
    }

    /// Both sides meet (one byte each way over the plain TCP socket, so
    /// that no message of the engine's connections is taken by a receive
    /// posted for the measurement).
    fn sync(&self) -> Result<()> {
        self.send_u64(1)?;
        self.recv_u64().map(|_| ())
    }

    fn send_u64(&self, v: u64) -> Result<()> {
        (&self.plain).write_all(&v.to_le_bytes()).map_err(|e| Error::system("plain TCP socket", e))
    }

    fn recv_u64(&self) -> Result<u64> {
        let mut b = [0u8; 8];
        (&self.plain).read_exact(&mut b).map_err(|e| Error::system("plain TCP socket", e))?;
        Ok(u64::from_le_bytes(b))
    }

    fn wait_all(&self, ids: Vec<devcomm::p2p::TransferId>) -> Result<()> {
        for id in ids {
            self.ep.wait_async(id)?;
        }
        Ok(())
    }
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Bytes of `mem[..n]` that differ from `want` (first and last 8 MiB above 64 MiB).
fn wrong(dev: &Device, mem: &SymmetricMemory, want: &[u8]) -> Result<usize> {
    let n = want.len();
    let spans: Vec<(usize, usize)> =
        if n <= 64 << 20 { vec![(0, n)] } else { vec![(0, 8 << 20), (n - (8 << 20), 8 << 20)] };
    let mut bad = 0;
    for (off, len) in spans {
        let mut got = vec![0u8; len];
        mem.read(dev.stream(), off, &mut got)?;
        bad += got.iter().zip(&want[off..off + len]).filter(|(a, b)| a != b).count();
    }
    Ok(bad)
}

fn setup<'a>(args: &Args, role: Role, ep: &'a Endpoint, max: usize) -> Result<Side<'a>> {
    let dev = ep.device().clone();
    let (out, inc, plain) = match role {
        Role::Client => {
            let server: SocketAddr = format!("{}:{}", args.remote_ip, args.port)
                .parse()
                .map_err(|e| Error::invalid_argument(format!("--remote-ip/--port: {e}")))?;
            let remote_gpu = args.remote_gpu.unwrap_or(0);
            let t = Instant::now();
            let out = loop {
                match ep.connect(server, remote_gpu) {
                    Ok(c) => break c,
                    Err(Error::RemoteError(m))
                        if m.contains("nobody listens") && t.elapsed() < Duration::from_secs(60) =>
                    {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => return Err(e),
                }
            };
            // Our endpoint's port first, so that the server can connect back.
            let mail = SymmetricMemory::alloc(&dev, 4096)?;
            mail.write(dev.stream(), 0, &ep.addr().port().to_le_bytes())?;
            let mr = ep.reg_symmetric(&mail)?;
            ep.send(&out, &mr, mail.device_addr(), 2)?;
            let (_, _, inc) = ep.accept()?;
            let plain = TcpStream::connect((args.remote_ip.as_str(), args.port.wrapping_add(1)))
                .map_err(|e| Error::system("connecting the plain TCP socket (port + 1)", e))?;
            (out, inc, plain)
        }
        Role::Server => {
            let plain_l = TcpListener::bind(("0.0.0.0", args.port.wrapping_add(1)))
                .map_err(|e| Error::system("binding the plain TCP socket (port + 1)", e))?;
            let (peer, client_gpu, inc) = ep.accept()?;
            // The client's endpoint port comes first, on its connection.
            let mail = SymmetricMemory::alloc(&dev, 4096)?;
            let mr = ep.reg_symmetric(&mail)?;
            let n = ep.recv(&inc, &mr, mail.device_addr(), 64)?;
            let mut b = vec![0u8; n];
            mail.read(dev.stream(), 0, &mut b)?;
            let port = u16::from_le_bytes([b[0], b[1]]);
            let out = ep.connect((peer.ip(), port), client_gpu)?;
            let (plain, _) = plain_l.accept().map_err(|e| Error::system("accepting the plain TCP socket", e))?;
            (out, inc, plain)
        }
    };
    plain.set_nodelay(true).map_err(|e| Error::system("TCP_NODELAY", e))?;
    let send = SymmetricMemory::alloc(&dev, max)?;
    let recv = SymmetricMemory::alloc(&dev, max)?;
    let mail = SymmetricMemory::alloc(&dev, 4096)?;
    let (send_mr, recv_mr, mail_mr) = (ep.reg_symmetric(&send)?, ep.reg_symmetric(&recv)?, ep.reg_symmetric(&mail)?);
    let mine = ep.advertise(&recv_mr, recv.device_addr(), max)?;
    let mut side = Side {
        role,
        ep,
        dev,
        out,
        inc,
        send,
        recv,
        mail,
        send_mr,
        recv_mr,
        mail_mr,
        peer_recv: mine,
        plain,
        nccl: None,
        reps: args.reps.max(1),
        settle: Duration::from_micros(args.settle_us),
    };
    // Descriptors and (client → server) NCCL's id.
    match role {
        Role::Client => {
            side.send_mail(&side.out, &mine.to_bytes())?;
            side.peer_recv = RemoteRegion::from_bytes(&side.recv_mail(&side.inc)?)?;
            if args.nccl {
                let id = nccl::unique_id()?;
                side.send_mail(&side.out, &id)?;
                side.nccl = Some(nccl::Nccl::new(&side.dev, id, 0)?);
            }
        }
        Role::Server => {
            side.peer_recv = RemoteRegion::from_bytes(&side.recv_mail(&side.inc)?)?;
            side.send_mail(&side.out, &mine.to_bytes())?;
            if args.nccl {
                let id = side.recv_mail(&side.inc)?;
                side.nccl = Some(nccl::Nccl::new(&side.dev, id, 1)?);
            }
        }
    }
    Ok(side)
}

fn run(args: &Args, role: Role) -> Result<()> {
    let sel = RuntimeSelection::from_env()?;
    let ndev = devcomm::runtime::device_count(sel)?.1;
    let gpu = args.gpu.unwrap_or(match role {
        Role::Server => 0,
        Role::Client => usize::from(ndev > 1),
    });
    let dev = Device::open(sel, gpu)?;
    let bind: SocketAddr = match role {
        Role::Server => format!("0.0.0.0:{}", args.port),
        Role::Client => "0.0.0.0:0".into(),
    }
    .parse()
    .map_err(|e| Error::invalid_argument(format!("{e}")))?;
    let mut cfg = P2pConfig::from_env()?.with_threads(args.threads).with_bind(bind);
    match args.transport.as_str() {
        "tcp" => cfg.force_tcp = true,
        "auto" => {}
        o => return Err(Error::invalid_argument(format!("--transport {o}: expected auto or tcp"))),
    }
    match args.control.as_str() {
        "tcp" => cfg.shm_control = false,
        "shm" | "auto" => cfg.shm_control = true,
        o => return Err(Error::invalid_argument(format!("--control {o}: expected shm or tcp"))),
    }
    let max_bytes = if args.quick { args.max_bytes.min(4 << 20) } else { args.max_bytes };
    let mut sizes = Vec::new();
    let mut s = args.min_bytes.max(1);
    while s <= max_bytes {
        sizes.push(s);
        s = s.saturating_mul(args.factor.max(2));
    }
    let max = *sizes.last().ok_or_else(|| Error::invalid_argument("no sizes between --min-bytes and --max-bytes"))?;
    let ep = Endpoint::with_config(&dev, cfg)?;
    let side = setup(args, role, &ep, max)?;
    let ipc = side.out.transport() == P2pTransport::Ipc;
    let floor_addr = if ipc { ep.mapped_address(&side.out, &side.peer_recv)? } else { None };
    if role == Role::Client {
        println!(
            "# p2p_bench on the {} runtime: {} transport, control over {}, {} data sockets, client {} GPU {} -> server GPU {} ({}), floor: {}",
            dev.kind(),
            if ipc { "same-host IPC (copy engine)" } else { "TCP" },
            match side.out.control_path() {
                ControlPath::SharedMemory => "shared memory",
                ControlPath::Tcp => "the control socket",
            },
            args.threads,
            dev.name(),
            gpu,
            side.out.remote_gpu(),
            args.remote_ip,
            if floor_addr.is_some() { "copy engine into the mapped peer buffer" } else { "plain TCP socket, host memory" },
        );
        println!(
            "# {:>10} {:>6} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9} | {:>6}",
            "bytes",
            "iters",
            "sr_lat_us",
            "sr_uni",
            "sr_tx",
            "sr_bi",
            "wr_lat_us",
            "wr_uni",
            "wr_bi",
            "floor_lat",
            "floor_GBs",
            "nccl_lat",
            "nccl_GBs",
            "#wrong"
        );
    }
    for &s in &sizes {
        let iters = args.iters.unwrap_or(((512usize << 20) / s).clamp(4, 200));
        let lat_iters = iters.min(50);
        one_size(&side, s, iters, lat_iters, floor_addr)?;
    }
    side.sync()?;
    Ok(())
}

fn gbs(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn one_size(side: &Side<'_>, s: usize, iters: usize, lat_iters: usize, floor_addr: Option<u64>) -> Result<()> {
    let ep = side.ep;
    let client = side.role == Role::Client;
    let data = pattern(s as u64, s);
    side.send.write(side.dev.stream(), 0, &data)?;
    let (sp, rp) = (side.send.device_addr(), side.recv.device_addr());
    let mut bad = 0usize;
    let poison = vec![0x5Au8; s];
    side.recv.write(side.dev.stream(), 0, &poison)?;
    side.sync()?;

    // send/recv latency: ping-pong.
    let t = Instant::now();
    for _ in 0..lat_iters {
        if client {
            ep.send(&side.out, &side.send_mr, sp, s)?;
            ep.recv(&side.inc, &side.recv_mr, rp, s)?;
        } else {
            ep.recv(&side.inc, &side.recv_mr, rp, s)?;
            ep.send(&side.out, &side.send_mr, sp, s)?;
        }
    }
    let sr_lat = t.elapsed().as_secs_f64() * 1e6 / lat_iters as f64 / 2.0;
    if client {
        bad += wrong(&side.dev, &side.recv, &data)?;
    }

    // Bandwidths: each the median of `reps` repetitions, both processes
    // in step (the server's results reach the client over the side socket).
    let reps = side.reps;

    // send/recv, one direction: the server posts every receive first; `tx`
    // ends when the client's sends are complete, `uni` when the server
    // reported every message in. Repetition 0 lands in a poisoned buffer
    // and is checked, untimed; the timed ones follow it back to back. (A
    // check between timed repetitions left both GPUs idle ~90 ms before
    // each, and the first copy after such a pause took twice as long on
    // 2 × H200: the ~220 µs "per batch" session 18 first blamed on sends.)
    let (mut uni, mut tx) = (Vec::new(), Vec::new());
    for rep in 0..=reps {
        if !client && rep == 0 {
            side.recv.write(side.dev.stream(), 0, &poison)?;
        }
        let ids = if client {
            Vec::new()
        } else {
            (0..iters).map(|_| ep.recv_async(&side.inc, &side.recv_mr, rp, s)).collect::<Result<Vec<_>>>()?
        };
        side.sync()?;
        if client && !side.settle.is_zero() {
            std::thread::sleep(side.settle);
        }
        let t = Instant::now();
        if client {
            tracing::trace!(bytes = s, iters, rep, "p2p_bench: one-way sends start");
            let ids = (0..iters).map(|_| ep.send_async(&side.out, &side.send_mr, sp, s)).collect::<Result<Vec<_>>>()?;
            side.wait_all(ids)?;
            tracing::trace!("p2p_bench: one-way sends complete");
            if rep > 0 {
                tx.push(gbs(iters * s, t.elapsed()));
            }
            side.recv_u64()?; // the server has every message
        } else {
            side.wait_all(ids)?;
            side.send_u64(0)?;
        }
        if rep > 0 {
            uni.push(gbs(iters * s, t.elapsed()));
        } else if client {
            bad += side.recv_u64()? as usize;
        } else {
            side.send_u64(wrong(&side.dev, &side.recv, &data)? as u64)?;
        }
    }
    let (sr_uni, sr_tx) = (devcomm_benches::median(uni), devcomm_benches::median(tx));

    // send/recv, both directions.
    let sr_bi = median_of(reps, || {
        let ids_in = (0..iters).map(|_| ep.recv_async(&side.inc, &side.recv_mr, rp, s)).collect::<Result<Vec<_>>>()?;
        side.sync()?;
        let t = Instant::now();
        let ids_out = (0..iters).map(|_| ep.send_async(&side.out, &side.send_mr, sp, s)).collect::<Result<Vec<_>>>()?;
        side.wait_all(ids_out)?;
        side.wait_all(ids_in)?;
        side.sync()?;
        Ok(gbs(2 * iters * s, t.elapsed()))
    })?;

    // write: latency and one direction (client → server), then both.
    let (mut wr_lat, mut wr_uni) = (0.0, 0.0);
    if !client {
        side.recv.write(side.dev.stream(), 0, &poison)?;
    }
    side.sync()?;
    if client {
        let t = Instant::now();
        for _ in 0..lat_iters {
            ep.write(&side.out, &side.send_mr, sp, s, &side.peer_recv, 0)?;
        }
        wr_lat = t.elapsed().as_secs_f64() * 1e6 / lat_iters as f64;
        wr_uni = median_of(reps, || {
            let t = Instant::now();
            let ids = (0..iters)
                .map(|_| ep.write_async(&side.out, &side.send_mr, sp, s, &side.peer_recv, 0))
                .collect::<Result<Vec<_>>>()?;
            side.wait_all(ids)?;
            Ok(gbs(iters * s, t.elapsed()))
        })?;
    }
    side.sync()?;
    if !client {
        side.send_u64(wrong(&side.dev, &side.recv, &data)? as u64)?;
    } else {
        bad += side.recv_u64()? as usize;
    }
    let wr_bi = median_of(reps, || {
        side.sync()?;
        let t = Instant::now();
        let ids = (0..iters)
            .map(|_| ep.write_async(&side.out, &side.send_mr, sp, s, &side.peer_recv, 0))
            .collect::<Result<Vec<_>>>()?;
        side.wait_all(ids)?;
        side.sync()?;
        Ok(gbs(2 * iters * s, t.elapsed()))
    })?;

    // The floor.
    let (floor_lat, floor_gbs) = match floor_addr {
        Some(dst) => {
            let (mut l, mut g) = (0.0, 0.0);
            if client {
                let st = side.dev.new_stream()?;
                let t = Instant::now();
                for _ in 0..lat_iters {
                    // SAFETY: `sp` is this device's buffer of `max >= s`
                    // bytes and `dst` the server's receive buffer of as many
                    // bytes mapped here (the engine checked the span); the
                    // server does not touch it until the next sync.
                    unsafe { st.memcpy_raw(dst, sp, s) }?;
                    st.synchronize()?;
                }
                l = t.elapsed().as_secs_f64() * 1e6 / lat_iters as f64;
                g = median_of(reps, || {
                    let t = Instant::now();
                    for _ in 0..iters {
                        // SAFETY: as above.
                        unsafe { st.memcpy_raw(dst, sp, s) }?;
                    }
                    st.synchronize()?;
                    Ok(gbs(iters * s, t.elapsed()))
                })?;
            }
            side.sync()?;
            (l, g)
        }
        None => plain_tcp(side, s, iters, lat_iters)?,
    };

    // NCCL.
    let (nccl_lat, nccl_gbs) = match &side.nccl {
        Some(n) => {
            let peer = if client { 1 } else { 0 };
            side.sync()?;
            let t = Instant::now();
            for _ in 0..lat_iters {
                if client {
                    n.send(sp, s, peer)?;
                    n.recv(rp, s, peer)?;
                } else {
                    n.recv(rp, s, peer)?;
                    n.send(sp, s, peer)?;
                }
                n.sync()?;
            }
            let l = t.elapsed().as_secs_f64() * 1e6 / lat_iters as f64 / 2.0;
            let g = median_of(reps, || {
                side.sync()?;
                let t = Instant::now();
                for _ in 0..iters {
                    if client {
                        n.send(sp, s, peer)?;
                    } else {
                        n.recv(rp, s, peer)?;
                    }
                }
                n.sync()?;
                side.sync()?;
                Ok(gbs(iters * s, t.elapsed()))
            })?;
            (l, g)
        }
        None => (f64::NAN, f64::NAN),
    };

    if client {
        println!(
            "  {:>10} {:>6} | {:>9.1} {:>9.2} {:>9.2} {:>9.2} | {:>9.1} {:>9.2} {:>9.2} | {:>9.1} {:>9.2} | {:>9.1} {:>9.2} | {:>6}",
            s, iters, sr_lat, sr_uni, sr_tx, sr_bi, wr_lat, wr_uni, wr_bi, floor_lat, floor_gbs, nccl_lat, nccl_gbs, bad
        );
    }
    Ok(())
}

/// The median of `reps` runs of `run` (each a bandwidth).
fn median_of(reps: usize, mut run: impl FnMut() -> Result<f64>) -> Result<f64> {
    Ok(devcomm_benches::median((0..reps).map(|_| run()).collect::<Result<Vec<_>>>()?))
}

/// The plain TCP socket floor: the same bytes from host memory over one socket.
fn plain_tcp(side: &Side<'_>, s: usize, iters: usize, lat_iters: usize) -> Result<(f64, f64)> {
    let io = |e| Error::system("plain TCP floor", e);
    let mut sock = &side.plain;
    let mut buf = pattern(s as u64 + 1, s);
    let client = side.role == Role::Client;
    let t = Instant::now();
    for _ in 0..lat_iters {
        if client {
            sock.write_all(&buf).map_err(io)?;
            sock.read_exact(&mut buf).map_err(io)?;
        } else {
            sock.read_exact(&mut buf).map_err(io)?;
            sock.write_all(&buf).map_err(io)?;
        }
    }
    let lat = t.elapsed().as_secs_f64() * 1e6 / lat_iters as f64 / 2.0;
    let t = Instant::now();
    for _ in 0..iters {
        if client {
            sock.write_all(&buf).map_err(io)?;
        } else {
            sock.read_exact(&mut buf).map_err(io)?;
        }
    }
    let mut ack = [0u8; 1];
    if client {
        sock.read_exact(&mut ack).map_err(io)?;
    } else {
        sock.write_all(&ack).map_err(io)?;
    }
    Ok((lat, gbs(iters * s, t.elapsed())))
}

mod nccl {
    use devcomm::runtime::{Device, RuntimeKind, Stream};
    use devcomm::{Error, Result};
    pub use devcomm_benches::nccl::unique_id;
    use devcomm_benches::nccl::{cuda_stream, err, result, sys, NcclComm};

    /// A two-rank NCCL communicator between the client (rank 0) and the server.
    pub struct Nccl {
        comm: NcclComm,
        stream: Stream,
    }

    impl Nccl {
        pub fn new(dev: &Device, id: Vec<u8>, rank: i32) -> Result<Nccl> {
            if dev.kind() != RuntimeKind::Cuda {
                return Err(Error::invalid_usage("--nccl needs the CUDA runtime"));
            }
            let stream = dev.new_stream()?;
            cuda_stream(&stream)?;
            Ok(Nccl { comm: NcclComm::init(&id, 2, rank)?, stream })
        }

        fn s(&self) -> Result<sys::cudaStream_t> {
            cuda_stream(&self.stream)
        }

        pub fn send(&self, buf: u64, n: usize, peer: i32) -> Result<()> {
            let s = self.s()?;
            // SAFETY: `buf` is a live device buffer of at least `n` bytes on
            // this rank's device; the context is bound (cu_stream binds it).
            unsafe { result::send(buf as *const _, n, sys::ncclDataType_t::ncclUint8, peer, self.comm.raw(), s) }
                .map_err(|e| err("send", e))
                .map(|_| ())
        }

        pub fn recv(&self, buf: u64, n: usize, peer: i32) -> Result<()> {
            let s = self.s()?;
            // SAFETY: as in `send`.
            unsafe { result::recv(buf as *mut _, n, sys::ncclDataType_t::ncclUint8, peer, self.comm.raw(), s) }
                .map_err(|e| err("recv", e))
                .map(|_| ())
        }

        pub fn sync(&self) -> Result<()> {
            self.stream.synchronize()
        }
    }
}
