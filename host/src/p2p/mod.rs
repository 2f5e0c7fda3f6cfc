//! A point-to-point transfer engine, independent of communicators, for
//! KV-cache and weight transfer (the shape of UCCL's P2P engine: names in
//! the docs' search).
//!
//! An [`Endpoint`] serves one GPU and listens on a TCP port. A peer
//! [`connect`](Endpoint::connect)s to it and the endpoint
//! [`accept`](Endpoint::accept)s; the [`Conn`] both get carries transfers
//! **in one direction**, as UCCL's: the connecting side *initiates*
//! ([`send`](Endpoint::send), [`write`](Endpoint::write),
//! [`read`](Endpoint::read)), the accepting side *receives*
//! ([`recv`](Endpoint::recv)) and serves the one-sided writes and reads
//! into the regions it advertised. **For both directions each side
//! connects to the other** (two connections; `examples/p2p.rs` does it).
//!
//! Memory is registered first ([`Endpoint::reg_symmetric`], or
//! [`Endpoint::reg`] for any device or host pointer) and every transfer
//! names its region: a span outside it is an [`Error::InvalidArgument`]
//! before anything moves. One-sided transfers address a region the peer
//! advertised: [`Endpoint::advertise`] makes a [`RemoteRegion`], which the
//! application ships to the initiator itself ([`RemoteRegion::to_bytes`] /
//! [`RemoteRegion::from_bytes`]).
//!
//! ```
//! use devcomm::p2p::{ControlPath, Endpoint, P2pConfig};
//! use devcomm::{Device, RuntimeSelection, SymmetricMemory};
//!
//! let dev = Device::open(RuntimeSelection::Emulated, 0)?;
//! // Control frames through shared memory on one host (opt-in for now).
//! let cfg = P2pConfig::default().with_bind("127.0.0.1:0".parse().unwrap()).with_shm_control(true);
//! let server = Endpoint::with_config(&dev, cfg.clone())?;
//! let client = Endpoint::with_config(&dev, cfg)?;
//! let (src, dst) = (SymmetricMemory::alloc(&dev, 4096)?, SymmetricMemory::alloc(&dev, 4096)?);
//! src.write(dev.stream(), 0, &[7u8; 1000])?;
//! let (smr, dmr) = (client.reg_symmetric(&src)?, server.reg_symmetric(&dst)?);
//! let addr = server.addr();
//! std::thread::scope(|s| -> devcomm::Result<()> {
//!     let acc = s.spawn(|| server.accept());
//!     let conn = client.connect(addr, 0)?;
//!     let (_peer, _gpu, sconn) = acc.join().unwrap()?;
//!     assert_eq!(conn.control_path(), ControlPath::SharedMemory);
//!     let id = server.recv_async(&sconn, &dmr, dst.device_addr(), 4096)?;
//!     client.send(&conn, &smr, src.device_addr(), 1000)?;
//!     assert_eq!(server.wait_async(id)?, 1000);
//!     Ok(())
//! })?;
//! let mut back = [0u8; 1000];
//! dst.read(dev.stream(), 0, &mut back)?;
//! assert_eq!(back, [7u8; 1000]);
//! # Ok::<(), devcomm::Error>(())
//! ```
//!
//! # Transports, per connection
//!
//! * **Same host** (both endpoints see the same boot id and host name, run
//!   the same runtime, and neither asks for TCP): **CUDA IPC and the copy
//!   engine**. The initiator asks the peer once per region for the file
//!   descriptor of its allocation (a CUDA VMM allocation exported as a POSIX
//!   fd; a `memfd` on the emulated runtime), which travels over a Unix
//!   socket (`SCM_RIGHTS`); it maps the allocation into its own device's
//!   address space and moves the bytes with one `cuMemcpyDtoDAsync` on its
//!   stream, device to device. This needs both sides' regions in memory
//!   devcomm allocated shareable: [`SymmetricMemory`](crate::SymmetricMemory)
//!   (VMM, `cuMemCreate` with POSIX fd handles). `cudaMalloc`/`cuMemAlloc`
//!   memory (a [`DeviceBuffer`](crate::DeviceBuffer)) and host memory
//!   cannot be exported as an fd: transfers from or to such a region go
//!   over the connection's TCP sockets instead (still correct, slower).
//! * **Other hosts**, or `P2pConfig::force_tcp` / `DEVCOMM_P2P_TRANSPORT=tcp`
//!   on either side: **TCP**, striped over `threads` sockets: a transfer is
//!   cut into `chunk_bytes` pieces sent round-robin, each socket with a
//!   writer and a reader thread that copy device memory through a pinned
//!   bounce buffer.
//! * **RDMA** ([`P2pTransport::Verbs`]), with the cargo feature `verbs`,
//!   when the endpoint is made with [`P2pConfig::verbs`]
//!   (`DEVCOMM_P2P_TRANSPORT=verbs`): then *every* connection of the
//!   endpoint uses it, same-host ones too (as `tcp` does). **Built and
//!   tested against a software model NIC only; no RDMA device on the
//!   project's machines** (see `devcomm-gin`'s `transport::verbs` docs for
//!   why not even soft-RoCE can run there). Details below.
//!
//! # The RDMA (verbs) transport
//!
//! * **Opt-in, both sides, no silent fallback.** An endpoint with
//!   [`P2pConfig::verbs`] opens its RDMA device when it is created
//!   (`devcomm-gin`'s `rc` layer over libibverbs loaded at run time; the
//!   device, port, GID index, traffic class and timeouts come from the
//!   GIN transport's `DEVCOMM_GIN_IB_*` variables). Without the feature,
//!   libibverbs, a device or an active port, [`Endpoint::with_config`]
//!   fails with [`Error::InvalidUsage`] naming what is missing. Both
//!   endpoints of a connection must use it: the hello says so
//!   (`FLAG_VERBS`), and a connection between an RDMA endpoint and one
//!   without fails on both sides with [`Error::InvalidUsage`] saying so
//!   (the acceptor records it in [`Endpoint::rejections`]). A silent TCP
//!   fallback would hide a misconfiguration that costs an order of
//!   magnitude in bandwidth.
//! * **Setup.** One protection domain and one completion queue per
//!   endpoint, one RC queue pair per connection. The connector sends its
//!   queue pair record (QP number, first PSN, LID, GID, port, MTU) on the
//!   control socket right after the hello answer; the acceptor, once the
//!   connection's one (idle) data socket is in, creates its queue pair,
//!   moves it to RTS toward the connector's and answers with its record;
//!   the connector does the same, then the usual "ready" frame follows.
//! * **Memory.** Every [`Mr`] of an RDMA endpoint is registered with the
//!   NIC when it is made (local write, remote write and read) and
//!   deregistered when it is dropped, after the transfers using it: device
//!   memory through a dmabuf of its pages where the runtime exports one
//!   (`ibv_reg_dmabuf_mr`, GPUDirect RDMA without nvidia-peermem), else by
//!   address (`ibv_reg_mr`: host memory, the emulated runtime's device
//!   memory, CUDA memory with nvidia-peermem). A remote key grants its
//!   whole region, as any RDMA key does.
//! * **Two-sided.** The receiver-driven protocol is unchanged except that
//!   the clear-to-send frame carries the receive region's remote key
//!   (`C_CTS_RDMA`). The sender RDMA WRITEs the message into the posted
//!   receive (work requests of at most the port's largest message), then
//!   an RDMA READ of its last (up to) 8 bytes — a read does not pass the
//!   writes before it on a queue pair, so its response means they are in
//!   the receiver's memory, also GPU memory behind PCIe (NCCL's "GDR
//!   flush") — signaled. On that completion the endpoint's poller thread
//!   tells the receiver (`C_SEND`, already landed) on the control socket,
//!   which completes the `recv`, and completes the `send`.
//! * **One-sided.** [`Endpoint::advertise`] puts the region's remote key
//!   into the [`RemoteRegion`]; its serialised form is versioned: 48 bytes
//!   (version 0, no key: what endpoints without RDMA write, and what
//!   older builds read) or 56 (version 2, the key and flags);
//!   [`RemoteRegion::from_bytes`] reads both and refuses other versions,
//!   lengths and flags. `write` is RDMA WRITEs plus the flush read, `read`
//!   RDMA READs; each completes when its last request does. A region
//!   without a key cannot be written or read over RDMA
//!   ([`Error::InvalidArgument`]). The target's endpoint is not involved:
//!   the NIC checks the key and range.
//! * **Flow control and completion.** Each queue pair's send queue has
//!   `DEVCOMM_GIN_IB_*`'s depth (512 by default, capped by the device);
//!   only each transfer's last request and every depth/4-th are signaled.
//!   A transfer waits for room up to [`P2pConfig::op_timeout`]; async
//!   transfers stay in flight together, completed in order by the poller.
//! * **Failures.** A completion with an error (retry count exceeded: the
//!   peer is gone; remote access error: a region deregistered or a bad
//!   key) fails the connection with [`Error::RemoteError`] naming the
//!   status; every transfer in flight gets it, the queue pair goes to the
//!   error state (the NIC starts nothing more from it). A transfer that
//!   does not complete within the op timeout fails its connection with
//!   [`Error::Timeout`]. Nothing waits forever.
//! * **What is not done.** No write-with-immediate (the completion notice
//!   takes the control socket: one more hop than UCCL's immediate data),
//!   no striping over several queue pairs or NICs, no inline sends, no
//!   automatic choice of RDMA for other hosts (the default stays TCP until
//!   the transport has run on a NIC).
//!
//! # Protocol
//!
//! Every TCP connection to the listening port starts with a 256-byte hello
//! carrying a magic and a version; anything else (garbage, a port scanner,
//! a different version) is refused and recorded
//! ([`Endpoint::rejections`]), and the endpoint keeps serving. A connection
//! is a control socket (48-byte frames) plus `threads` data sockets (frames
//! of a 40-byte header and a payload); a same-host one moves its control
//! frames to shared memory once it is set up (below). Two-sided transfers are receiver
//! driven: `recv` tells the sender where the next message may land (its
//! region, address and capacity), `send` takes those in order, so sends and
//! receives on one connection match first to first. A message larger than
//! the receive region fails both sides with [`Error::InvalidArgument`], and
//! the connection stays usable. One-sided writes are acknowledged by the
//! target once every byte landed (over TCP) or are complete when the local
//! copy is (IPC); the target checks every address against its registered,
//! advertised regions (a region never advertised cannot be written or read
//! by peers; one posted as a receive can be mapped by the sending peer).
//!
//! # Control path
//!
//! Control frames (a receive posted, a message copied, a write
//! acknowledged, a descriptor asked for) take one of two paths,
//! [`Conn::control_path`]:
//!
//! * **Shared memory** ([`ControlPath::SharedMemory`]) on a same-host
//!   connection when both endpoints ask for it ([`P2pConfig::shm_control`],
//!   on by default; `DEVCOMM_P2P_CONTROL=tcp` ([`CONTROL_ENV`]) turns it
//!   off). The connecting side makes one sealed
//!   `memfd` (a header page and two 8 KiB rings, one per direction, each
//!   written by one side only, with head and tail counters) and passes it
//!   over the endpoint's Unix socket like the allocations' descriptors.
//!   Each endpoint has **one progress thread** for all such connections: it
//!   polls their rings and handles the frames as the control socket's
//!   reader does; it starts the initiator's queued transfers once the peer
//!   posted a receive (the calling thread starts them itself when it can,
//!   taking the peer's posted receives off the ring first: no hand-off to
//!   a worker) and finds finished copies by querying an
//!   event recorded after each ([`Event::query`](crate::runtime::Event::query)),
//!   not by a thread blocked in the stream's synchronisation. It polls
//!   back to back, yielding the core between passes, for 2 ms after
//!   anything happened (and while copies are in flight), then naps 100 µs
//!   between passes, 1 ms after 20 ms idle; a call on the endpoint wakes
//!   it. A waiter polls its transfer's done flag for 20 µs before sleeping
//!   on it. Nothing else changes: the same frames, the same data sockets
//!   for regions that are not shareable, the same errors. The control
//!   socket stays open and silent: its end is how a dead peer shows (the
//!   frames the peer left on its ring are handled first, its goodbye
//!   among them). Every counter and length read from the page is checked:
//!   a corrupt page fails the connection with [`Error::RemoteError`]; a full
//!   ring holds frames back in order, nobody blocks on it.
//! * **The control socket** ([`ControlPath::Tcp`]) otherwise: other hosts,
//!   TCP forced, either side with `shm_control` off. One reader thread per
//!   connection; the initiator's worker waits for the peer's receives and
//!   queues copies, and a completer thread synchronises the copy stream.
//!
//! [`Conn::control_stats`] counts the frames each way on each path. On
//! 2 × H200 the shared-memory path sends a small message in about 15 µs,
//! the control socket in about 40 (NCCL send/recv: 14–16 µs in the same
//! run; `benches/results/2026-11-26-h200x2-moe-warps.md`); `p2p_bench
//! --control tcp|shm` compares.
//!
//! # Errors and time limits
//!
//! Nothing waits forever: connecting, accepting and every transfer are
//! bounded by [`P2pConfig`]'s timeouts ([`Error::Timeout`]). A transfer that
//! times out **fails its connection** (it may be half done; nothing may
//! land later). A peer that dies or closes fails the connection with
//! [`Error::RemoteError`], and every transfer in flight on it gets that
//! error; a closed connection refuses new transfers with
//! [`Error::InvalidUsage`].
//!
//! # Completion
//!
//! `send` completes once its bytes are copied to the peer (IPC), handed
//! to the sockets (TCP) or known in the peer's memory (RDMA); the matching
//! `recv` completes once they all landed.
//! `write` completes once the bytes are in the peer's memory; `read` once
//! they are in this side's.
//!
//! [`Error::InvalidArgument`]: crate::Error::InvalidArgument

