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
//! buffer; on the receiving side one thread per connection reads frames,
//! writes the payload into the rank's memory in bounded pieces
//! ([`Landing::put`]) and only then applies the signal. Operations to
//! oneself are applied directly by the caller.
//!
//! A connection that ends without the peer's goodbye frame, or that carries
//! a malformed frame (unknown kind, window range or signal the receiver
//! rejects), fails that peer: [`Transport::progress`] reports it and
//! [`Transport::put`] to it returns `Remote`.

use super::{Landing, PeerFailure, Transport};
use crate::descriptor::RemoteSignal;
use crate::{Bootstrap, GinHostError, GinResult};
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
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
/// Sender buffer per peer.
const SEND_BUFFER: usize = 256 << 10;
/// Receive buffer per connection: payloads land in pieces of this size.
const RECV_PIECE: usize = 1 << 20;
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
    /// stop touching memory. They hold the read lock while they write.
    closed: RwLock<bool>,
    /// `PEER_*` per rank.
    state: Vec<AtomicU8>,
    failures: Mutex<Vec<PeerFailure>>,
}

impl Shared {
    fn fail(&self, peer: usize, error: GinHostError) {
        if self.state[peer].swap(PEER_FAILED, Ordering::SeqCst) != PEER_FAILED {
            tracing::warn!(peer, %error, "GIN TCP: peer failed");
            self.failures.lock().unwrap_or_else(|e| e.into_inner()).push(PeerFailure { peer, error });
        }
    }

    /// Runs `f` unless the transport is closed; `None` if closed.
    fn apply<T>(&self, f: impl FnOnce(&Landing) -> T) -> Option<T> {
        let closed = self.closed.read().unwrap_or_else(|e| e.into_inner());
        if *closed {
            None
        } else {
            Some(f(&self.landing))
        }
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
            let h = std::thread::Builder::new()
                .name(format!("gin-tcp-rx{rank}<{peer}"))
                .spawn(move || receive(rx, peer, &sh))
                .map_err(|e| sys("spawn receiver", e))?;
            receivers.push(h);
            conns.push(Some(Conn { writer: BufWriter::with_capacity(SEND_BUFFER, tx), stream: s }));
        }
        Ok(TcpTransport { rank, conns, shared, receivers, closed: false })
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
            _ => Err(GinHostError::Remote(format!("connection to rank {peer} failed"))),
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
        err
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

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the
/// first byte.
fn read_full(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The receiver thread of the connection to `peer`.
fn receive(mut s: TcpStream, peer: usize, sh: &Shared) {
    let mut buf = Vec::new();
    let mut head = [0u8; HEADER_BYTES];
    let bad = |sh: &Shared, s: &TcpStream, e: GinHostError| {
        if !*sh.closed.read().unwrap_or_else(|e| e.into_inner()) {
            sh.fail(peer, e);
        }
        let _ = s.shutdown(Shutdown::Both);
    };
    loop {
        match read_full(&mut s, &mut head) {
            Ok(true) => {}
            Ok(false) if sh.state[peer].load(Ordering::SeqCst) == PEER_LEFT => return,
            Ok(false) => return bad(sh, &s, GinHostError::Remote(format!("rank {peer} closed its connection"))),
            Err(e) => return bad(sh, &s, GinHostError::Remote(format!("receiving from rank {peer}: {e}"))),
        }
        let (kind, window, offset, bytes) = (u32_at(&head, 0), u32_at(&head, 4), u64_at(&head, 8), u64_at(&head, 16));
        let signal = match u32_at(&head, 28) {
            0 => None,
            _ => Some((u32_at(&head, 24), u64_at(&head, 32))),
        };
        match kind {
            KIND_PUT => {
                // Check the whole range once, then land it piece by piece.
                let addr = if bytes == 0 {
                    Ok(0)
                } else {
                    sh.apply(|l| l.window_addr(window, offset, bytes)).unwrap_or(Ok(0))
                };
                let addr = match addr {
                    Ok(a) => a,
                    Err(e) => return bad(sh, &s, GinHostError::Invalid(format!("put from rank {peer}: {e}"))),
                };
                let mut done = 0u64;
                while done < bytes {
                    let n = (bytes - done).min(RECV_PIECE as u64) as usize;
                    if buf.len() < n {
                        buf.resize(n, 0);
                    }
                    match read_full(&mut s, &mut buf[..n]) {
                        Ok(true) => {}
                        Ok(false) => return bad(sh, &s, GinHostError::Remote(format!("rank {peer} closed mid-put"))),
                        Err(e) => return bad(sh, &s, GinHostError::Remote(format!("receiving from rank {peer}: {e}"))),
                    }
                    let w = sh.apply(|l| l.local().write_device(addr + done, &buf[..n]));
                    if let Some(Err(e)) = w {
                        return bad(sh, &s, GinHostError::Remote(format!("landing a put from rank {peer}: {e}")));
                    }
                    done += n as u64;
                }
            }
            KIND_SIGNAL => {}
            KIND_BYE => {
                sh.state[peer].compare_exchange(PEER_UP, PEER_LEFT, Ordering::SeqCst, Ordering::SeqCst).ok();
                continue;
            }
            k => return bad(sh, &s, GinHostError::Invalid(format!("rank {peer} sent unknown frame kind {k}"))),
        }
        if let Some((id, value)) = signal {
            if let Some(Err(e)) = sh.apply(|l| l.signal(id, value)) {
                return bad(sh, &s, GinHostError::Invalid(format!("signal from rank {peer}: {e}")));
            }
        }
    }
}

impl Transport for TcpTransport {
    fn put(
        &mut self,
        peer: usize,
        dst_window: u32,
        dst_offset: u64,
        data: &[u8],
        signal: Option<RemoteSignal>,
    ) -> GinResult<()> {
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

    fn progress(&mut self, failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        let mut f = self.shared.failures.lock().unwrap_or_else(|e| e.into_inner());
        failed.append(&mut f);
        Ok(())
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
}
