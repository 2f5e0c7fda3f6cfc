//! The TCP transport: one connection per pair of ranks (full mesh).
//!
//! Each rank listens on [`TcpConfig::bind`] (`127.0.0.1:0` unless
//! `DEVCOMM_GIN_TCP_ADDR` says otherwise), the listen addresses are
//! exchanged with [`Bootstrap::allgather`], every rank connects to the
//! ranks below it and accepts the ranks above it.
//!
//! A frame is a 40-byte little-endian header — kind (u32), destination
//! window (u32), destination offset (u64), payload bytes (u64), signal
//! (u32), has-signal (u32), signal increment (u64) — followed by the payload.
//! The sending side writes frames from the proxy thread through a bounded
//! buffer. On the receiving side one thread per connection reads frames
//! (through a buffer: many small frames per system call) and lands them in
//! order:
//!
//! * with a [`CopyQueue`] of its own ([`crate::LocalMemory::copy_queue`],
//!   made when the transport connects), in batches: each payload is queued ([`CopyQueue::write`] stages it,
//!   the device copies it later) and the frame's signal is held back;
//!   while more bytes are already waiting on the socket the receiver keeps
//!   reading and queueing. When nothing more is ready, or 4096 writes or
//!   signals or 2 MiB wait, it queues a fence, waits for it to pass (the
//!   data is then visible) and applies the held signals in order. So a
//!   signal is never visible before the data that came before it on the
//!   connection, and a stream of small puts costs one fence per batch, not
//!   a synchronous copy per put. `close` waits for a batch in flight;
//! * without one (`Unavailable`), synchronously: the payload is written in
//!   pieces of up to 1 MiB ([`crate::LocalMemory::write_device`]), then the
//!   signal is applied.
//!
//! Operations to oneself are applied directly by the caller.
//!
//! A connection that ends without the peer's goodbye frame, that carries a
//! malformed frame (unknown kind, window range or signal the receiver
//! rejects), or whose data cannot be landed (a device fault, which the
//! fence reports; a fence that does not pass within [`DRAIN_TIMEOUT`])
//! fails that peer — the complete frames before the failure are landed,
//! the signals of a batch that failed are not: [`Transport::progress`]
//! reports it and [`Transport::put`] to it returns the reason. The sender
//! is told too: the receiving rank's proxy thread sends an error frame
//! (kind 6: the error's class, its message) and half-closes the
//! connection, while the receiver drains what still arrives; the sender's
//! receiver fails the peer with "rank N rejected what this rank sent it:
//! ...", so the sender's rings to it fail with that reason (the device sees
//! `RingFailed` at its next flush or wait, `gin_error()` says why) — never
//! a wait for signals that will not come.

use super::copy_engine::DRAIN_TIMEOUT;
use super::{GetSource, Landing, PeerFailure, PutTarget, Transport};
use crate::descriptor::RemoteSignal;
use crate::{Bootstrap, CopyQueue, GinHostError, GinResult};
use nix::sys::socket::MsgFlags;
use std::collections::{BTreeSet, HashMap};
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Environment variable choosing the listen address: an IP (`10.0.0.5`) or
/// an IP and port (`10.0.0.5:7000`).
pub const ENV_ADDR: &str = "DEVCOMM_GIN_TCP_ADDR";

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"DCGINTCP");
const HEADER_BYTES: usize = 40;
const KIND_PUT: u32 = 1;
const KIND_SIGNAL: u32 = 2;
const KIND_BYE: u32 = 3;
/// A get request: window, offset and bytes to read, the request id in the
/// increment field (no signal).
const KIND_GET: u32 = 4;
/// A piece of a get's data: the last-piece flag in the window field, the
/// piece's offset within the get, its bytes, the request id in the
/// increment field; the payload follows.
const KIND_GET_DATA: u32 = 5;
/// This side rejected what the peer sent, or could not land it, and
/// closes the connection: the error's class ([`error_class`]) in the window
/// field, the message (UTF-8, at most [`MAX_ERROR_BYTES`]) as the payload.
const KIND_ERROR: u32 = 6;
/// Longest message of an error frame.
const MAX_ERROR_BYTES: usize = 4096;
/// Sender buffer per peer.
const SEND_BUFFER: usize = 256 << 10;
/// Payloads land in pieces of at most this size.
const RECV_PIECE: usize = 1 << 20;
/// Read buffer per connection.
const READ_BUFFER: usize = 256 << 10;
/// A receiver lands its batch (fence, wait, signals) once this many writes
/// or signals wait in it, even while more frames are ready.
const BATCH_OPS: u32 = 4096;
/// ... or once this many bytes wait in it.
const BATCH_BYTES: u64 = 2 << 20;
/// A peer that does not take our data for this long is failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(120);

const PEER_UP: u8 = 0;
const PEER_LEFT: u8 = 1;
const PEER_FAILED: u8 = 2;

/// Settings of the TCP transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Where to listen (port 0: any free port). Must be an address the peers
    /// can reach.
    pub bind: SocketAddr,
    /// How long connecting the mesh may take.
    pub connect_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            connect_timeout: Duration::from_secs(60),
        }
    }
}

impl TcpConfig {
    /// The default, with `bind` from `DEVCOMM_GIN_TCP_ADDR` if set.
    pub fn from_env() -> GinResult<TcpConfig> {
        let mut c = TcpConfig::default();
        if let Ok(v) = std::env::var(ENV_ADDR) {
            c.bind = parse_addr(&v)?;
        }
        Ok(c)
    }
}

fn parse_addr(v: &str) -> GinResult<SocketAddr> {
    let v = v.trim();
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 0));
    }
    Err(GinHostError::Invalid(format!("{ENV_ADDR}={v:?} is neither an IP address nor IP:port")))
}

fn sys(what: &str, e: std::io::Error) -> GinHostError {
    GinHostError::System(format!("{what}: {e}"))
}

/// State shared with the receiver threads.
struct Shared {
    landing: Landing,
    /// Set (under the write lock) once the transport is closed: receivers
    /// stop touching memory. They hold the read lock while they write (with
    /// a copy queue: from a batch's first write until its fence has passed
    /// and its signals are applied).
    closed: RwLock<bool>,
    /// `PEER_*` per rank.
    state: Vec<AtomicU8>,
    failures: Mutex<Vec<PeerFailure>>,
    /// This rank's gets in flight: id → (peer, destination address, bytes).
    gets: Mutex<HashMap<u64, (usize, u64, u64)>>,
    /// Ids of gets whose data has landed (visible), for the proxy thread.
    gets_landed: Mutex<Vec<u64>>,
    /// Peers' get requests for the proxy thread to serve: (peer, window,
    /// offset, bytes, id).
    get_requests: Mutex<Vec<GetRequest>>,
    /// Why each failed peer failed (the first reason).
    reasons: Mutex<Vec<Option<GinHostError>>>,
    /// What receivers rejected (or could not land), for the proxy thread to
    /// tell the sender in an error frame before it closes the connection.
    rejections: Mutex<Vec<(usize, GinHostError)>>,
}

/// A peer's get request: (peer, window, offset, bytes, id).
type GetRequest = (usize, u32, u64, u64, u64);