mod link;
mod shm;
#[cfg(feature = "verbs")]
mod verbs;
#[cfg(not(feature = "verbs"))]
#[path = "verbs_off.rs"]
mod verbs;
mod wire;

/// The software model NIC and the queue-pair layer of `devcomm-gin`, for
/// tests of the verbs transport without an RDMA device
/// ([`Endpoint::with_rdma_nic`]).
#[cfg(feature = "verbs")]
#[doc(hidden)]
pub mod rdma_testing {
    pub use devcomm_gin::transport::verbs::model::{Fabric, Knobs, ModelNic};
    pub use devcomm_gin::transport::verbs::rc::RcNic;
    pub use devcomm_gin::transport::verbs::VerbsConfig;
}

use crate::error::{Error, Result};
use crate::runtime::{Device, RuntimeKind, RuntimeSelection};
use link::{lock, ConnInner, ConnParts, MrInner, Op, Shared, Work};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Settings of an [`Endpoint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pConfig {
    /// TCP data sockets per connection (1..=64): transfers are striped over them.
    pub threads: usize,
    /// Where to listen (port 0: any free port). The default, `0.0.0.0:0`,
    /// listens on every interface.
    pub bind: SocketAddr,
    /// How long [`Endpoint::connect`] may take.
    pub connect_timeout: Duration,
    /// How long [`Endpoint::accept`] waits for a peer.
    pub accept_timeout: Duration,
    /// How long a transfer may take (and a send may wait for the peer's receive).
    pub op_timeout: Duration,
    /// Use TCP even to an endpoint of the same host.
    pub force_tcp: bool,
    /// Bytes per striped piece (4 KiB ..= 64 MiB).
    pub chunk_bytes: usize,
    /// Same-host connections carry their control messages through shared
    /// memory (when both endpoints ask for it; see [`ControlPath`]), the
    /// default; `false` keeps them on the control socket.
    pub shm_control: bool,
    /// Every connection uses the RDMA (verbs) transport
    /// ([`P2pTransport::Verbs`]; the cargo feature `verbs`): the endpoint
    /// opens an RDMA device when created, and a peer must use it too.
    pub verbs: bool,
}

impl Default for P2pConfig {
    fn default() -> Self {
        P2pConfig {
            threads: 4,
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            connect_timeout: Duration::from_secs(30),
            accept_timeout: Duration::from_secs(120),
            op_timeout: Duration::from_secs(120),
            force_tcp: false,
            chunk_bytes: 1 << 20,
            shm_control: true,
            verbs: false,
        }
    }
}

/// `DEVCOMM_P2P_TRANSPORT`: `tcp` forces TCP; `verbs` RDMA
/// ([`P2pConfig::verbs`]); `auto` (or unset) picks per connection.
pub const TRANSPORT_ENV: &str = "DEVCOMM_P2P_TRANSPORT";
/// `DEVCOMM_P2P_TIMEOUT_MS`: every timeout of [`P2pConfig`], in milliseconds.
pub const TIMEOUT_ENV: &str = "DEVCOMM_P2P_TIMEOUT_MS";
/// `DEVCOMM_P2P_BIND`: the listen address (`IP` or `IP:port`).
pub const BIND_ENV: &str = "DEVCOMM_P2P_BIND";
/// `DEVCOMM_P2P_CONTROL`: `shm` or `auto` (or unset: the default) lets
/// same-host connections carry their control messages in shared memory
/// ([`P2pConfig::shm_control`]); `tcp` keeps them on the control socket.
pub const CONTROL_ENV: &str = "DEVCOMM_P2P_CONTROL";

impl P2pConfig {
    /// The defaults, overridden by [`TRANSPORT_ENV`], [`TIMEOUT_ENV`],
    /// [`BIND_ENV`] and [`CONTROL_ENV`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a value that does not parse.
    pub fn from_env() -> Result<P2pConfig> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`P2pConfig::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<P2pConfig> {
        let mut c = P2pConfig::default();
        if let Some(v) = get(TRANSPORT_ENV) {
            (c.force_tcp, c.verbs) = match v.trim().to_ascii_lowercase().as_str() {
                "tcp" => (true, false),
                "verbs" | "rdma" => (false, true),
                "" | "auto" => (false, false),
                o => {
                    return Err(Error::invalid_argument(format!(
                        "{TRANSPORT_ENV}={o:?}: expected `tcp`, `verbs` or `auto`"
                    )))
                }
            };
        }
        if let Some(v) = get(CONTROL_ENV) {
            c.shm_control = match v.trim().to_ascii_lowercase().as_str() {
                "tcp" => false,
                "" | "auto" | "shm" => true,
                o => {
                    return Err(Error::invalid_argument(format!(
                        "{CONTROL_ENV}={o:?}: expected `shm`, `tcp` or `auto`"
                    )))
                }
            };
        }
        if let Some(v) = get(TIMEOUT_ENV) {
            let ms: u64 = v.trim().parse().ok().filter(|&m| m > 0).ok_or_else(|| {
                Error::invalid_argument(format!("{TIMEOUT_ENV}={v:?}: expected positive milliseconds"))
            })?;
            c = c.with_timeouts(Duration::from_millis(ms));
        }
        if let Some(v) = get(BIND_ENV) {
            let v = v.trim();
            c.bind = match (v.parse::<SocketAddr>(), v.parse::<IpAddr>()) {
                (Ok(a), _) => a,
                (_, Ok(ip)) => SocketAddr::new(ip, 0),
                _ => return Err(Error::invalid_argument(format!("{BIND_ENV}={v:?}: expected IP or IP:port"))),
            };
        }
        Ok(c)
    }

    /// The same with `threads` data sockets per connection.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// The same with every timeout set to `t`.
    pub fn with_timeouts(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self.accept_timeout = t;
        self.op_timeout = t;
        self
    }

    /// The same listening on `bind`.
    pub fn with_bind(mut self, bind: SocketAddr) -> Self {
        self.bind = bind;
        self
    }

    /// The same, forcing TCP (or not) even on one host.
    pub fn with_force_tcp(mut self, force: bool) -> Self {
        self.force_tcp = force;
        self
    }

    /// The same, using the RDMA (verbs) transport for every connection (or not).
    pub fn with_verbs(mut self, on: bool) -> Self {
        self.verbs = on;
        self
    }

    /// The same, letting same-host connections use the shared-memory
    /// control path (or not: [`ControlPath::Tcp`]).
    pub fn with_shm_control(mut self, on: bool) -> Self {
        self.shm_control = on;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::invalid_argument(format!("P2pConfig: {m}")));
        if !(1..=64).contains(&self.threads) {
            return bad(format!("threads = {}: expected 1 ..= 64", self.threads));
        }
        if self.verbs && self.force_tcp {
            return bad("verbs and force_tcp both set: choose one transport".into());
        }
        if !(4096..=64 << 20).contains(&self.chunk_bytes) {
            return bad(format!("chunk_bytes = {}: expected 4 KiB ..= 64 MiB", self.chunk_bytes));
        }
        for (n, t) in [
            ("connect_timeout", self.connect_timeout),
            ("accept_timeout", self.accept_timeout),
            ("op_timeout", self.op_timeout),
        ] {
            if t.is_zero() {
                return bad(format!("{n} is zero"));
            }
        }
        Ok(())
    }
}

/// How a connection moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum P2pTransport {
    /// Same host: peers' shareable memory mapped here, copies on the copy
    /// engine (regions not in shareable memory go over the TCP sockets).
    Ipc,
    /// TCP sockets, striped.
    Tcp,
    /// RDMA: one reliable-connected queue pair, RDMA WRITE and READ (cargo
    /// feature `verbs`, [`P2pConfig::verbs`] on both endpoints).
    Verbs,
}

/// How a connection's control messages travel (clear-to-send, done, write
/// acknowledgements, descriptor requests): [`Conn::control_path`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlPath {
    /// Frames on the connection's TCP control socket, read by a thread of
    /// the connection.
    Tcp,
    /// Same host: two rings in a page of shared memory (a sealed `memfd`
    /// both processes map), polled by the endpoint's progress thread. The
    /// control socket stays open to notice a peer that dies.
    SharedMemory,
}

/// Control frames a connection sent and received, per path
/// ([`Conn::control_stats`]): the handshake's frames are not counted,
/// except the acceptor's "ready", which always takes the socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ControlStats {
    /// Frames put on the shared-memory ring.
    pub shm_sent: u64,
    /// Frames taken from the peer's shared-memory ring.
    pub shm_received: u64,
    /// Frames written to the control socket.
    pub tcp_sent: u64,
    /// Frames read from the control socket.
    pub tcp_received: u64,
}

/// A registered memory region ([`Endpoint::reg`], [`Endpoint::reg_symmetric`]).
/// Dropping it deregisters it: it waits for the transfers touching it at
/// that moment (a piece on a socket, copies queued on the copy engine), and
/// later transfers naming it fail.
#[doc(alias = "mr_id")]
pub struct Mr {
    inner: Arc<MrInner>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("id", &self.inner.id)
            .field("addr", &format_args!("{:#x}", self.inner.addr))
            .field("len", &self.inner.len)
            .field("host", &self.inner.host)
            .field("shareable", &self.inner.alloc.is_some())
            .finish()
    }
}

impl Mr {
    /// The region's id at its endpoint.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Address of byte 0.
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the region has no bytes (never: registration refuses that).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Whether the region lies in host memory (else device memory).
    pub fn is_host(&self) -> bool {
        self.inner.host
    }

    /// Whether a same-host peer can map the region (it lies in a
    /// [`SymmetricMemory`](crate::SymmetricMemory) allocation): transfers
    /// with it then run on the copy engine.
    pub fn is_shareable(&self) -> bool {
        self.inner.alloc.is_some()
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.shared.mrs.write().unwrap_or_else(|p| p.into_inner()).remove(&self.inner.id);
        self.inner.retire();
        // No transfer uses it now: the NIC may forget it.
        if let (Some(r), Some(k)) = (&self.shared.rdma, self.inner.rdma_keys) {
            r.dereg(k);
        }
    }
}

/// A span of a peer's registered region that this side may write and read
/// one-sidedly: made by [`Endpoint::advertise`] on the peer, shipped by the
/// application ([`RemoteRegion::to_bytes`]), used with [`Endpoint::write`]
/// and [`Endpoint::read`] on a connection to that peer.
#[doc(alias = "FifoItem")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    endpoint: u128,
    pub(crate) mr_id: u64,
    addr: u64,
    len: u64,
    /// The region's RDMA remote key, when the advertising endpoint uses
    /// the verbs transport.
    rkey: Option<u32>,
}

/// The descriptor's magic: 7 bytes, then the format's version byte.
const REGION_MAGIC: [u8; 7] = *b"DCP2PRG";
/// Version 0: 48 bytes, no RDMA key (what endpoints without the verbs
/// transport write, and all that earlier builds read).
const REGION_BYTES: usize = 48;
/// Version 2: 56 bytes, the v0 fields then the RDMA key and 4 bytes of flags (bit 0: key present).
const REGION_V2: u8 = 2;
const REGION_V2_BYTES: usize = 56;

impl RemoteRegion {
    /// The advertised address on the peer.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The advertised length.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The RDMA remote key of the region, when the advertising endpoint
    /// uses the verbs transport (it grants the whole registered region,
    /// as any RDMA key does).
    pub fn rkey(&self) -> Option<u32> {
        self.rkey
    }

    /// The key a one-sided RDMA transfer names.
    pub(crate) fn rdma_key(&self) -> Result<u32> {
        self.rkey.ok_or_else(|| {
            Error::invalid_argument(
                "the remote region carries no RDMA key (advertised by an endpoint without the verbs transport, \
                 or shipped in the 48-byte form that has none)",
            )
        })
    }

    /// The descriptor as bytes, to ship to the initiator: 48 (format
    /// version 0) without an RDMA key, 56 (version 2) with one.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REGION_V2_BYTES);
        b.extend_from_slice(&REGION_MAGIC);
        b.push(if self.rkey.is_some() { REGION_V2 } else { 0 });
        b.extend_from_slice(&self.endpoint.to_le_bytes());
        b.extend_from_slice(&self.mr_id.to_le_bytes());
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        if let Some(k) = self.rkey {
            b.extend_from_slice(&k.to_le_bytes());
            b.extend_from_slice(&1u32.to_le_bytes());
        }
        b
    }

    /// Parses [`RemoteRegion::to_bytes`]'s output (either version).
    ///
    /// Errors: [`Error::InvalidArgument`] for anything else: another
    /// length or magic, an unknown version, unknown flags.
    pub fn from_bytes(b: &[u8]) -> Result<RemoteRegion> {
        let version = match b.get(..8) {
            Some(h) if h[..7] == REGION_MAGIC => h[7],
            _ => {
                return Err(Error::invalid_argument(format!(
                    "not a RemoteRegion descriptor ({} bytes; expected {REGION_BYTES} or {REGION_V2_BYTES} starting \
                     with {REGION_MAGIC:?})",
                    b.len()
                )))
            }
        };
        let want = match version {
            0 => REGION_BYTES,
            REGION_V2 => REGION_V2_BYTES,
            v => {
                return Err(Error::invalid_argument(format!(
                    "RemoteRegion descriptor of format version {v}; this build reads versions 0 and {REGION_V2}"
                )))
            }
        };
        if b.len() != want {
            return Err(Error::invalid_argument(format!(
                "RemoteRegion descriptor of version {version} has {} bytes, expected {want}",
                b.len()
            )));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let rkey = match version {
            0 => None,
            _ if u32_at(52) == 1 => Some(u32_at(48)),
            _ => {
                return Err(Error::invalid_argument(format!(
                    "RemoteRegion descriptor with unknown flags {:#x}",
                    u32_at(52)
                )))
            }
        };
        Ok(RemoteRegion {
            endpoint: u128::from_le_bytes(b[8..24].try_into().unwrap_or([0; 16])),
            mr_id: u64_at(24),
            addr: u64_at(32),
            len: u64_at(40),
            rkey,
        })
    }
}

/// A transfer started with a `*_async` call, for [`Endpoint::poll_async`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[doc(alias = "transfer_id")]
pub struct TransferId(u64);

impl TransferId {
    /// The id as a number.
    pub fn get(&self) -> u64 {
        self.0
    }
}

/// One direction of transfers between two endpoints (see the [module docs](self)).
/// Cheap to clone; closed by [`Endpoint::close`] or when the endpoint drops.
#[doc(alias = "conn_id")]
#[derive(Clone)]
pub struct Conn {
    inner: Arc<ConnInner>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.inner.id)
            .field("initiator", &self.inner.initiator)
            .field("peer", &self.inner.peer_addr)
            .field("remote_gpu", &self.inner.remote_gpu)
            .field("transport", &self.transport())
            .field("control", &self.control_path())
            .finish()
    }
}

const CONN_MAGIC: [u8; 8] = *b"DCP2PCN\0";

/// What [`Conn::metadata`] encodes, parsed back ([`ConnMetadata::from_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnMetadata {
    /// The connection's id at the endpoint that made the bytes.
    pub id: u64,
    /// Whether that side initiates transfers (it connected).
    pub initiator: bool,
    /// The peer's address as that side sees it.
    pub peer_addr: SocketAddr,
    /// The peer's GPU.
    pub remote_gpu: usize,
    /// The transport.
    pub transport: P2pTransport,
    /// Data sockets.
    pub threads: usize,
}