impl Shared {
    fn fail(&self, peer: usize, error: GinHostError) {
        // Serialised by the `reasons` lock. The failure is queued for the
        // proxy *before* the peer reads as failed: `retired` retires gets
        // from a failed peer unlanded, and the proxy must have failed the
        // rings toward it by then (it takes failures before it retires), or
        // it would complete such a get's ticket as if its data had landed.
        let mut reasons = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
        if self.state[peer].load(Ordering::SeqCst) != PEER_FAILED {
            tracing::warn!(peer, %error, "GIN TCP: peer failed");
            reasons[peer] = Some(error.clone());
            self.failures.lock().unwrap_or_else(|e| e.into_inner()).push(PeerFailure { peer, error });
            self.state[peer].store(PEER_FAILED, Ordering::SeqCst);
        }
    }

    /// Why `peer` failed, if it did and a reason was recorded.
    fn reason(&self, peer: usize) -> Option<GinHostError> {
        self.reasons.lock().unwrap_or_else(|e| e.into_inner()).get(peer).cloned().flatten()
    }
}

struct Conn {
    writer: BufWriter<TcpStream>,
    stream: TcpStream,
}

/// The TCP transport (see the module docs).
pub struct TcpTransport {
    rank: usize,
    conns: Vec<Option<Conn>>,
    shared: Arc<Shared>,
    receivers: Vec<JoinHandle<()>>,
    closed: bool,
    /// Gets issued (ids `1..=gets_issued`), and how many in a row from the
    /// first have retired (landed, or abandoned with a failed peer).
    gets_issued: u64,
    gets_retired: u64,
    /// Ids past `gets_retired` that have retired.
    retired_ids: BTreeSet<u64>,
    /// Per peer: its failure has been handed to the proxy ([`Transport::progress`]),
    /// which has failed the rings toward it — only then do gets from it
    /// retire unlanded (their tickets are then not completed).
    reported: Vec<bool>,
    /// Staging for gets served to peers and gets from oneself.
    buf: Vec<u8>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport").field("rank", &self.rank).field("nranks", &self.conns.len()).finish()
    }
}

fn header(kind: u32, dst_window: u32, dst_offset: u64, bytes: u64, signal: Option<RemoteSignal>) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[4..8].copy_from_slice(&dst_window.to_le_bytes());
    h[8..16].copy_from_slice(&dst_offset.to_le_bytes());
    h[16..24].copy_from_slice(&bytes.to_le_bytes());
    if let Some((s, v)) = signal {
        h[24..28].copy_from_slice(&s.to_le_bytes());
        h[28..32].copy_from_slice(&1u32.to_le_bytes());
        h[32..40].copy_from_slice(&v.to_le_bytes());
    }
    h
}

/// The header of a get request or data piece: `field` in the window slot,
/// `offset`, `bytes`, and the request `id` in the increment slot.
fn get_header(kind: u32, field: u32, offset: u64, bytes: u64, id: u64) -> [u8; HEADER_BYTES] {
    let mut h = header(kind, field, offset, bytes, None);
    h[32..40].copy_from_slice(&id.to_le_bytes());
    h
}

/// An error as an error frame carries it: its class and message.
fn error_parts(e: &GinHostError) -> (u32, &str) {
    match e {
        GinHostError::Invalid(m) => (1, m),
        GinHostError::Remote(m) => (2, m),
        GinHostError::System(m) => (3, m),
        GinHostError::Timeout(m) => (4, m),
        GinHostError::Unavailable(m) => (5, m),
    }
}

/// The error of class `class` ([`error_parts`]) with message `m`.
fn error_class(class: u32, m: String) -> GinHostError {
    match class {
        1 => GinHostError::Invalid(m),
        3 => GinHostError::System(m),
        4 => GinHostError::Timeout(m),
        5 => GinHostError::Unavailable(m),
        _ => GinHostError::Remote(m),
    }
}