impl ConnMetadata {
    /// Parses [`Conn::metadata`]'s bytes.
    ///
    /// Errors: [`Error::InvalidArgument`] for anything else.
    pub fn from_bytes(b: &[u8]) -> Result<ConnMetadata> {
        if b.len() != 48 || b[..8] != CONN_MAGIC {
            return Err(Error::invalid_argument("not a devcomm point-to-point connection's metadata"));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[16..32]);
        let ip = std::net::Ipv6Addr::from(ip);
        let ip = ip.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(ip));
        let port = u16::from_le_bytes([b[32], b[33]]);
        Ok(ConnMetadata {
            id: u64_at(8),
            initiator: b[34] != 0,
            transport: match b[35] {
                1 => P2pTransport::Ipc,
                2 => P2pTransport::Verbs,
                _ => P2pTransport::Tcp,
            },
            peer_addr: SocketAddr::new(ip, port),
            remote_gpu: u32::from_le_bytes([b[36], b[37], b[38], b[39]]) as usize,
            threads: u64_at(40) as usize,
        })
    }
}

impl Conn {
    /// The connection's id at this endpoint.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The peer's address (for an accepted connection, where it connected from).
    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.peer_addr
    }

    /// The GPU the peer's endpoint serves.
    pub fn remote_gpu(&self) -> usize {
        self.inner.remote_gpu
    }

    /// Whether this side initiates transfers (it connected) or receives (it accepted).
    pub fn is_initiator(&self) -> bool {
        self.inner.initiator
    }

    /// How the connection moves bytes.
    pub fn transport(&self) -> P2pTransport {
        if self.inner.rdma.is_some() {
            P2pTransport::Verbs
        } else if self.inner.ipc {
            P2pTransport::Ipc
        } else {
            P2pTransport::Tcp
        }
    }

    /// The RDMA device an RDMA (verbs) connection uses; `None` for others.
    pub fn rdma_device(&self) -> Option<String> {
        self.inner.rdma.as_ref().map(|r| r.device())
    }

    /// How the connection's control messages travel: through shared
    /// memory between endpoints of one host that both allow it
    /// ([`P2pConfig::shm_control`]) and use the same-host transport, else
    /// over the control socket.
    pub fn control_path(&self) -> ControlPath {
        self.inner.control_path()
    }

    /// How many control frames this side sent and received on each path
    /// so far.
    pub fn control_stats(&self) -> ControlStats {
        self.inner.control_stats()
    }

    /// The connection's error once it failed or closed (`None` while usable).
    pub fn error(&self) -> Option<Error> {
        self.inner.error()
    }

    /// The connection's metadata as 48 bytes, for out-of-band exchange
    /// ([`ConnMetadata::from_bytes`] reads them).
    #[doc(alias = "get_metadata")]
    pub fn metadata(&self) -> Vec<u8> {
        let c = &self.inner;
        let mut b = Vec::with_capacity(48);
        b.extend_from_slice(&CONN_MAGIC);
        b.extend_from_slice(&c.id.to_le_bytes());
        let ip = match c.peer_addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        b.extend_from_slice(&ip.octets());
        b.extend_from_slice(&c.peer_addr.port().to_le_bytes());
        b.push(u8::from(c.initiator));
        b.push(match (c.rdma.is_some(), c.ipc) {
            (true, _) => 2,
            (false, true) => 1,
            (false, false) => 0,
        });
        b.extend_from_slice(&(c.remote_gpu as u32).to_le_bytes());
        b.extend_from_slice(&(c.threads as u64).to_le_bytes());
        b
    }
}

/// A connection whose control socket is accepted, waiting for its data sockets.
struct Pending {
    control: TcpStream,
    nonce: u64,
    peer_token: u128,
    remote_gpu: usize,
    peer: SocketAddr,
    ipc: bool,
    /// Both sides allow the shared-memory control path.
    shm: bool,
    /// The connector said it sent the control page.
    shm_offered: bool,
    /// Both sides use the RDMA (verbs) transport.
    verbs: bool,
    stripes: Vec<Option<TcpStream>>,
    since: Instant,
}

struct EpInner {
    shared: Arc<Shared>,
    gpu: usize,
    addr: SocketAddr,
    next_id: AtomicU64,
    conns: Mutex<Vec<Arc<ConnInner>>>,
    pending: Mutex<HashMap<u64, Pending>>,
    accepted: Mutex<VecDeque<(SocketAddr, usize, Arc<ConnInner>)>>,
    accepted_cv: Condvar,
    transfers: Mutex<HashMap<u64, Arc<Op>>>,
    rejections: Mutex<Vec<Error>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A point-to-point endpoint on one GPU (see the [module docs](self)).
#[doc(alias = "uccl_p2p")]
pub struct Endpoint {
    ep: Arc<EpInner>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("gpu", &self.ep.gpu).field("addr", &self.ep.addr).finish()
    }
}

/// A stable id of this host: its boot id and host name.
fn host_id() -> u128 {
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let name = std::fs::read("/proc/sys/kernel/hostname").unwrap_or_default();
    let bytes: Vec<u8> = boot.into_iter().chain([0]).chain(name).collect();
    let lo = crate::bootstrap::fnv1a64(0x5032_5031, &bytes);
    let hi = crate::bootstrap::fnv1a64(0x7032_7031_0000_0001, &bytes);
    ((hi as u128) << 64) | lo as u128
}

impl Endpoint {
    /// An endpoint on GPU `local_gpu` (of the runtime `DEVCOMM_RUNTIME`
    /// selects) with `threads` data sockets per connection, the rest of
    /// its settings from [`P2pConfig::from_env`].
    ///
    /// Errors: as [`Device::open`] and [`Endpoint::with_config`].
    pub fn new(local_gpu: usize, threads: usize) -> Result<Endpoint> {
        let dev = Device::open(RuntimeSelection::from_env()?, local_gpu)?;
        Endpoint::with_config(&dev, P2pConfig::from_env()?.with_threads(threads))
    }

    /// An endpoint on `device`, listening on `config.bind`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad config;
    /// [`Error::SystemError`] when the port cannot be bound;
    /// [`Error::InvalidUsage`] when [`P2pConfig::verbs`] is set and there
    /// is no RDMA transport: a build without the `verbs` feature, or no
    /// libibverbs, device or active port (the message names which).
    pub fn with_config(device: &Device, config: P2pConfig) -> Result<Endpoint> {
        config.validate()?;
        let rdma = match config.verbs {
            false => None,
            #[cfg(feature = "verbs")]
            true => Some(verbs::Rdma::open()?),
            #[cfg(not(feature = "verbs"))]
            true => {
                return Err(Error::invalid_usage(
                    "P2pConfig::verbs (DEVCOMM_P2P_TRANSPORT=verbs): this build of devcomm has no RDMA transport \
                     (cargo feature `verbs`)",
                ))
            }
        };
        Endpoint::start(device, config, rdma)
    }

    /// An endpoint whose connections all use the RDMA (verbs) transport on
    /// `nic` (the software model NIC in tests: `rdma_testing`), with
    /// `verbs` (device settings) for its queue pairs.
    #[cfg(feature = "verbs")]
    #[doc(hidden)]
    pub fn with_rdma_nic(
        device: &Device,
        config: P2pConfig,
        nic: Box<dyn rdma_testing::RcNic>,
        verbs: rdma_testing::VerbsConfig,
    ) -> Result<Endpoint> {
        let config = config.with_verbs(true);
        config.validate()?;
        Endpoint::start(device, config, Some(verbs::Rdma::with_nic(nic, verbs)?))
    }