fn u32_at(h: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

fn u64_at(h: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(b)
}

impl TcpTransport {
    /// Connects this rank (`bootstrap.rank()`) to every other rank; a
    /// collective call of all ranks. What peers send lands in `landing`.
    pub fn connect(bootstrap: &dyn Bootstrap, landing: Landing, config: &TcpConfig) -> GinResult<TcpTransport> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        if rank >= nranks {
            return Err(GinHostError::Invalid(format!("rank {rank} of {nranks}")));
        }
        let listener = TcpListener::bind(config.bind).map_err(|e| sys(&format!("bind {}", config.bind), e))?;
        let me = listener.local_addr().map_err(|e| sys("local_addr", e))?;
        let addrs = bootstrap.allgather(me.to_string().as_bytes())?;
        if addrs.len() != nranks {
            return Err(GinHostError::Invalid(format!(
                "allgather returned {} entries for {nranks} ranks",
                addrs.len()
            )));
        }
        let deadline = Instant::now() + config.connect_timeout;
        let mut streams: Vec<Option<TcpStream>> = (0..nranks).map(|_| None).collect();
        for (peer, raw) in addrs.iter().enumerate().take(rank) {
            let addr = std::str::from_utf8(raw)
                .ok()
                .and_then(|s| s.parse::<SocketAddr>().ok())
                .ok_or_else(|| GinHostError::Invalid(format!("rank {peer} sent a bad TCP address")))?;
            let mut s = connect_until(addr, deadline)?;
            let mut hello = [0u8; 16];
            hello[..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
            hello[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
            hello[12..16].copy_from_slice(&(nranks as u32).to_le_bytes());
            s.write_all(&hello).map_err(|e| GinHostError::Remote(format!("hello to rank {peer}: {e}")))?;
            streams[peer] = Some(s);
        }
        listener.set_nonblocking(true).map_err(|e| sys("listener", e))?;
        let mut missing = nranks - 1 - rank;
        while missing > 0 {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(|e| sys("accept", e))?;
                    s.set_read_timeout(Some(
                        deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
                    ))
                    .map_err(|e| sys("accept", e))?;
                    let mut hello = [0u8; 16];
                    if let Err(e) = s.read_exact(&mut hello) {
                        tracing::warn!(%from, %e, "GIN TCP: connection without hello, ignored");
                        continue;
                    }
                    let peer = u32_at(&hello, 8) as usize;
                    if u64_at(&hello, 0) != HELLO_MAGIC
                        || u32_at(&hello, 12) as usize != nranks
                        || peer <= rank
                        || peer >= nranks
                        || streams[peer].is_some()
                    {
                        tracing::warn!(%from, "GIN TCP: unexpected hello, connection ignored");
                        continue;
                    }
                    s.set_read_timeout(None).map_err(|e| sys("accept", e))?;
                    streams[peer] = Some(s);
                    missing -= 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    if Instant::now() >= deadline {
                        return Err(GinHostError::Timeout(format!(
                            "rank {rank}: {missing} peers did not connect to {me} in {:?}",
                            config.connect_timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(sys("accept", e)),
            }
        }
        let shared = Arc::new(Shared {
            landing,
            closed: RwLock::new(false),
            state: (0..nranks).map(|_| AtomicU8::new(PEER_UP)).collect(),
            failures: Mutex::new(Vec::new()),
            gets: Mutex::new(HashMap::new()),
            gets_landed: Mutex::new(Vec::new()),
            get_requests: Mutex::new(Vec::new()),
            reasons: Mutex::new(vec![None; nranks]),
            rejections: Mutex::new(Vec::new()),
        });
        let mut conns = Vec::with_capacity(nranks);
        let mut receivers = Vec::new();
        for (peer, s) in streams.into_iter().enumerate() {
            let Some(s) = s else {
                conns.push(None);
                continue;
            };
            s.set_nodelay(true).map_err(|e| sys("nodelay", e))?;
            s.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(|e| sys("write timeout", e))?;
            let rx = s.try_clone().map_err(|e| sys("clone socket", e))?;
            let tx = s.try_clone().map_err(|e| sys("clone socket", e))?;
            let sh = shared.clone();
            // The queue is made here, before any kernel runs: making one
            // allocates pinned memory, which may wait for running kernels.
            let queue = landing_queue(&shared.landing, peer);
            let h = std::thread::Builder::new()
                .name(format!("gin-tcp-rx{rank}<{peer}"))
                .spawn(move || receive(rx, peer, &sh, queue))
                .map_err(|e| sys("spawn receiver", e))?;
            receivers.push(h);
            conns.push(Some(Conn { writer: BufWriter::with_capacity(SEND_BUFFER, tx), stream: s }));
        }
        Ok(TcpTransport {
            rank,
            conns,
            shared,
            receivers,
            closed: false,
            gets_issued: 0,
            gets_retired: 0,
            retired_ids: BTreeSet::new(),
            reported: vec![false; nranks],
            buf: Vec::new(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn check_peer(&self, peer: usize) -> GinResult<()> {
        if peer >= self.conns.len() {
            return Err(GinHostError::Invalid(format!("peer {peer} out of range ({} ranks)", self.conns.len())));
        }
        if self.closed {
            return Err(GinHostError::Invalid("GIN TCP transport is closed".into()));
        }
        match self.shared.state[peer].load(Ordering::SeqCst) {
            PEER_UP => Ok(()),
            PEER_LEFT => Err(GinHostError::Remote(format!("rank {peer} has closed its GIN transport"))),
            _ => Err(self
                .shared
                .reason(peer)
                .unwrap_or_else(|| GinHostError::Remote(format!("connection to rank {peer} failed")))),
        }
    }

    /// Writes a frame to `peer`; an I/O error fails the peer.
    fn send(&mut self, peer: usize, head: &[u8; HEADER_BYTES], data: &[u8]) -> GinResult<()> {
        let Some(c) = self.conns[peer].as_mut() else {
            return Err(GinHostError::Invalid(format!("no connection to rank {peer}")));
        };
        let r = c.writer.write_all(head).and_then(|()| c.writer.write_all(data));
        r.map_err(|e| self.broken(peer, e))
    }

    fn broken(&self, peer: usize, e: std::io::Error) -> GinHostError {
        let err = GinHostError::Remote(format!("sending to rank {peer}: {e}"));
        if let Some(c) = &self.conns[peer] {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.shared.fail(peer, err.clone());
        // The first reason (a rejection the peer reported, say) beats the broken pipe.
        self.shared.reason(peer).unwrap_or(err)
    }

    /// Tells each peer whose frames a receiver rejected (or could not land)
    /// why, in an error frame, and half-closes the connection: the peer's
    /// receiver fails this rank with that reason, so the operations it sent
    /// here fail there (its rings to this rank, `gin_error()`) instead of
    /// waiting for signals that never come. Best effort: a connection that
    /// is already broken is left as it is.
    fn tell_rejections(&mut self) {
        let list = std::mem::take(&mut *self.shared.rejections.lock().unwrap_or_else(|e| e.into_inner()));
        if self.closed {
            return;
        }
        for (peer, e) in list {
            let Some(c) = self.conns.get_mut(peer).and_then(|c| c.as_mut()) else { continue };
            let (class, msg) = error_parts(&e);
            let mut end = msg.len().min(MAX_ERROR_BYTES);
            while !msg.is_char_boundary(end) {
                end -= 1;
            }
            let head = header(KIND_ERROR, class, 0, end as u64, None);
            let r = c.writer.write_all(&head).and_then(|()| c.writer.write_all(&msg.as_bytes()[..end]));
            if let Err(err) = r.and_then(|()| c.writer.flush()) {
                tracing::debug!(peer, %err, "GIN TCP: could not send the error frame");
            }
            // The peer reads the frame, then the end of the stream.
            let _ = c.stream.shutdown(Shutdown::Write);
        }
    }

    /// Answers the get requests peers sent: reads the window here in pieces
    /// of at most [`crate::proxy::PUT_CHUNK`] bytes and sends them back. A
    /// request this rank cannot serve (a bad window range, a device fault)
    /// fails the connection, after an error frame saying why: the
    /// requester's rings to this rank fail with that reason.
    fn serve_gets(&mut self) {
        let requests = std::mem::take(&mut *self.shared.get_requests.lock().unwrap_or_else(|e| e.into_inner()));
        if requests.is_empty() || self.closed {
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        for (peer, window, offset, bytes, id) in requests {
            if self.shared.state[peer].load(Ordering::SeqCst) != PEER_UP {
                continue;
            }
            let r = (|| -> GinResult<()> {
                let src = self.shared.landing.window_addr(window, offset, bytes)?;
                let mut done = 0u64;
                loop {
                    let n = (bytes - done).min(crate::proxy::PUT_CHUNK as u64) as usize;
                    buf.resize(n, 0);
                    self.shared.landing.local().read_device(src + done, &mut buf[..n])?;
                    let last = done + n as u64 == bytes;
                    self.send(peer, &get_header(KIND_GET_DATA, last as u32, done, n as u64, id), &buf[..n])?;
                    done += n as u64;
                    if last {
                        return Ok(());
                    }
                }
            })();
            if let Err(e) = r {
                let e = GinHostError::Remote(format!("serving a get of rank {peer}: {e}"));
                self.shared.fail(peer, e.clone());
                // Told in an error frame (`tell_rejections`, next), which closes the connection.
                self.shared.rejections.lock().unwrap_or_else(|e| e.into_inner()).push((peer, e));
            }
        }
        self.buf = buf;
        let _ = Transport::flush(self);
    }
}

fn connect_until(addr: SocketAddr, deadline: Instant) -> GinResult<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.clamp(Duration::from_millis(1), Duration::from_secs(5))) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(%addr, %e, "GIN TCP: connect retry");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(GinHostError::Timeout(format!("connecting to {addr}: {e}"))),
        }
    }
}

/// Bytes read from a connection, not yet consumed: `buf[pos..end]`.
struct Reader {
    s: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
}

impl Reader {
    fn ready(&self) -> usize {
        self.end - self.pos
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let at = self.pos;
        self.pos += n;
        &self.buf[at..at + n]
    }

    /// Reads more bytes (at least one; 0: end of stream) into the buffer.
    /// While `l` has work open, only bytes already waiting are read; when
    /// none are, `l` lands its batch first, then the read blocks.
    fn fill(&mut self, l: &mut Lander<'_>) -> GinResult<usize> {
        // Move the start of a frame (less than a header: payloads are taken
        // as they come) to the front.
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            (self.end, self.pos) = (self.end - self.pos, 0);
        }
        let n = recv(&self.s, &mut self.buf[self.end..], l)?;
        self.end += n;
        Ok(n)
    }

    /// Makes `n` bytes ready; `Ok(false)` on a clean end of stream before
    /// the first of them.
    fn ensure(&mut self, n: usize, l: &mut Lander<'_>) -> GinResult<bool> {
        while self.ready() < n {
            if self.fill(l)? == 0 {
                return match self.ready() {
                    0 => Ok(false),
                    _ => Err(l.remote(ErrorKind::UnexpectedEof.into())),
                };
            }
        }
        Ok(true)
    }

    /// Fills `out` from the buffer, then from the socket.
    fn read_exact(&mut self, out: &mut [u8], l: &mut Lander<'_>) -> GinResult<()> {
        let k = self.ready().min(out.len());
        out[..k].copy_from_slice(self.take(k));
        let mut got = k;
        while got < out.len() {
            match recv(&self.s, &mut out[got..], l)? {
                0 => return Err(GinHostError::Remote(format!("rank {} closed mid-put", l.peer))),
                n => got += n,
            }
        }
        Ok(())
    }
}

/// One read from `s` into `out` (0: end of stream). With `l`'s work open
/// it does not block: if nothing is waiting, `l` lands its batch (fence,
/// wait, signals) and the read blocks after that.
fn recv(s: &TcpStream, out: &mut [u8], l: &mut Lander<'_>) -> GinResult<usize> {
    loop {
        let r = if l.pending() {
            nix::sys::socket::recv(s.as_raw_fd(), out, MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from)
        } else {
            // Blocking: no lock held, nothing left unlanded.
            l.flush()?;
            (&*s).read(out)
        };
        match r {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => l.flush()?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(l.remote(e)),
        }
    }
}

/// Where a receiver lands frames: through its [`CopyQueue`] in batches
/// (signals applied once a fence behind the data has passed), or, without
/// a queue, synchronously frame by frame.
struct Lander<'a> {
    sh: &'a Shared,
    peer: usize,
    /// The receiver's queue (`None` where the rank's memory has none:
    /// puts land synchronously).
    queue: Option<Box<dyn CopyQueue>>,
    /// The read side of `sh.closed`, held while a batch is open (from its
    /// first write until its signals are applied), so that `close` waits
    /// for work in flight; never held across a blocking read.
    guard: Option<RwLockReadGuard<'a, bool>>,
    /// Signals of complete frames not applied yet, in order.
    signals: Vec<(u32, u64)>,
    /// Gets whose last piece is queued, not yet reported landed.
    gets: Vec<u64>,
    /// Writes queued since the last fence, and their bytes.
    ops: u32,
    bytes: u64,
    /// The peer sent an error frame (it rejected what this rank sent):
    /// nothing to tell it back.
    told: bool,
}

impl<'a> Lander<'a> {
    fn remote(&self, e: std::io::Error) -> GinHostError {
        GinHostError::Remote(format!("receiving from rank {}: {e}", self.peer))
    }

    /// Whether landed work waits for a fence or signals wait to be applied.
    fn pending(&self) -> bool {
        self.ops > 0 || !self.signals.is_empty() || !self.gets.is_empty()
    }

    /// Whether the transport is still open (holding the lock from now on).
    fn open(&mut self) -> bool {
        let sh = self.sh;
        !**self.guard.get_or_insert_with(|| sh.closed.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn landing(&self) -> &'a Landing {
        &self.sh.landing
    }

    /// Device address of a put's range (checked), or `None` if closed.
    fn window_addr(&mut self, window: u32, offset: u64, bytes: u64) -> GinResult<Option<u64>> {
        let r = if self.open() { self.landing().window_addr(window, offset, bytes).map(Some) } else { Ok(None) };
        if self.queue.is_none() {
            self.guard = None;
        }
        r
    }

    /// Lands `data` at `addr` (queued, or written at once without a queue).
    fn write(&mut self, addr: u64, data: &[u8]) -> GinResult<()> {
        if !self.open() {
            return Ok(());
        }
        match self.queue.as_mut() {
            Some(q) => {
                // SAFETY: `addr..addr + len` lies in a window of this rank
                // (checked by `window_addr`), device memory that stays
                // registered while puts to it may arrive; the copy is
                // fenced and waited for before this batch ends.
                unsafe { q.write(addr, data) }?;
                self.ops += 1;
                self.bytes += data.len() as u64;
            }
            None => {
                let r = self.landing().local().write_device(addr, data);
                self.guard = None;
                r?;
            }
        }
        Ok(())
    }

    /// Queues `signal` behind the data landed so far; without a queue (or
    /// past the batch bounds) the batch is landed now.
    fn signal(&mut self, signal: (u32, u64)) -> GinResult<()> {
        self.signals.push(signal);
        self.end_of_frame()
    }

    /// After a frame (or a piece of one): lands the batch if it reached a
    /// bound, or at once without a queue.
    fn end_of_frame(&mut self) -> GinResult<()> {
        if self.queue.is_none()
            || self.ops >= BATCH_OPS
            || self.signals.len() >= BATCH_OPS as usize
            || self.bytes >= BATCH_BYTES
        {
            self.flush()?;
        }
        Ok(())
    }

    /// Ends the batch: queues a fence behind the writes, waits for it to
    /// pass, applies the pending signals in order, releases the lock. On
    /// an error the batch is dropped (its signals never applied).
    fn flush(&mut self) -> GinResult<()> {
        let r = self.land();
        self.signals.clear();
        self.gets.clear();
        (self.ops, self.bytes) = (0, 0);
        self.guard = None;
        r.map_err(|e| GinHostError::Remote(format!("landing data from rank {}: {e}", self.peer)))
    }

    fn land(&mut self) -> GinResult<()> {
        if self.ops > 0 {
            if let Some(q) = self.queue.as_mut() {
                let fence = q.fence()?;
                wait_passed(q.as_mut(), fence)?;
            }
        }
        if !self.signals.is_empty() && self.open() {
            for &(id, value) in &self.signals {
                self.sh.landing.signal(id, value)?;
            }
        }
        if !self.gets.is_empty() {
            let mut map = self.sh.gets.lock().unwrap_or_else(|e| e.into_inner());
            for id in &self.gets {
                map.remove(id);
            }
            drop(map);
            self.sh.gets_landed.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(&self.gets);
        }
        Ok(())
    }

    /// Where piece `offset..offset + bytes` of get `id` from this
    /// connection's peer lands (checked against the request), or `None` if
    /// the transport is closed.
    fn get_addr(&mut self, id: u64, offset: u64, bytes: u64) -> GinResult<Option<u64>> {
        let peer = self.peer;
        let found = self.sh.gets.lock().unwrap_or_else(|e| e.into_inner()).get(&id).copied();
        let Some((from, dst, total)) = found else {
            return Err(GinHostError::Invalid(format!("rank {peer} sent data of get {id}, which is not in flight")));
        };
        if from != peer || offset.checked_add(bytes).is_none_or(|e| e > total) {
            return Err(GinHostError::Invalid(format!(
                "rank {peer} sent {bytes} bytes at {offset} of get {id} (of rank {from}, {total} bytes)"
            )));
        }
        let r = if self.open() { Some(dst + offset) } else { None };
        if self.queue.is_none() {
            self.guard = None;
        }
        Ok(r)
    }
}

/// Waits until fence `fence` of `q` has passed (or `q` reports a fault),
/// at most [`DRAIN_TIMEOUT`].
fn wait_passed(q: &mut dyn CopyQueue, fence: u64) -> GinResult<()> {
    let start = Instant::now();
    let mut polls = 0u32;
    while q.passed()? < fence {
        polls += 1;
        if polls < 128 {
            std::hint::spin_loop();
        } else if start.elapsed() > DRAIN_TIMEOUT {
            return Err(GinHostError::Timeout(format!("fence {fence} of a GIN TCP receiver did not pass")));
        } else if polls < 4096 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    Ok(())
}

/// A copy queue for the receiver of `peer`'s connection, or `None` (puts
/// then land synchronously) where the rank's memory has none.
fn landing_queue(landing: &Landing, peer: usize) -> Option<Box<dyn CopyQueue>> {
    match landing.local().copy_queue() {
        Ok(q) => Some(q),
        Err(GinHostError::Unavailable(why)) => {
            tracing::debug!(peer, %why, "GIN TCP: no copy queue, puts land synchronously");
            None
        }
        Err(e) => {
            tracing::warn!(peer, %e, "GIN TCP: no copy queue, puts land synchronously");
            None
        }
    }
}

/// The receiver thread of the connection to `peer`: lands frames through
/// a copy queue of its own (see the module docs), or synchronously where
/// the rank's memory has none.
fn receive(s: TcpStream, peer: usize, sh: &Shared, queue: Option<Box<dyn CopyQueue>>) {
    let mut l =
        Lander { sh, peer, queue, guard: None, signals: Vec::new(), gets: Vec::new(), ops: 0, bytes: 0, told: false };
    let mut r = Reader { s, buf: vec![0; READ_BUFFER], pos: 0, end: 0 };
    let end = frames(&mut r, &mut l);
    // The complete frames before the end are valid: land them.
    let last = l.flush();
    let told = l.told;
    drop(l);
    if let Err(e) = end.and(last) {
        if !*sh.closed.read().unwrap_or_else(|e| e.into_inner()) {
            sh.fail(peer, e.clone());
            if !told {
                // The sender must learn why (an error frame from the proxy
                // thread, which owns the writing side); until it has read
                // it and closed, drain what it still sends, so that it
                // never blocks writing to us.
                sh.rejections.lock().unwrap_or_else(|e| e.into_inner()).push((peer, e));
                let mut sink = vec![0u8; 64 << 10];
                while matches!((&r.s).read(&mut sink), Ok(n) if n > 0) {}
            }
        }
        let _ = r.s.shutdown(Shutdown::Both);
    }
}

/// Reads and lands frames until the peer has left (`Ok`) or something failed.
fn frames(r: &mut Reader, l: &mut Lander<'_>) -> GinResult<()> {
    let peer = l.peer;
    let mut piece = Vec::new();
    loop {
        if !r.ensure(HEADER_BYTES, l)? {
            return match l.sh.state[peer].load(Ordering::SeqCst) {
                PEER_LEFT => Ok(()),
                _ => Err(GinHostError::Remote(format!("rank {peer} closed its connection"))),
            };
        }
        let head = r.take(HEADER_BYTES);
        let (kind, window, offset, bytes) = (u32_at(head, 0), u32_at(head, 4), u64_at(head, 8), u64_at(head, 16));
        let signal = match u32_at(head, 28) {
            0 => None,
            _ => Some((u32_at(head, 24), u64_at(head, 32))),
        };
        if let Some((id, _)) = signal {
            let total = l.landing().total_signals();
            if id >= total {
                return Err(GinHostError::Invalid(format!("rank {peer} sent signal {id} (of {total})")));
            }
        }
        let addr = match kind {
            KIND_PUT if bytes > 0 => Some(
                l.window_addr(window, offset, bytes)
                    .map_err(|e| GinHostError::Invalid(format!("put from rank {peer}: {e}")))?,
            ),
            KIND_GET_DATA => Some(l.get_addr(u64_at(head, 32), offset, bytes)?),
            _ => None,
        };
        let get_id = u64_at(head, 32);
        match kind {
            KIND_PUT | KIND_GET_DATA if bytes > 0 => {
                // The whole range was checked once (above); land it as it arrives.
                let addr = addr.flatten();
                let landed = |e: GinHostError| GinHostError::Remote(format!("landing data from rank {peer}: {e}"));
                let mut done = 0u64;
                while done < bytes {
                    let left = bytes - done;
                    if r.ready() == 0 && r.fill(l)? == 0 {
                        return Err(GinHostError::Remote(format!("rank {peer} closed mid-put")));
                    }
                    let n = if l.queue.is_some() || r.ready() as u64 >= left.min(RECV_PIECE as u64) {
                        // What is here (at most a piece).
                        let n = (r.ready() as u64).min(left).min(RECV_PIECE as u64) as usize;
                        if let Some(a) = addr {
                            l.write(a + done, r.take(n)).map_err(landed)?;
                        } else {
                            r.take(n);
                        }
                        n
                    } else {
                        // Without a queue, write whole pieces (one synchronous
                        // copy each), reading the rest of one straight into it.
                        let n = left.min(RECV_PIECE as u64) as usize;
                        piece.resize(n, 0);
                        r.read_exact(&mut piece, l)?;
                        if let Some(a) = addr {
                            l.write(a + done, &piece).map_err(landed)?;
                        }
                        n
                    };
                    done += n as u64;
                    if done < bytes {
                        l.end_of_frame()?;
                    }
                }
                if kind == KIND_GET_DATA && window != 0 {
                    l.gets.push(get_id);
                }
            }
            KIND_GET_DATA => {
                if window != 0 {
                    l.gets.push(get_id);
                }
            }
            KIND_GET => {
                if signal.is_some() {
                    return Err(GinHostError::Invalid(format!("rank {peer} sent a get with a signal")));
                }
                l.sh.get_requests.lock().unwrap_or_else(|e| e.into_inner()).push((peer, window, offset, bytes, get_id));
            }
            KIND_PUT | KIND_SIGNAL => {}
            KIND_BYE => {
                l.sh.state[peer].compare_exchange(PEER_UP, PEER_LEFT, Ordering::SeqCst, Ordering::SeqCst).ok();
                continue;
            }
            KIND_ERROR => {
                if bytes > MAX_ERROR_BYTES as u64 {
                    return Err(GinHostError::Invalid(format!("rank {peer} sent an error frame of {bytes} bytes")));
                }
                let mut msg = vec![0u8; bytes as usize];
                r.read_exact(&mut msg, l)?;
                l.told = true;
                let msg = String::from_utf8_lossy(&msg);
                return Err(error_class(
                    window,
                    format!("rank {peer} rejected what this rank sent it, and closed the connection: {msg}"),
                ));
            }
            k => return Err(GinHostError::Invalid(format!("rank {peer} sent unknown frame kind {k}"))),
        }
        match signal {
            Some(sig) => l.signal(sig)?,
            None => l.end_of_frame()?,
        }
    }
}

impl Transport for TcpTransport {
    fn put(&mut self, to: PutTarget, data: &[u8]) -> GinResult<()> {
        let PutTarget { peer, dst_window, dst_offset, signal } = to;
        self.check_peer(peer)?;
        if peer == self.rank {
            let l = &self.shared.landing;
            l.put(dst_window, dst_offset, data)?;
            return match signal {
                Some((s, v)) => l.signal(s, v),
                None => Ok(()),
            };
        }
        let head = header(KIND_PUT, dst_window, dst_offset, data.len() as u64, signal);
        self.send(peer, &head, data)
    }

    fn signal(&mut self, peer: usize, signal: u32, value: u64) -> GinResult<()> {
        self.check_peer(peer)?;
        if peer == self.rank {
            return self.shared.landing.signal(signal, value);
        }
        let head = header(KIND_SIGNAL, 0, 0, 0, Some((signal, value)));
        self.send(peer, &head, &[])
    }

    /// A get request to the peer, whose proxy answers with the data (in its
    /// `progress`); this rank's receiver lands it and reports it landed
    /// once visible ([`Transport::retired`]). From oneself: copied at once.
    fn get(&mut self, from: GetSource, dst: u64, bytes: u64) -> GinResult<()> {
        let GetSource { peer, src_window, src_offset } = from;
        self.check_peer(peer)?;
        if peer == self.rank {
            let local = self.shared.landing.local().clone();
            let src = local.window_addr(src_window, src_offset, bytes)?;
            if src < dst + bytes && dst < src + bytes {
                return Err(GinHostError::Invalid(format!(
                    "a get of {bytes} bytes from this rank overlaps its destination"
                )));
            }
            let mut done = 0u64;
            while done < bytes {
                let n = (bytes - done).min(crate::proxy::PUT_CHUNK as u64) as usize;
                self.buf.resize(n, 0);
                local.read_device(src + done, &mut self.buf[..n])?;
                local.write_device(dst + done, &self.buf[..n])?;
                done += n as u64;
            }
            return Ok(());
        }
        self.gets_issued += 1;
        let id = self.gets_issued;
        self.shared.gets.lock().unwrap_or_else(|e| e.into_inner()).insert(id, (peer, dst, bytes));
        let r = self.send(peer, &get_header(KIND_GET, src_window, src_offset, bytes, id), &[]);
        if r.is_err() {
            // Never answered: it retires with its failed peer (see `retired`).
            self.shared.gets.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            self.retired_ids.insert(id);
        }
        r
    }

    fn progress(&mut self, failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        self.serve_gets();
        self.tell_rejections();
        let mut f = self.shared.failures.lock().unwrap_or_else(|e| e.into_inner());
        for p in f.iter() {
            self.reported[p.peer] = true;
        }
        failed.append(&mut f);
        Ok(())
    }

    fn issued(&self) -> u64 {
        self.gets_issued
    }

    /// Gets retire in id order once landed; those to a peer that failed
    /// retire unlanded once its failure has been reported to the proxy (so
    /// their rings are failed and their tickets not completed as if the
    /// data had landed); a peer that left with gets unanswered is failed
    /// for it.
    fn retired(&mut self) -> GinResult<u64> {
        if self.gets_retired == self.gets_issued {
            return Ok(self.gets_retired);
        }
        self.retired_ids.extend(self.shared.gets_landed.lock().unwrap_or_else(|e| e.into_inner()).drain(..));
        let state = &self.shared.state;
        let (ids, reported) = (&mut self.retired_ids, &self.reported);
        let mut left = Vec::new();
        self.shared.gets.lock().unwrap_or_else(|e| e.into_inner()).retain(|&id, &mut (peer, _, _)| {
            match state[peer].load(Ordering::SeqCst) {
                PEER_UP => true,
                _ if reported[peer] => {
                    ids.insert(id);
                    false
                }
                PEER_LEFT => {
                    left.push(peer);
                    true
                }
                _ => true,
            }
        });
        for peer in left {
            self.shared.fail(
                peer,
                GinHostError::Remote(format!("rank {peer} closed its GIN transport with gets of this rank unanswered")),
            );
        }
        while self.retired_ids.remove(&(self.gets_retired + 1)) {
            self.gets_retired += 1;
        }
        Ok(self.gets_retired)
    }

    fn flush(&mut self) -> GinResult<()> {
        for peer in 0..self.conns.len() {
            let Some(c) = self.conns[peer].as_mut() else { continue };
            if c.writer.buffer().is_empty() || self.shared.state[peer].load(Ordering::SeqCst) == PEER_FAILED {
                continue;
            }
            if let Err(e) = c.writer.flush() {
                self.broken(peer, e);
            }
        }
        Ok(())
    }

    fn close(&mut self, graceful: bool) {
        if self.closed {
            return;
        }
        self.closed = true;
        // From here on receivers leave memory and signals alone.
        *self.shared.closed.write().unwrap_or_else(|e| e.into_inner()) = true;
        let head = header(KIND_BYE, 0, 0, 0, None);
        for peer in 0..self.conns.len() {
            let Some(c) = self.conns[peer].as_mut() else { continue };
            if graceful && self.shared.state[peer].load(Ordering::SeqCst) != PEER_FAILED {
                let _ = c.writer.write_all(&head).and_then(|()| c.writer.flush());
                // The receiver drains until the peer closes too, then exits.
                let _ = c.stream.shutdown(Shutdown::Write);
            } else {
                let _ = c.stream.shutdown(Shutdown::Both);
            }
        }
        // Receivers still draining a live peer's last frames are detached:
        // they no longer touch memory and end when the peer closes.
        for h in std::mem::take(&mut self.receivers) {
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.close(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_parsing() {
        assert_eq!(parse_addr("10.1.2.3").unwrap(), "10.1.2.3:0".parse().unwrap());
        assert_eq!(parse_addr(" 127.0.0.1:7000 ").unwrap(), "127.0.0.1:7000".parse().unwrap());
        assert_eq!(parse_addr("::1").unwrap(), "[::1]:0".parse().unwrap());
        assert!(matches!(parse_addr("eth0"), Err(GinHostError::Invalid(_))));
    }

    #[test]
    fn header_round_trip() {
        let h = header(KIND_PUT, 7, 1 << 40, 12345, Some((3, u64::MAX)));
        assert_eq!((u32_at(&h, 0), u32_at(&h, 4), u64_at(&h, 8), u64_at(&h, 16)), (KIND_PUT, 7, 1 << 40, 12345));
        assert_eq!((u32_at(&h, 24), u32_at(&h, 28), u64_at(&h, 32)), (3, 1, u64::MAX));
        assert_eq!(u32_at(&header(KIND_SIGNAL, 0, 0, 0, None), 28), 0);
    }

    // Receivers against model devices whose copy queues make writes
    // visible only when a fence behind them passes, a while after it was
    // queued.
    use crate::LocalMemory;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Condvar;

    /// What each rank gave to the allgather so far.
    type Gathered = (Mutex<Vec<Option<Vec<u8>>>>, Condvar);

    /// A bootstrap of ranks that are threads of this process (one allgather).
    struct Boot {
        rank: usize,
        all: Arc<Gathered>,
    }

    impl Bootstrap for Boot {
        fn rank(&self) -> usize {
            self.rank
        }
        fn nranks(&self) -> usize {
            self.all.0.lock().unwrap().len()
        }
        fn allgather(&self, data: &[u8]) -> GinResult<Vec<Vec<u8>>> {
            let (m, cv) = &*self.all;
            let mut v = m.lock().unwrap();
            v[self.rank] = Some(data.to_vec());
            cv.notify_all();
            let v = cv.wait_while(v, |v| v.iter().any(Option::is_none)).unwrap();
            Ok(v.iter().map(|d| d.clone().unwrap()).collect())
        }
    }

    const BASE: u64 = 0x7000_0000;

    /// One window (id 0) of device memory, and copy queues over it.
    struct ModelDevice {
        mem: Mutex<Vec<u8>>,
        /// Whether `copy_queue` gives queues.
        queues: bool,
        /// How long a fence takes to pass.
        delay: Duration,
        /// Queues report a device fault.
        fault: AtomicBool,
        fences: AtomicU64,
        writes: AtomicU64,
    }

    struct ModelMemory(Arc<ModelDevice>);

    impl LocalMemory for ModelMemory {
        fn window_addr(&self, window: u32, offset: u64, bytes: u64) -> GinResult<u64> {
            let len = self.0.mem.lock().unwrap().len() as u64;
            if window != 0 || offset + bytes > len {
                return Err(GinHostError::Invalid(format!("{bytes} bytes at {offset} of window {window}")));
            }
            Ok(BASE + offset)
        }
        fn write_device(&self, addr: u64, data: &[u8]) -> GinResult<()> {
            let at = (addr - BASE) as usize;
            self.0.mem.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn read_device(&self, addr: u64, out: &mut [u8]) -> GinResult<()> {
            let at = (addr - BASE) as usize;
            out.copy_from_slice(&self.0.mem.lock().unwrap()[at..at + out.len()]);
            Ok(())
        }
        fn copy_queue(&self) -> GinResult<Box<dyn CopyQueue>> {
            if !self.0.queues {
                return Err(GinHostError::Unavailable("model without queues".into()));
            }
            Ok(Box::new(ModelQueue { dev: self.0.clone(), open: Vec::new(), in_flight: VecDeque::new(), passed: 0 }))
        }
    }

    type Writes = Vec<(u64, Vec<u8>)>;

    struct ModelQueue {
        dev: Arc<ModelDevice>,
        /// Writes queued since the last fence.
        open: Writes,
        /// Fences queued, not passed: (number, when queued, the writes before it).
        in_flight: VecDeque<(u64, Instant, Writes)>,
        passed: u64,
    }

    impl CopyQueue for ModelQueue {
        unsafe fn copy(&mut self, _: u64, _: u64, _: u64) -> GinResult<()> {
            Err(GinHostError::Invalid("a TCP receiver copies nothing".into()))
        }
        unsafe fn write(&mut self, dst: u64, data: &[u8]) -> GinResult<()> {
            self.dev.writes.fetch_add(1, Ordering::SeqCst);
            self.open.push((dst, data.to_vec()));
            Ok(())
        }
        fn fence(&mut self) -> GinResult<u64> {
            self.dev.fences.fetch_add(1, Ordering::SeqCst);
            let n = self.in_flight.back().map_or(self.passed, |f| f.0) + 1;
            self.in_flight.push_back((n, Instant::now(), std::mem::take(&mut self.open)));
            Ok(n)
        }
        fn passed(&mut self) -> GinResult<u64> {
            if self.dev.fault.load(Ordering::SeqCst) {
                return Err(GinHostError::System("model device fault".into()));
            }
            while self.in_flight.front().is_some_and(|f| f.1.elapsed() >= self.dev.delay) {
                let (n, _, writes) = self.in_flight.pop_front().unwrap();
                let mut mem = self.dev.mem.lock().unwrap();
                for (dst, data) in writes {
                    let at = (dst - BASE) as usize;
                    mem[at..at + data.len()].copy_from_slice(&data);
                }
                self.passed = n;
            }
            Ok(self.passed)
        }
    }

    fn device(bytes: usize, queues: bool) -> Arc<ModelDevice> {
        Arc::new(ModelDevice {
            mem: Mutex::new(vec![0; bytes]),
            queues,
            delay: Duration::from_micros(300),
            fault: AtomicBool::new(false),
            fences: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        })
    }

    /// Ranks 0 and 1 over `devs`, each with the signal words in `signals`.
    fn pair(devs: &[Arc<ModelDevice>; 2], signals: &mut [Vec<u64>; 2]) -> Vec<TcpTransport> {
        let all = Arc::new((Mutex::new(vec![None, None]), Condvar::new()));
        let sig: Vec<(usize, u32)> = signals.iter_mut().map(|s| (s.as_mut_ptr() as usize, s.len() as u32)).collect();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|rank| {
                    let (boot, dev, (ptr, len)) = (Boot { rank, all: all.clone() }, devs[rank].clone(), sig[rank]);
                    s.spawn(move || {
                        // SAFETY: the test keeps `signals` alive (and touches
                        // them atomically only) until the transports are dropped.
                        let landing = unsafe { Landing::new(Arc::new(ModelMemory(dev)), ptr as *mut u64, len) };
                        TcpTransport::connect(&boot, landing, &TcpConfig::default()).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn load(signals: &[u64], i: usize) -> u64 {
        // SAFETY: a live u64 of the test, accessed atomically while shared.
        unsafe { AtomicU64::from_ptr(signals.as_ptr().add(i) as *mut u64) }.load(Ordering::SeqCst)
    }

    fn wait_failure(t: &mut TcpTransport) -> PeerFailure {
        let start = Instant::now();
        let mut failed = Vec::new();
        while failed.is_empty() {
            assert!(start.elapsed() < Duration::from_secs(30), "no failure reported");
            t.progress(&mut failed).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        failed.remove(0)
    }

    #[test]
    fn signals_follow_their_data_and_small_puts_share_fences() {
        const PUTS: usize = 20_000;
        const BIG: usize = 3 << 20;
        let devs = [device(PUTS * 8 + BIG, true), device(8, true)];
        let mut signals = [vec![0u64; 2], vec![0u64; 2]];
        let mut ts = pair(&devs, &mut signals);
        let big: Vec<u8> = (0..BIG).map(|i| (i * 13 + 5) as u8).collect();
        let sig0 = signals[0].as_ptr() as usize;
        let mem = &devs[0].mem;
        std::thread::scope(|s| {
            // Rank 0 checks: whatever its signals say has landed must be visible.
            let checker = s.spawn(|| {
                // SAFETY: rank 0's signal words, alive for the scope.
                let sig = unsafe { std::slice::from_raw_parts(sig0 as *const u64, 2) };
                let start = Instant::now();
                let mut seen = 0;
                loop {
                    let (small, large) = (load(sig, 0) as usize, load(sig, 1));
                    let m = mem.lock().unwrap();
                    for i in seen..small {
                        assert_eq!(
                            m[i * 8..i * 8 + 8],
                            (i as u64 + 1).to_le_bytes(),
                            "put {i} signalled before its data"
                        );
                    }
                    seen = small;
                    if large == 1 {
                        assert!(m[PUTS * 8..] == big[..], "the large put signalled before its data");
                    }
                    if small == PUTS && large == 1 {
                        return;
                    }
                    drop(m);
                    assert!(start.elapsed() < Duration::from_secs(60), "{small} of {PUTS} puts landed");
                    std::thread::yield_now();
                }
            });
            let t = &mut ts[1];
            for i in 0..PUTS as u64 {
                t.put(PutTarget::new(0, 0, i * 8, Some((0, 1))), &(i + 1).to_le_bytes()).unwrap();
            }
            t.put(PutTarget::new(0, 0, (PUTS * 8) as u64, Some((1, 1))), &big).unwrap();
            t.flush().unwrap();
            checker.join().unwrap();
        });
        let (fences, writes) = (devs[0].fences.load(Ordering::SeqCst), devs[0].writes.load(Ordering::SeqCst));
        assert!(writes > PUTS as u64);
        assert!(fences * 20 <= PUTS as u64, "{fences} fences for {PUTS} puts");
        let mut failed = Vec::new();
        for t in &mut ts {
            t.progress(&mut failed).unwrap();
        }
        assert!(failed.is_empty(), "{failed:?}");
        drop(ts);
    }

    #[test]
    fn a_device_fault_fails_the_peer_and_holds_its_signals_back() {
        let devs = [device(64, true), device(64, true)];
        let mut signals = [vec![0u64; 1], vec![0u64; 1]];
        let mut ts = pair(&devs, &mut signals);
        devs[1].fault.store(true, Ordering::SeqCst);
        ts[0].put(PutTarget::new(1, 0, 0, Some((0, 1))), &7u64.to_le_bytes()).unwrap();
        ts[0].flush().unwrap();
        let f = wait_failure(&mut ts[1]);
        assert_eq!(f.peer, 0);
        assert!(matches!(&f.error, GinHostError::Remote(m) if m.contains("model device fault")), "{f:?}");
        assert_eq!(load(&signals[1], 0), 0, "signal applied without its data");
        assert!(matches!(ts[1].put(PutTarget::new(0, 0, 0, None), &[1]), Err(GinHostError::Remote(_))));
        // Rank 0, the sender, learns why (an error frame), not only that the connection was cut.
        let f = wait_failure(&mut ts[0]);
        assert_eq!(f.peer, 1);
        assert!(
            matches!(&f.error, GinHostError::Remote(m) if m.contains("rank 1 rejected") && m.contains("model device fault")),
            "{f:?}"
        );
        let again = ts[0].put(PutTarget::new(1, 0, 0, None), &[1]);
        assert!(matches!(&again, Err(GinHostError::Remote(m)) if m.contains("model device fault")), "{again:?}");
        drop(ts);
    }

    #[test]
    fn a_bad_range_fails_the_peer_after_landing_what_came_before() {
        for queues in [true, false] {
            let devs = [device(64, queues), device(64, queues)];
            let mut signals = [vec![0u64; 1], vec![0u64; 1]];
            let mut ts = pair(&devs, &mut signals);
            ts[0].put(PutTarget::new(1, 0, 8, Some((0, 1))), &5u64.to_le_bytes()).unwrap();
            ts[0].put(PutTarget::new(1, 0, 60, Some((0, 1))), &[1; 8]).unwrap();
            ts[0].flush().unwrap();
            let f = wait_failure(&mut ts[1]);
            assert_eq!(f.peer, 0);
            assert!(matches!(&f.error, GinHostError::Invalid(m) if m.contains("put from rank 0")), "{f:?}");
            assert_eq!(load(&signals[1], 0), 1, "queues: {queues}");
            assert_eq!(devs[1].mem.lock().unwrap()[8..16], 5u64.to_le_bytes());
            assert_eq!(devs[1].fences.load(Ordering::SeqCst), queues as u64);
            // The sender is told why, with the rejection's class.
            let f = wait_failure(&mut ts[0]);
            assert_eq!(f.peer, 1);
            assert!(
                matches!(&f.error, GinHostError::Invalid(m) if m.contains("rank 1 rejected") && m.contains("put from rank 0")),
                "queues: {queues}: {f:?}"
            );
            let again = ts[0].signal(1, 0, 1);
            assert!(matches!(&again, Err(GinHostError::Invalid(m)) if m.contains("8 bytes at 60")), "{again:?}");
            drop(ts);
        }
    }

    #[test]
    fn a_get_never_retires_unlanded_before_its_peers_failure_is_reported() {
        let devs = [device(64, true), device(64, true)];
        let mut signals = [vec![0u64; 1], vec![0u64; 1]];
        let mut ts = pair(&devs, &mut signals);
        ts[0].get(GetSource { peer: 1, src_window: 0, src_offset: 8 }, BASE + 16, 8).unwrap();
        ts[0].flush().unwrap();
        assert_eq!(ts[0].issued(), 1);
        // Rank 1 leaves without ever serving the request (its proxy never ran `progress`).
        ts[1].close(true);
        let start = Instant::now();
        let mut failed = Vec::new();
        loop {
            let r = ts[0].retired().unwrap();
            if failed.is_empty() {
                // The proxy would complete the get's ticket as if its data had landed.
                assert_eq!(r, 0, "the get retired before the proxy heard of its peer's failure");
            } else if r == 1 {
                break;
            }
            ts[0].progress(&mut failed).unwrap();
            assert!(start.elapsed() < Duration::from_secs(20), "the get never retired: {failed:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(failed[0].peer, 1);
        assert!(matches!(&failed[0].error, GinHostError::Remote(m) if m.contains("unanswered")), "{failed:?}");
        assert_eq!(devs[0].mem.lock().unwrap()[16..24], [0u8; 8], "nothing landed");
        drop(ts);
    }

    #[test]
    fn closing_waits_for_a_batch_in_flight() {
        const PUTS: u64 = 2000;
        let devs = [device(8, true), device(PUTS as usize * 8, true)];
        let mut signals = [vec![0u64; 1], vec![0u64; 1]];
        let mut ts = pair(&devs, &mut signals);
        let (t0, t1) = ts.split_at_mut(1);
        let sig = signals[1].as_ptr() as usize;
        // SAFETY: rank 1's signal word, alive until the end of the test.
        let sig = unsafe { std::slice::from_raw_parts(sig as *const u64, 1) };
        std::thread::scope(|s| {
            // Rank 0 keeps sending, a batch at a time.
            s.spawn(|| {
                for i in 0..PUTS {
                    if t0[0].put(PutTarget::new(1, 0, i * 8, Some((0, 1))), &(i + 1).to_le_bytes()).is_err() {
                        break;
                    }
                    if i % 16 == 0 {
                        t0[0].flush().unwrap();
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
            });
            while load(sig, 0) < 64 {
                std::thread::yield_now();
            }
            let start = Instant::now();
            t1[0].close(false);
            assert!(start.elapsed() < Duration::from_secs(5));
            // After close nothing more lands, and what was signalled is there.
            let n = load(sig, 0);
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(load(sig, 0), n);
            let m = devs[1].mem.lock().unwrap();
            for i in 0..n as usize {
                assert_eq!(m[i * 8..i * 8 + 8], (i as u64 + 1).to_le_bytes());
            }
        });
        drop(ts);
    }
}