    fn start(device: &Device, config: P2pConfig, rdma: Option<Arc<verbs::Rdma>>) -> Result<Endpoint> {
        let listener =
            TcpListener::bind(config.bind).map_err(|e| Error::system(format!("binding {}", config.bind), e))?;
        let addr = listener.local_addr().map_err(|e| Error::system("local_addr", e))?;
        listener.set_nonblocking(true).map_err(|e| Error::system("making a socket non-blocking", e))?;
        let token: u128 = rand::random();
        let unix = crate::window::fd_passing::bind(&link::unix_name(token))?;
        let shared = Arc::new(Shared {
            device: device.clone(),
            config,
            token,
            host_id: host_id(),
            mrs: RwLock::new(HashMap::new()),
            fds: Mutex::new(HashMap::new()),
            fds_cv: Condvar::new(),
            shutdown: Arc::new(AtomicBool::new(false)),
            progress: link::Progress::default(),
            rdma,
        });
        let ep = Arc::new(EpInner {
            shared: shared.clone(),
            gpu: device.ordinal(),
            addr,
            next_id: AtomicU64::new(1),
            conns: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            accepted: Mutex::new(VecDeque::new()),
            accepted_cv: Condvar::new(),
            transfers: Mutex::new(HashMap::new()),
            rejections: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let e2 = ep.clone();
        let acceptor = std::thread::Builder::new()
            .name("p2p-accept".into())
            .spawn(move || accept_loop(e2, listener))
            .map_err(|e| Error::system("spawning a thread", e))?;
        let s2 = shared.clone();
        let fds = std::thread::Builder::new()
            .name("p2p-fds".into())
            .spawn(move || fd_loop(s2, unix))
            .map_err(|e| Error::system("spawning a thread", e))?;
        let s2 = shared.clone();
        let progress = std::thread::Builder::new()
            .name("p2p-progress".into())
            .spawn(move || link::progress_loop(s2))
            .map_err(|e| Error::system("spawning a thread", e))?;
        let _ = shared.progress.thread.set(progress.thread().clone());
        *lock(&ep.threads) = vec![acceptor, fds, progress];
        #[cfg(feature = "verbs")]
        if let Some(r) = &shared.rdma {
            lock(&ep.threads).push(r.start(shared.shutdown.clone())?);
        }
        Ok(Endpoint { ep })
    }

    /// The address the endpoint listens on (with `0.0.0.0` when it listens
    /// on every interface: peers use one of the host's addresses and this port).
    pub fn addr(&self) -> SocketAddr {
        self.ep.addr
    }

    /// The device the endpoint serves.
    pub fn device(&self) -> &Device {
        &self.ep.shared.device
    }

    /// The endpoint's settings.
    pub fn config(&self) -> &P2pConfig {
        &self.ep.shared.config
    }

    /// Connections refused at the listening port so far (garbage, a wrong
    /// version, a wrong GPU, a data socket for no connection), oldest first
    /// (the last 64).
    pub fn rejections(&self) -> Vec<Error> {
        lock(&self.ep.rejections).clone()
    }

    /// Connects to the endpoint at `addr` that serves GPU `remote_gpu`: the
    /// connection carries transfers from here to there (see the [module docs](self)).
    ///
    /// Errors: [`Error::RemoteError`] when nobody listens there, it is not a
    /// devcomm endpoint, or it refuses; [`Error::InvalidArgument`] when it
    /// serves another GPU; [`Error::Timeout`] after `connect_timeout`.
    pub fn connect(&self, addr: impl ToSocketAddrs, remote_gpu: usize) -> Result<Conn> {
        let sh = &self.ep.shared;
        let to = sh.config.connect_timeout;
        let addr = addr
            .to_socket_addrs()
            .map_err(|e| Error::invalid_argument(format!("connect: bad address: {e}")))?
            .next()
            .ok_or_else(|| Error::invalid_argument("connect: the address resolves to nothing"))?;
        let what = format!("connecting to the point-to-point endpoint at {addr}");
        let open = |what: &str| -> Result<TcpStream> {
            let s = TcpStream::connect_timeout(&addr, to).map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => Error::remote(format!("{what}: nobody listens there")),
                _ => wire::io_err(what, e),
            })?;
            s.set_read_timeout(Some(to)).map_err(|e| Error::system(what, e))?;
            s.set_write_timeout(Some(to)).map_err(|e| Error::system(what, e))?;
            s.set_nodelay(true).map_err(|e| Error::system(what, e))?;
            Ok(s)
        };
        let mut control = open(&what)?;
        let flags = flags(sh);
        wire::Hello {
            kind: wire::HELLO_CONTROL,
            token: sh.token,
            host_id: sh.host_id,
            gpu: self.ep.gpu as u32,
            want_gpu: remote_gpu as u32,
            threads: sh.config.threads as u32,
            flags,
            ..Default::default()
        }
        .write_to(&mut control)
        .map_err(|e| e.context(&what))?;
        let a = wire::Hello::read_from(&mut control).map_err(|e| e.context(&what))?;
        if a.kind != wire::HELLO_ANSWER {
            return Err(Error::remote(format!("{what}: the peer did not answer the hello")));
        }
        match a.status {
            wire::STATUS_OK => {}
            wire::STATUS_WRONG_GPU => return Err(Error::invalid_argument(format!("{what}: {}", a.message))),
            wire::STATUS_TRANSPORT => return Err(Error::invalid_usage(format!("{what}: {}", a.message))),
            _ => return Err(Error::remote(format!("{what}: refused: {}", a.message))),
        }
        if sh.rdma.is_some() && a.flags & wire::FLAG_VERBS == 0 {
            return Err(Error::invalid_usage(format!("{what}: {}", transport_mismatch(true))));
        }
        // RDMA: this side's queue pair record goes first; the peer's comes
        // once every data socket is in.
        let qp = match &sh.rdma {
            Some(r) => {
                let qp = r.new_qp()?;
                control.write_all(&qp.record()).map_err(|e| wire::io_err(&what, e))?;
                Some(qp)
            }
            None => None,
        };
        if a.threads == 0 || a.threads > 64 {
            return Err(Error::remote(format!("{what}: the peer asked for {} data sockets", a.threads)));
        }
        let ipc = same_host(sh, a.host_id, a.flags);
        // Request numbers of a connection start at 1: 0 is its control page.
        let page = match shm_control(sh, ipc, a.flags) {
            true => match offer_page(sh, a.token, a.nonce) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::info!(error = %e, "p2p: no shared control page; control frames take the socket");
                    None
                }
            },
            false => None,
        };
        let mut data = Vec::new();
        for i in 0..a.threads {
            let mut s = open(&what)?;
            wire::Hello {
                kind: wire::HELLO_DATA,
                token: sh.token,
                host_id: sh.host_id,
                conn_id: a.conn_id,
                nonce: a.nonce,
                stripe: i,
                flags: if page.is_some() { wire::FLAG_SHM } else { 0 },
                ..Default::default()
            }
            .write_to(&mut s)
            .map_err(|e| e.context(&what))?;
            data.push(s);
        }
        let rdma = match qp {
            Some(qp) => {
                let mut rec = [0u8; 48];
                control.read_exact(&mut rec).map_err(|e| wire::io_err(&format!("{what}: the queue pair record"), e))?;
                Some(qp.connect(&rec).map_err(|e| e.context(&what))?)
            }
            None => None,
        };
        let ready = wire::Control::read_from(&mut control).map_err(|e| e.context(&what))?;
        if ready.kind != wire::C_READY {
            return Err(Error::remote(format!("{what}: expected the peer's ready, got frame {}", ready.kind)));
        }
        let page = page.filter(|_| ready.a == 1);
        let conn = ConnInner::start(
            sh.clone(),
            ConnParts {
                id: self.ep.next_id.fetch_add(1, Ordering::Relaxed),
                initiator: true,
                peer_addr: addr,
                remote_gpu: a.gpu as usize,
                peer_token: a.token,
                nonce: a.nonce,
                ipc,
                control,
                data,
                shm: page,
                rdma,
            },
        )?;
        lock(&self.ep.conns).push(conn.clone());
        Ok(Conn { inner: conn })
    }

    /// Waits (up to `accept_timeout`) for a peer to connect; returns its
    /// address, its GPU and the connection, on which this side receives.
    ///
    /// Errors: [`Error::Timeout`] when nobody connected in time.
    pub fn accept(&self) -> Result<(SocketAddr, usize, Conn)> {
        self.accept_timeout(self.ep.shared.config.accept_timeout)
    }

    /// [`Endpoint::accept`] with its own time limit.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<(SocketAddr, usize, Conn)> {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.ep.accepted);
        loop {
            if let Some((a, g, c)) = q.pop_front() {
                return Ok((a, g, Conn { inner: c }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "accept: no peer connected to {} within {timeout:?}",
                    self.ep.addr
                )));
            }
            q = self.ep.accepted_cv.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Registers `len` bytes at `ptr`: device memory of this endpoint's GPU
    /// or host memory. A span inside a [`SymmetricMemory`](crate::SymmetricMemory)
    /// allocation is shareable (copy engine to same-host peers).
    ///
    /// Errors: [`Error::InvalidArgument`] for a null pointer, zero length,
    /// a span that wraps, or memory of another GPU.
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` is memory this process may read and write (device
    /// memory of this endpoint's device, or host memory) and stays so until
    /// the returned [`Mr`] is dropped; while a transfer into it is in
    /// flight, nobody else accesses those bytes.
    pub unsafe fn reg(&self, ptr: u64, len: usize) -> Result<Mr> {
        if ptr == 0 || len == 0 || ptr.checked_add(len as u64).is_none() {
            return Err(Error::invalid_argument(format!("reg: {len} bytes at {ptr:#x} is not a region")));
        }
        let sh = &self.ep.shared;
        let host = match sh.device.pointer_device(ptr)? {
            None => true,
            Some(o) if o == self.ep.gpu => false,
            Some(o) => {
                return Err(Error::invalid_argument(format!(
                    "reg: {ptr:#x} is memory of GPU {o}, this endpoint serves GPU {}",
                    self.ep.gpu
                )))
            }
        };
        let alloc = if host { None } else { crate::memory::find_shareable(ptr, len) };
        self.add_mr(ptr, len, host, alloc)
    }

    /// Registers a whole [`SymmetricMemory`](crate::SymmetricMemory)
    /// allocation (shareable: same-host peers copy on the copy engine). The
    /// region keeps the memory alive.
    ///
    /// Errors: [`Error::InvalidArgument`] when the memory lives on another
    /// device than the endpoint's.
    pub fn reg_symmetric(&self, mem: &crate::SymmetricMemory) -> Result<Mr> {
        if mem.device().kind() != self.ep.shared.device.kind() || mem.device().ordinal() != self.ep.gpu {
            return Err(Error::invalid_argument(format!(
                "reg_symmetric: the memory is on {} {}, this endpoint serves {} {}",
                mem.device().kind(),
                mem.device().ordinal(),
                self.ep.shared.device.kind(),
                self.ep.gpu
            )));
        }
        self.add_mr(mem.device_addr(), mem.size(), false, Some(mem.alloc.clone()))
    }

    /// Registers a region (with the RDMA device too, on an endpoint that
    /// uses the verbs transport: `Err` if the device refuses).
    fn add_mr(
        &self,
        addr: u64,
        len: usize,
        host: bool,
        alloc: Option<Arc<crate::runtime::ShareableAlloc>>,
    ) -> Result<Mr> {
        let sh = &self.ep.shared;
        let rdma_keys = match &sh.rdma {
            // SAFETY: `reg`'s contract (or the symmetric memory `alloc`
            // keeps alive): the span stays allocated while the `Mr` lives,
            // and its drop deregisters it once no transfer uses it.
            Some(r) => Some(unsafe { r.reg(&sh.device, addr, len, host) }?),
            None => None,
        };
        let id = self.ep.next_id.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(MrInner {
            id,
            addr,
            len,
            host,
            alloc,
            live: RwLock::new(true),
            advertised: AtomicBool::new(false),
            posted: AtomicBool::new(false),
            rdma_keys,
            busy: Mutex::new(0),
            idle: Condvar::new(),
        });
        sh.mrs.write().unwrap_or_else(|p| p.into_inner()).insert(id, inner.clone());
        Ok(Mr { inner, shared: sh.clone() })
    }

    /// Deregisters `mr` (the same as dropping it).
    pub fn dereg(&self, mr: Mr) {
        drop(mr);
    }

    /// A descriptor of `len` bytes at `ptr` of `mr`, for a peer to
    /// [`write`](Endpoint::write) and [`read`](Endpoint::read) over a
    /// connection it made to this endpoint. Until a region is advertised,
    /// peers cannot write or read it one-sidedly at all (the endpoint
    /// refuses); once it is, they may access all of it (as with an RDMA
    /// key), until it is dropped.
    ///
    /// Errors: [`Error::InvalidArgument`] when the span is not inside `mr`
    /// or `mr` is another endpoint's.
    pub fn advertise(&self, mr: &Mr, ptr: u64, len: usize) -> Result<RemoteRegion> {
        self.check_mr(mr, ptr, len, "advertise")?;
        mr.inner.advertised.store(true, Ordering::SeqCst);
        Ok(RemoteRegion {
            endpoint: self.ep.shared.token,
            mr_id: mr.inner.id,
            addr: ptr,
            len: len as u64,
            rkey: mr.inner.rdma_keys.map(|k| k.1),
        })
    }

    fn check_mr(&self, mr: &Mr, ptr: u64, len: usize, what: &str) -> Result<()> {
        if !Arc::ptr_eq(&mr.shared, &self.ep.shared) {
            return Err(Error::invalid_argument(format!("{what}: the memory region belongs to another endpoint")));
        }
        if !mr.inner.contains(ptr, len as u64) {
            return Err(Error::invalid_argument(format!(
                "{what}: {len} bytes at {ptr:#x} are not inside the registered region ({:#x} + {} bytes): \
                 register the memory first (Endpoint::reg)",
                mr.inner.addr, mr.inner.len
            )));
        }
        Ok(())
    }

    fn check_conn(&self, conn: &Conn, initiator: bool, what: &str) -> Result<()> {
        if !Arc::ptr_eq(&conn.inner.shared, &self.ep.shared) {
            return Err(Error::invalid_argument(format!("{what}: the connection belongs to another endpoint")));
        }
        if conn.inner.initiator != initiator {
            return Err(Error::invalid_usage(if initiator {
                format!(
                    "{what}: connection {} was accepted, so it receives; to send the other way, connect from \
                     this endpoint to the peer's",
                    conn.inner.id
                )
            } else {
                format!("{what}: connection {} was made by connect, so it sends; the peer receives", conn.inner.id)
            }));
        }
        conn.inner.check_usable()
    }

    fn track(&self, op: Arc<Op>) -> TransferId {
        let id = self.ep.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.ep.transfers).insert(id, op);
        TransferId(id)
    }

    fn submit(&self, conn: &Conn, w: impl FnOnce(Arc<Op>) -> Work) -> Result<TransferId> {
        let op = Op::new(&conn.inner);
        conn.inner.submit(w(op.clone()))?;
        Ok(self.track(op))
    }

    /// Starts sending `len` bytes at `ptr` (inside `mr`) as one message:
    /// the peer's next [`recv`](Endpoint::recv) on this connection takes it.
    ///
    /// Errors: [`Error::InvalidArgument`] for a span outside `mr`;
    /// [`Error::InvalidUsage`] on an accepted or closed connection;
    /// [`Error::RemoteError`] when the connection failed.
    pub fn send_async(&self, conn: &Conn, mr: &Mr, ptr: u64, len: usize) -> Result<TransferId> {
        self.check_conn(conn, true, "send")?;
        self.check_mr(mr, ptr, len, "send")?;
        self.submit(conn, |op| Work::Send { op, mr: mr.inner.clone(), addr: ptr, len })
    }

    /// Starts receiving the next message into `ptr .. ptr + max_len` (inside
    /// `mr`); [`poll_async`](Endpoint::poll_async) returns its length.
    ///
    /// Errors: as [`Endpoint::send_async`], for a connection that was made by `connect`.
    pub fn recv_async(&self, conn: &Conn, mr: &Mr, ptr: u64, max_len: usize) -> Result<TransferId> {
        self.check_conn(conn, false, "recv")?;
        self.check_mr(mr, ptr, max_len, "recv")?;
        let op = conn.inner.post_recv(mr.inner.clone(), ptr, max_len)?;
        Ok(self.track(op))
    }

    /// Starts writing `len` bytes at `ptr` (inside `mr`) to byte `offset` of
    /// the peer's advertised `remote` region.
    ///
    /// Errors: [`Error::InvalidArgument`] for a span outside `mr` or
    /// `remote`, or a descriptor of another endpoint than the peer; as
    /// [`Endpoint::send_async`] otherwise. The peer refusing the target (a
    /// region no longer registered) fails the transfer with its error.
    pub fn write_async(
        &self,
        conn: &Conn,
        mr: &Mr,
        ptr: u64,
        len: usize,
        remote: &RemoteRegion,
        offset: usize,
    ) -> Result<TransferId> {
        let raddr = self.check_one_sided(conn, mr, ptr, len, remote, offset, "write")?;
        self.submit(conn, |op| Work::Write { op, mr: mr.inner.clone(), addr: ptr, len, remote: *remote, raddr })
    }

    /// Starts reading `len` bytes from byte `offset` of the peer's
    /// advertised `remote` region into `ptr` (inside `mr`).
    ///
    /// Errors: as [`Endpoint::write_async`].
    pub fn read_async(
        &self,
        conn: &Conn,
        mr: &Mr,
        ptr: u64,
        len: usize,
        remote: &RemoteRegion,
        offset: usize,
    ) -> Result<TransferId> {
        let raddr = self.check_one_sided(conn, mr, ptr, len, remote, offset, "read")?;
        self.submit(conn, |op| Work::Read { op, mr: mr.inner.clone(), addr: ptr, len, remote: *remote, raddr })
    }

    #[allow(clippy::too_many_arguments)]
    fn check_one_sided(
        &self,
        conn: &Conn,
        mr: &Mr,
        ptr: u64,
        len: usize,
        remote: &RemoteRegion,
        offset: usize,
        what: &str,
    ) -> Result<u64> {
        self.check_conn(conn, true, what)?;
        self.check_mr(mr, ptr, len, what)?;
        if remote.endpoint != conn.inner.peer_token {
            return Err(Error::invalid_argument(format!(
                "{what}: the remote region was advertised by another endpoint than this connection's peer"
            )));
        }
        if (offset as u64).checked_add(len as u64).is_none_or(|end| end > remote.len) {
            return Err(Error::invalid_argument(format!(
                "{what}: {len} bytes at offset {offset} do not fit the remote region of {} bytes",
                remote.len
            )));
        }
        Ok(remote.addr + offset as u64)
    }

    /// Whether transfer `id` finished: `Ok(Some(bytes))` once it has (the
    /// bytes moved: a receive's message length), `Ok(None)` while in
    /// flight. A finished transfer is forgotten once reported.
    ///
    /// Errors: the transfer's own error (reported once); [`Error::InvalidArgument`]
    /// for an id this endpoint does not know (or already reported).
    pub fn poll_async(&self, id: TransferId) -> Result<Option<usize>> {
        let mut t = lock(&self.ep.transfers);
        let op = t.get(&id.0).ok_or_else(|| Error::invalid_argument(format!("unknown transfer id {}", id.0)))?;
        match op.poll() {
            None => Ok(None),
            Some(r) => {
                t.remove(&id.0);
                r.map(Some)
            }
        }
    }

    /// Waits (up to `op_timeout`) for transfer `id`; returns its bytes.
    ///
    /// Errors: as [`Endpoint::poll_async`]; [`Error::Timeout`], which also
    /// fails the transfer's connection.
    pub fn wait_async(&self, id: TransferId) -> Result<usize> {
        let op = lock(&self.ep.transfers)
            .get(&id.0)
            .cloned()
            .ok_or_else(|| Error::invalid_argument(format!("unknown transfer id {}", id.0)))?;
        let r = op.wait(self.ep.shared.config.op_timeout);
        lock(&self.ep.transfers).remove(&id.0);
        r
    }

    /// Sends `len` bytes at `ptr` (inside `mr`) and waits (see [`Endpoint::send_async`]).
    pub fn send(&self, conn: &Conn, mr: &Mr, ptr: u64, len: usize) -> Result<()> {
        let id = self.send_async(conn, mr, ptr, len)?;
        self.wait_async(id).map(|_| ())
    }

    /// Receives the next message into `ptr .. ptr + max_len` and waits;
    /// returns its length (see [`Endpoint::recv_async`]).
    pub fn recv(&self, conn: &Conn, mr: &Mr, ptr: u64, max_len: usize) -> Result<usize> {
        let id = self.recv_async(conn, mr, ptr, max_len)?;
        self.wait_async(id)
    }

    /// Sends each `(region, ptr, len)` as its own message, in order, as one
    /// operation: all are started, then all are waited for.
    ///
    /// Errors: as [`Endpoint::send`]; the first failure.
    pub fn sendv(&self, conn: &Conn, parts: &[(&Mr, u64, usize)]) -> Result<()> {
        let ids = parts.iter().map(|(mr, p, n)| self.send_async(conn, mr, *p, *n)).collect::<Result<Vec<_>>>()?;
        self.wait_all(ids).map(|_| ())
    }

    /// Receives one message into each `(region, ptr, max_len)`, in order, as
    /// one operation; returns each message's length.
    ///
    /// Errors: as [`Endpoint::recv`]; the first failure.
    pub fn recvv(&self, conn: &Conn, parts: &[(&Mr, u64, usize)]) -> Result<Vec<usize>> {
        let ids = parts.iter().map(|(mr, p, n)| self.recv_async(conn, mr, *p, *n)).collect::<Result<Vec<_>>>()?;
        self.wait_all(ids)
    }

    fn wait_all(&self, ids: Vec<TransferId>) -> Result<Vec<usize>> {
        let mut out = Vec::with_capacity(ids.len());
        let mut first = None;
        for id in ids {
            match self.wait_async(id) {
                Ok(n) => out.push(n),
                Err(e) => {
                    first.get_or_insert(e);
                    out.push(0);
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Writes `len` bytes at `ptr` into the peer's `remote` region at
    /// `offset` and waits until they are there (see [`Endpoint::write_async`]).
    pub fn write(
        &self,
        conn: &Conn,
        mr: &Mr,
        ptr: u64,
        len: usize,
        remote: &RemoteRegion,
        offset: usize,
    ) -> Result<()> {
        let id = self.write_async(conn, mr, ptr, len, remote, offset)?;
        self.wait_async(id).map(|_| ())
    }

    /// Reads `len` bytes from the peer's `remote` region at `offset` into
    /// `ptr` and waits (see [`Endpoint::read_async`]).
    pub fn read(&self, conn: &Conn, mr: &Mr, ptr: u64, len: usize, remote: &RemoteRegion, offset: usize) -> Result<()> {
        let id = self.read_async(conn, mr, ptr, len, remote, offset)?;
        self.wait_async(id).map(|_| ())
    }

    /// Where the peer's `remote` region is mapped into this endpoint's
    /// device, on a same-host (IPC) connection whose peer region is
    /// shareable: a device address kernels and the copy engine can use
    /// directly (stores there are the peer's memory). `None` otherwise.
    ///
    /// Errors: as [`Endpoint::write`]'s checks of the connection and descriptor.
    pub fn mapped_address(&self, conn: &Conn, remote: &RemoteRegion) -> Result<Option<u64>> {
        self.check_conn(conn, true, "mapped_address")?;
        if remote.endpoint != conn.inner.peer_token {
            return Err(Error::invalid_argument(
                "mapped_address: the remote region was advertised by another endpoint than this connection's peer",
            ));
        }
        Ok(conn.inner.mapping(remote.mr_id)?.and_then(|m| m.local(remote.addr, remote.len)))
    }

    /// Closes `conn`: the peer's transfers on it fail with
    /// [`Error::RemoteError`], this side's with [`Error::InvalidUsage`].
    pub fn close(&self, conn: &Conn) {
        conn.inner.close();
        lock(&self.ep.conns).retain(|c| !Arc::ptr_eq(c, &conn.inner));
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.ep.shared.shutdown.store(true, Ordering::SeqCst);
        self.ep.shared.progress.kick();
        for h in std::mem::take(&mut *lock(&self.ep.threads)) {
            let _ = h.join();
        }
        self.ep.shared.progress.clear();
        let conns = std::mem::take(&mut *lock(&self.ep.conns));
        for c in conns {
            c.close();
        }
        let queued: Vec<_> = lock(&self.ep.accepted).drain(..).collect();
        for (_, _, c) in queued {
            c.close();
        }
        lock(&self.ep.pending).clear();
    }
}

/// The hello flags of an endpoint.
fn flags(sh: &Shared) -> u32 {
    let mut f = 0;
    if sh.device.kind() == RuntimeKind::Cuda {
        f |= wire::FLAG_CUDA;
    }
    if sh.config.force_tcp {
        f |= wire::FLAG_FORCE_TCP;
    }
    if sh.config.shm_control {
        f |= wire::FLAG_SHM;
    }
    if sh.rdma.is_some() {
        f |= wire::FLAG_VERBS;
    }
    f
}

/// Why a connection between an endpoint that uses RDMA and one that does
/// not cannot be made (`mine`: this side uses it).
fn transport_mismatch(mine: bool) -> String {
    let (a, b) = if mine { ("this endpoint", "the peer") } else { ("the peer", "this endpoint") };
    format!(
        "{a} uses the RDMA (verbs) transport and {b} does not: start both endpoints with P2pConfig::verbs \
         (DEVCOMM_P2P_TRANSPORT=verbs) or neither"
    )
}

/// Whether a same-host (IPC) connection with a peer of `peer_flags` gets
/// the shared-memory control path.
fn shm_control(sh: &Shared, ipc: bool, peer_flags: u32) -> bool {
    ipc && sh.config.shm_control && peer_flags & wire::FLAG_SHM != 0
}

/// Waits until `deadline` for the descriptor that arrived for (connection
/// `nonce`, request `seq`).
fn take_fd(sh: &Shared, nonce: u64, seq: u64, deadline: Instant) -> Result<std::os::fd::OwnedFd> {
    let mut fds = lock(&sh.fds);
    loop {
        if let Some(m) = fds.remove(&(nonce, seq)) {
            return m.map(|(_, _, fd)| fd);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || sh.shutdown.load(Ordering::SeqCst) {
            return Err(Error::Timeout("the peer's control page did not arrive in time".into()));
        }
        fds = sh.fds_cv.wait_timeout(fds, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// The connector's side of the shared control page: made here, sent to
/// the peer's descriptor socket as request 0 of the connection.
fn offer_page(sh: &Shared, peer_token: u128, nonce: u64) -> Result<shm::ShmPage> {
    use std::os::fd::AsFd;
    let (page, fd) = shm::ShmPage::create(nonce)?;
    let header = crate::window::fd_passing::Header {
        magic: nonce as u128,
        seq: 0,
        from_rank: 0,
        alloc_size: shm::SHM_BYTES as u64,
    };
    let deadline = Instant::now() + sh.config.connect_timeout;
    crate::window::fd_passing::send_fd(&link::unix_name(peer_token), &header, fd.as_fd(), deadline, &sh.shutdown)?;
    Ok(page)
}

/// Whether a peer with `peer_host` and `peer_flags` gets a same-host (IPC) connection.
fn same_host(sh: &Shared, peer_host: u128, peer_flags: u32) -> bool {
    let mine = flags(sh);
    peer_host == sh.host_id
        && (mine & wire::FLAG_CUDA) == (peer_flags & wire::FLAG_CUDA)
        && (mine | peer_flags) & (wire::FLAG_FORCE_TCP | wire::FLAG_VERBS) == 0
}

fn reject(ep: &EpInner, e: Error) {
    tracing::debug!(error = %e, "p2p: refused a connection");
    let mut r = lock(&ep.rejections);
    if r.len() >= 64 {
        r.remove(0);
    }
    r.push(e);
}

fn accept_loop(ep: Arc<EpInner>, listener: TcpListener) {
    while !ep.shared.shutdown.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, peer)) => {
                let e2 = ep.clone();
                let r = std::thread::Builder::new().name("p2p-hello".into()).spawn(move || {
                    if let Err(e) = handshake(&e2, s, peer) {
                        reject(&e2, e.context(format!("connection from {peer}")));
                    }
                });
                if let Err(e) = r {
                    reject(&ep, Error::system("spawning a handshake thread", e));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                reject(&ep, Error::system("accept", e));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn fd_loop(sh: Arc<Shared>, listener: std::os::unix::net::UnixListener) {
    use crate::window::fd_passing::receive_one;
    while !sh.shutdown.load(Ordering::SeqCst) {
        match listener.accept() {
            // Each descriptor gets the whole op timeout to arrive (none is
            // lost to a deadline that was about to pass when it connected).
            Ok((s, _)) => match receive_one(s, Instant::now() + sh.config.op_timeout) {
                Ok((h, fd)) => {
                    lock(&sh.fds).insert((h.magic as u64, h.seq), Ok((h.from_rank, h.alloc_size as usize, fd)));
                    sh.fds_cv.notify_all();
                }
                Err(e) => tracing::debug!(error = %e, "p2p: a descriptor did not arrive"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::debug!(error = %e, "p2p: accepting a descriptor connection");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The accepting side of a new TCP connection: a control socket opens a
/// connection, a data socket joins one.
fn handshake(ep: &Arc<EpInner>, mut s: TcpStream, peer: SocketAddr) -> Result<()> {
    let sh = &ep.shared;
    let to = sh.config.connect_timeout;
    let io = |e| Error::system("configuring an accepted socket", e);
    s.set_nonblocking(false).map_err(io)?;
    s.set_read_timeout(Some(to)).map_err(io)?;
    s.set_write_timeout(Some(to)).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let h = wire::Hello::read_from(&mut s)?;
    match h.kind {
        wire::HELLO_CONTROL => {
            let mut answer = wire::Hello {
                kind: wire::HELLO_ANSWER,
                token: sh.token,
                host_id: sh.host_id,
                gpu: ep.gpu as u32,
                flags: flags(sh),
                ..Default::default()
            };
            if h.want_gpu as usize != ep.gpu {
                answer.status = wire::STATUS_WRONG_GPU;
                answer.message = format!("the endpoint at this port serves GPU {}, not GPU {}", ep.gpu, h.want_gpu);
                let _ = answer.write_to(&mut s);
                return Err(Error::invalid_argument(answer.message));
            }
            let verbs = sh.rdma.is_some();
            if verbs != (h.flags & wire::FLAG_VERBS != 0) {
                answer.status = wire::STATUS_TRANSPORT;
                answer.message = transport_mismatch(!verbs);
                let _ = answer.write_to(&mut s);
                return Err(Error::invalid_usage(transport_mismatch(verbs)));
            }
            if h.threads == 0 || h.threads > 64 {
                answer.status = wire::STATUS_REFUSED;
                answer.message = format!("{} data sockets asked for (1 ..= 64)", h.threads);
                let _ = answer.write_to(&mut s);
                return Err(Error::remote(answer.message));
            }
            // RDMA connections move no data on the sockets: one, idle, keeps
            // the handshake the same.
            let threads = if verbs { 1 } else { (h.threads as usize).min(sh.config.threads).max(1) };
            let id = ep.next_id.fetch_add(1, Ordering::Relaxed);
            let nonce: u64 = rand::random();
            answer.threads = threads as u32;
            answer.conn_id = id;
            answer.nonce = nonce;
            let ipc = same_host(sh, h.host_id, h.flags);
            let shm = shm_control(sh, ipc, h.flags);
            let mut pending = lock(&ep.pending);
            pending.retain(|_, p| {
                let live = p.since.elapsed() < to;
                if !live {
                    // Its control page, if one came, is not wanted any more.
                    lock(&sh.fds).remove(&(p.nonce, 0));
                }
                live
            });
            answer.write_to(&mut s)?;
            pending.insert(
                id,
                Pending {
                    control: s,
                    nonce,
                    peer_token: h.token,
                    remote_gpu: h.gpu as usize,
                    peer,
                    ipc,
                    shm,
                    shm_offered: false,
                    verbs,
                    stripes: (0..threads).map(|_| None).collect(),
                    since: Instant::now(),
                },
            );
            Ok(())
        }
        wire::HELLO_DATA => {
            let mut pending = lock(&ep.pending);
            let p = pending
                .get_mut(&h.conn_id)
                .filter(|p| p.nonce == h.nonce && p.peer_token == h.token)
                .ok_or_else(|| Error::remote("a data socket for no pending connection"))?;
            let slot = p
                .stripes
                .get_mut(h.stripe as usize)
                .filter(|s| s.is_none())
                .ok_or_else(|| Error::remote(format!("data socket {} is out of range or repeated", h.stripe)))?;
            *slot = Some(s);
            p.shm_offered |= h.flags & wire::FLAG_SHM != 0;
            if p.stripes.iter().any(Option::is_none) {
                return Ok(());
            }
            let p = pending.remove(&h.conn_id).ok_or_else(|| Error::internal("pending connection vanished"))?;
            drop(pending);
            // The page was sent before the data sockets opened: it is here
            // or on its way. Without it, the socket carries control frames.
            let page = match p.shm && p.shm_offered {
                true => take_fd(sh, p.nonce, 0, Instant::now() + to)
                    .and_then(|fd| shm::ShmPage::open(&fd, p.nonce))
                    .map_err(
                        |e| tracing::info!(error = %e, "p2p: no shared control page; control frames take the socket"),
                    )
                    .ok(),
                false => None,
            };
            let shm_on = page.is_some();
            let mut control = p.control;
            let rdma = match (&sh.rdma, p.verbs) {
                (Some(r), true) => {
                    // The connector's record came before its data sockets.
                    let what = format!("the queue pair record of the connection from {}", p.peer);
                    let mut rec = [0u8; 48];
                    control.read_exact(&mut rec).map_err(|e| wire::io_err(&what, e))?;
                    let qp = r.new_qp()?;
                    let mine = qp.record();
                    let rc = qp.connect(&rec).map_err(|e| e.context(&what))?;
                    control.write_all(&mine).map_err(|e| wire::io_err(&what, e))?;
                    Some(rc)
                }
                _ => None,
            };
            let parts = ConnParts {
                id: ep.next_id.fetch_add(1, Ordering::Relaxed),
                initiator: false,
                peer_addr: p.peer,
                remote_gpu: p.remote_gpu,
                peer_token: p.peer_token,
                nonce: p.nonce,
                ipc: p.ipc,
                control,
                data: p.stripes.into_iter().flatten().collect(),
                shm: page,
                rdma,
            };
            let conn = ConnInner::start(sh.clone(), parts)?;
            conn.send_control_tcp(&wire::Control::new(wire::C_READY, u64::from(shm_on), 0, 0, 0))?;
            if sh.shutdown.load(Ordering::SeqCst) {
                conn.close();
                return Ok(());
            }
            lock(&ep.conns).push(conn.clone());
            lock(&ep.accepted).push_back((p.peer, p.remote_gpu, conn));
            ep.accepted_cv.notify_all();
            Ok(())
        }
        k => Err(Error::remote(format!("a hello of kind {k} opened a connection"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_environment_and_validation() {
        let c = P2pConfig::from_lookup(|k| match k {
            TRANSPORT_ENV => Some("tcp".into()),
            TIMEOUT_ENV => Some("1500".into()),
            BIND_ENV => Some("127.0.0.1".into()),
            CONTROL_ENV => Some("tcp".into()),
            _ => None,
        })
        .unwrap();
        assert!(c.force_tcp);
        assert!(!c.shm_control && P2pConfig::default().shm_control);
        assert!(P2pConfig::from_lookup(|k| (k == CONTROL_ENV).then(|| "shm".into())).unwrap().shm_control);
        assert!(P2pConfig::from_lookup(|k| (k == CONTROL_ENV).then(|| "udp".into())).is_err());
        assert_eq!(c.op_timeout, Duration::from_millis(1500));
        assert_eq!(c.bind, "127.0.0.1:0".parse().unwrap());
        let v = P2pConfig::from_lookup(|k| (k == TRANSPORT_ENV).then(|| "verbs".into())).unwrap();
        assert!(v.verbs && !v.force_tcp);
        assert!(P2pConfig::from_lookup(|k| (k == TRANSPORT_ENV).then(|| "udp".into())).is_err());
        assert!(P2pConfig::default().with_verbs(true).with_force_tcp(true).validate().is_err());
        assert!(P2pConfig::from_lookup(|k| (k == TIMEOUT_ENV).then(|| "0".into())).is_err());
        assert!(P2pConfig::default().with_threads(0).validate().is_err());
        assert!(P2pConfig::default().with_threads(65).validate().is_err());
    }

    /// A peer that scribbles over the shared control page: the connection
    /// fails with a typed error on both sides, nothing hangs.
    #[test]
    fn a_corrupt_control_page_fails_the_connection() {
        let dev = Device::open(RuntimeSelection::Emulated, 0).unwrap();
        let cfg = P2pConfig::default()
            .with_bind("127.0.0.1:0".parse().unwrap())
            .with_timeouts(Duration::from_secs(20))
            .with_shm_control(true);
        let (server, client) =
            (Endpoint::with_config(&dev, cfg.clone()).unwrap(), Endpoint::with_config(&dev, cfg).unwrap());
        let mem = crate::SymmetricMemory::alloc(&dev, 4096).unwrap();
        let mr = server.reg_symmetric(&mem).unwrap();
        let addr = server.addr();
        std::thread::scope(|s| {
            let acc = s.spawn(|| server.accept().unwrap().2);
            let conn = client.connect(addr, 0).unwrap();
            let sconn = acc.join().unwrap();
            assert_eq!(
                (conn.control_path(), sconn.control_path()),
                (ControlPath::SharedMemory, ControlPath::SharedMemory)
            );
            let id = server.recv_async(&sconn, &mr, mem.device_addr(), 4096).unwrap();
            // The connector's ring claims more than a ring holds.
            let page = conn.inner.shm_page().unwrap();
            page.scribble(shm::tail_at(0), 1 << 40);
            let t = Instant::now();
            let e = server.wait_async(id).unwrap_err();
            assert!(matches!(&e, Error::RemoteError(m) if m.contains("corrupt")), "{e:?}");
            while conn.error().is_none() {
                assert!(t.elapsed() < Duration::from_secs(10), "the connector never noticed");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(t.elapsed() < Duration::from_secs(10));
        });
    }

    #[test]
    fn descriptors_round_trip_and_garbage_is_refused() {
        let r = RemoteRegion { endpoint: 0xabc, mr_id: 7, addr: 0x7000_0000, len: 12345, rkey: None };
        assert_eq!(r.to_bytes().len(), 48);
        assert_eq!(&r.to_bytes()[..8], b"DCP2PRG\0"); // the format of builds before the verbs transport
        assert_eq!(RemoteRegion::from_bytes(&r.to_bytes()).unwrap(), r);
        // With an RDMA key: version 2, 56 bytes, round trip.
        let k = RemoteRegion { rkey: Some(0xdead_beef), ..r };
        let kb = k.to_bytes();
        assert_eq!((kb.len(), kb[7]), (56, 2));
        assert_eq!(RemoteRegion::from_bytes(&kb).unwrap(), k);
        assert_eq!(k.rdma_key().unwrap(), 0xdead_beef);
        assert!(matches!(r.rdma_key(), Err(Error::InvalidArgument(m)) if m.contains("no RDMA key")));
        // A version-2 body cut to 48 bytes, a version-0 one padded, an
        // unknown version, unknown flags: refused.
        assert!(RemoteRegion::from_bytes(&kb[..48]).is_err());
        let mut padded = r.to_bytes();
        padded.extend_from_slice(&[0; 8]);
        assert!(RemoteRegion::from_bytes(&padded).is_err());
        let mut v3 = kb.clone();
        v3[7] = 3;
        assert!(matches!(RemoteRegion::from_bytes(&v3), Err(Error::InvalidArgument(m)) if m.contains("version 3")));
        let mut flags = kb.clone();
        flags[52] = 3;
        assert!(RemoteRegion::from_bytes(&flags).is_err());
        assert!(matches!(RemoteRegion::from_bytes(&[1, 2, 3]), Err(Error::InvalidArgument(_))));
        let mut b = r.to_bytes();
        b[0] ^= 1;
        assert!(RemoteRegion::from_bytes(&b).is_err());
        assert!(ConnMetadata::from_bytes(&[0u8; 48]).is_err());
    }
}
