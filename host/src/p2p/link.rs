//! One connection's machinery: the control socket, the striped data
//! sockets with a writer and a reader thread each, the initiator's worker
//! thread that runs transfers in order, and the tables of transfers in
//! flight (see the [module docs](super) for the protocol).
//!
//! A same-host connection with the shared-memory control path (`shm`) has
//! no completer and its worker only fetches peers' descriptors: its control
//! frames go through the rings of [`super::shm`], and the endpoint's
//! progress thread ([`progress_loop`]) reads them, runs the initiator's
//! queue of transfers (a caller runs it too, right after submitting) and
//! finds finished copies by querying an event recorded after each.
//!
//! `unsafe` invariants: memory of a region is only touched while its
//! `live` read lock is held and says `true`; dropping the region (`Mr`)
//! takes the write lock, so once the drop returns no thread touches it.
//! Regions registered with `Endpoint::reg` are valid while registered (the
//! caller's promise); the others own their memory.

use super::shm::{self, Outbox, RingRx, RingTx, ShmPage};
use super::verbs;
use super::wire::{self, Control, DataHeader};
use super::{ControlPath, ControlStats, P2pConfig, RemoteRegion};
use crate::error::{Error, Result};
use crate::runtime::{AddressRange, Device, Event, HostMappedBuffer, ShareableAlloc, Stream};
use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lock if free now (a poisoned one too), else `None`.
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// A descriptor received from a same-host peer: (allocation base there, size, fd).
pub(crate) type FdMail = Result<(u64, usize, OwnedFd)>;

/// What the endpoint and all its connections share.
pub(crate) struct Shared {
    pub(crate) device: Device,
    pub(crate) config: P2pConfig,
    pub(crate) token: u128,
    pub(crate) host_id: u128,
    pub(crate) mrs: RwLock<HashMap<u64, Arc<MrInner>>>,
    /// Descriptors that same-host peers sent, by (connection nonce, request).
    pub(crate) fds: Mutex<HashMap<(u64, u64), FdMail>>,
    pub(crate) fds_cv: Condvar,
    pub(crate) shutdown: Arc<AtomicBool>,
    /// The connections the progress thread serves (shared-memory control).
    pub(crate) progress: Progress,
    /// The RDMA device, when the endpoint uses the verbs transport.
    pub(crate) rdma: Option<Arc<verbs::Rdma>>,
}

/// What the endpoint's progress thread polls, and how to wake it.
#[derive(Default)]
pub(crate) struct Progress {
    conns: Mutex<Vec<Weak<ConnInner>>>,
    generation: AtomicU64,
    kicks: AtomicU64,
    pub(crate) thread: OnceLock<Thread>,
}

impl Progress {
    fn add(&self, c: &Arc<ConnInner>) {
        lock(&self.conns).push(Arc::downgrade(c));
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.kick();
    }

    /// Wakes the progress thread and keeps it polling closely for a while:
    /// this process just started something whose answer comes soon.
    pub(crate) fn kick(&self) {
        self.kicks.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Forgets every connection (the endpoint is going away).
    pub(crate) fn clear(&self) {
        lock(&self.conns).clear();
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// How long the progress thread polls back to back (yielding the core
/// between passes) after something happened; then it naps [`NAP`] between
/// passes, and [`IDLE_NAP`] once idle for [`IDLE`]. Yielding rather than
/// spinning: with fewer cores than busy threads (two processes on a
/// two-core machine, emulated), a pure spin doubled the small-message
/// latency; with cores to spare a yield returns at once.
const POLL: Duration = Duration::from_millis(2);
const NAP: Duration = Duration::from_micros(100);
const IDLE: Duration = Duration::from_millis(20);
const IDLE_NAP: Duration = Duration::from_millis(1);
/// How long a waiter polls a transfer's done flag (yielding) before its condvar.
const WAIT_SPIN: Duration = Duration::from_micros(20);

/// The endpoint's progress thread: polls the shared-memory control rings
/// of every same-host connection, runs their initiators' queues, finds
/// finished copies; polls back to back while busy, then naps (see the
/// module docs of `p2p`).
pub(crate) fn progress_loop(sh: Arc<Shared>) {
    let p = &sh.progress;
    let mut conns: Vec<Arc<ConnInner>> = Vec::new();
    let mut seen_generation = u64::MAX;
    let mut seen_kicks = 0;
    let mut last_active = Instant::now();
    while !sh.shutdown.load(Ordering::SeqCst) {
        let g = p.generation.load(Ordering::SeqCst);
        if g != seen_generation {
            conns = lock(&p.conns).iter().filter_map(Weak::upgrade).collect();
            seen_generation = g;
        }
        if conns.is_empty() {
            std::thread::park_timeout(Duration::from_millis(50));
            continue;
        }
        let mut active = false;
        let mut busy = false;
        let mut finished = false;
        for c in &conns {
            let (a, b) = c.progress();
            active |= a;
            busy |= b;
            finished |= c.finished();
        }
        if finished {
            let mut list = lock(&p.conns);
            list.retain(|w| w.upgrade().is_some_and(|c| !c.finished()));
            p.generation.fetch_add(1, Ordering::SeqCst);
        }
        let k = p.kicks.load(Ordering::SeqCst);
        if k != seen_kicks {
            seen_kicks = k;
            active = true;
        }
        if active {
            last_active = Instant::now();
            continue;
        }
        let idle = last_active.elapsed();
        if idle < POLL || busy {
            std::thread::yield_now();
        } else if idle < IDLE {
            std::thread::park_timeout(NAP);
        } else {
            std::thread::park_timeout(IDLE_NAP);
        }
    }
}

thread_local! {
    /// Set while this thread consumes a control ring (no nested draining).
    static DRAINING: Cell<bool> = const { Cell::new(false) };
}

impl Shared {
    pub(crate) fn mr(&self, id: u64) -> Option<Arc<MrInner>> {
        self.mrs.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    /// The registered region `id`, checked to be advertised and to hold
    /// `addr .. addr + len`: what a peer may write and read one-sidedly.
    fn checked_mr(&self, id: u64, addr: u64, len: u64) -> Result<Arc<MrInner>> {
        let mr = self.mr(id).ok_or_else(|| {
            Error::invalid_argument(format!("memory region {id} is not registered at this endpoint (deregistered?)"))
        })?;
        if !mr.advertised.load(Ordering::SeqCst) {
            return Err(Error::invalid_argument(format!(
                "memory region {id} was never advertised (Endpoint::advertise): peers may not write or read it"
            )));
        }
        if !mr.contains(addr, len) {
            return Err(Error::invalid_argument(format!(
                "{len} bytes at {addr:#x} are not inside memory region {id} ({:#x} + {} bytes)",
                mr.addr, mr.len
            )));
        }
        Ok(mr)
    }
}

/// The abstract Unix socket name of the endpoint with `token` (same-host descriptors).
pub(crate) fn unix_name(token: u128) -> String {
    format!("devcomm-p2p-{token:032x}")
}

/// A registered memory region.
pub(crate) struct MrInner {
    pub(crate) id: u64,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    /// Host memory (plain loads and stores); else device memory of the
    /// endpoint's device (copies through its streams).
    pub(crate) host: bool,
    /// The shareable allocation holding the region, which a same-host peer can map.
    pub(crate) alloc: Option<Arc<ShareableAlloc>>,
    /// `true` while registered (see the module docs).
    pub(crate) live: RwLock<bool>,
    /// Advertised to peers: they may write, read and map it.
    pub(crate) advertised: AtomicBool,
    /// Posted as a receive: the sending peer may map it.
    pub(crate) posted: AtomicBool,
    /// The RDMA registration's (lkey, rkey) (endpoints using the verbs transport).
    pub(crate) rdma_keys: Option<(u32, u32)>,
    /// Copies on the copy engine (or RDMA transfers) in flight from or to the region.
    pub(crate) busy: Mutex<usize>,
    pub(crate) idle: Condvar,
}

impl MrInner {
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len as u64)
    }

    /// Counts a copy in flight (the region must be registered);
    /// [`MrInner::end`] ends it.
    pub(crate) fn begin(&self) -> Result<()> {
        let _g = self.hold()?;
        *lock(&self.busy) += 1;
        Ok(())
    }

    pub(crate) fn end(&self) {
        let mut b = lock(&self.busy);
        *b = b.saturating_sub(1);
        self.idle.notify_all();
    }

    /// Marks the region deregistered and waits until no thread uses it.
    pub(crate) fn retire(&self) {
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = false;
        let mut b = lock(&self.busy);
        while *b > 0 {
            b = self.idle.wait(b).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Holds the region registered for the guard's life.
    fn hold(&self) -> Result<std::sync::RwLockReadGuard<'_, bool>> {
        let g = self.live.read().unwrap_or_else(|p| p.into_inner());
        if !*g {
            return Err(Error::invalid_usage(format!(
                "memory region {} was deregistered while a transfer used it",
                self.id
            )));
        }
        Ok(g)
    }
}

/// One transfer's completion.
pub(crate) struct Op {
    state: Mutex<Option<Result<usize>>>,
    /// Set once `state` holds the outcome: waiters spin on it briefly.
    done: AtomicBool,
    cv: Condvar,
    /// Pieces still to go (striped sends).
    pending: AtomicUsize,
    pub(crate) conn: std::sync::Weak<ConnInner>,
}

impl Op {
    pub(crate) fn new(conn: &Arc<ConnInner>) -> Arc<Op> {
        Arc::new(Op {
            state: Mutex::new(None),
            done: AtomicBool::new(false),
            cv: Condvar::new(),
            pending: AtomicUsize::new(0),
            conn: Arc::downgrade(conn),
        })
    }

    /// Records the outcome (the first one wins).
    pub(crate) fn finish(&self, r: Result<usize>) {
        let mut s = lock(&self.state);
        if s.is_none() {
            *s = Some(r);
        }
        self.done.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    pub(crate) fn poll(&self) -> Option<Result<usize>> {
        lock(&self.state).clone()
    }

    /// Waits up to `timeout`; a transfer that does not finish in time fails
    /// its connection (it may be half done: nothing may land later).
    pub(crate) fn wait(&self, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        let deadline = start + timeout;
        // Small transfers finish within microseconds: poll the flag first.
        while !self.done.load(Ordering::Acquire) && start.elapsed() < WAIT_SPIN {
            std::thread::yield_now();
        }
        let mut s = lock(&self.state);
        loop {
            if let Some(r) = s.as_ref() {
                return r.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(s);
                let e = Error::Timeout(format!(
                    "a point-to-point transfer did not finish within {timeout:?} (P2pConfig::op_timeout); its \
                     connection is failed"
                ));
                if let Some(c) = self.conn.upgrade() {
                    c.fail(e.clone());
                }
                self.finish(Err(e));
                s = lock(&self.state);
                continue;
            }
            s = self.cv.wait_timeout(s, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// A receive the peer posted (initiator side).
#[derive(Clone, Copy, Debug)]
struct Cts {
    seq: u64,
    mr: u64,
    addr: u64,
    max_len: u64,
    /// The region's remote key (RDMA connections).
    rkey: Option<u32>,
}

/// A receive this side posted.
struct RecvSlot {
    op: Arc<Op>,
    mr: Arc<MrInner>,
    addr: u64,
    max_len: u64,
    expected: Option<u64>,
    landed: u64,
    error: Option<Error>,
}

/// A write a peer makes into this side's memory.
#[derive(Default)]
struct InWrite {
    expected: Option<u64>,
    landed: u64,
    error: Option<Error>,
}

/// A read this side asked for.
struct ReadSlot {
    op: Arc<Op>,
    mr: Arc<MrInner>,
    addr: u64,
    len: u64,
    landed: u64,
    error: Option<Error>,
}

#[derive(Default)]
struct State {
    error: Option<Error>,
    cts: VecDeque<Cts>,
    recvs: HashMap<u64, RecvSlot>,
    writes_in: HashMap<u64, InWrite>,
    writes_out: HashMap<u64, Arc<Op>>,
    reads: HashMap<u64, ReadSlot>,
}

/// What the initiator's worker runs, in order.
pub(crate) enum Work {
    Send {
        op: Arc<Op>,
        mr: Arc<MrInner>,
        addr: u64,
        len: usize,
    },
    Write {
        op: Arc<Op>,
        mr: Arc<MrInner>,
        addr: u64,
        len: usize,
        remote: RemoteRegion,
        raddr: u64,
    },
    Read {
        op: Arc<Op>,
        mr: Arc<MrInner>,
        addr: u64,
        len: usize,
        remote: RemoteRegion,
        raddr: u64,
    },
    /// Fetch and map the peer's region's allocation (the worker of a
    /// shared-memory connection, for its progress thread).
    Resolve(u64),
}

impl Work {
    fn op(&self) -> Option<&Arc<Op>> {
        match self {
            Work::Send { op, .. } | Work::Write { op, .. } | Work::Read { op, .. } => Some(op),
            Work::Resolve(_) => None,
        }
    }
}

/// The shared-memory control path of a connection.
pub(crate) struct ShmCtl {
    #[cfg(test)]
    page: Arc<ShmPage>,
    out: Mutex<Outbox>,
    inbox: Mutex<RingRx>,
    /// The initiator's transfers, in order, not yet started.
    queue: Mutex<VecDeque<Work>>,
    /// Peer regions whose descriptor the worker is fetching.
    resolving: Mutex<HashSet<u64>>,
    /// The initiator's copies.
    copies: Option<Copies>,
}

/// Copies on the copy engine, each followed by an event.
struct Copies {
    stream: Stream,
    inflight: Mutex<Inflight>,
}

#[derive(Default)]
struct Inflight {
    queue: VecDeque<(Event, Copied)>,
    /// Events whose copies finished, for reuse.
    spare: Vec<Event>,
    /// Copies being handed to the driver, not yet in `queue` (the
    /// connection is not finished while any is).
    issuing: usize,
}

const SPARE_EVENTS: usize = 64;
/// Descriptor requests served at once per connection (shared-memory control path).
const MAX_FD_SERVING: usize = 8;
/// Frames a progress pass takes from one ring (fairness between connections).
const FRAMES_PER_PASS: usize = 64;

/// How many control frames went each way, on which path.
#[derive(Default)]
struct Counters {
    shm_sent: AtomicU64,
    shm_received: AtomicU64,
    tcp_sent: AtomicU64,
    tcp_received: AtomicU64,
}

/// A copy queued on the worker's stream, finished by the completer.
struct Copied {
    op: Arc<Op>,
    mr: Arc<MrInner>,
    len: usize,
    /// The receive a send landed in (its `C_SEND` goes out once the copy is done).
    send_seq: Option<u64>,
}

/// A piece for a data socket's writer.
struct Job {
    hdr: DataHeader,
    mr: Arc<MrInner>,
    src: u64,
    /// The transfer to count down (striped sends), finished with `total` at zero.
    op: Option<(Arc<Op>, usize)>,
}

/// A same-host peer's allocation mapped here.
pub(crate) struct RemoteMapping {
    range: AddressRange,
    remote_base: u64,
    size: usize,
}

// SAFETY: the range is only used to compute addresses; its owner unmaps it once.
unsafe impl Send for RemoteMapping {}
// SAFETY: as above.
unsafe impl Sync for RemoteMapping {}

impl RemoteMapping {
    /// The local address of the peer's `addr .. addr + len`, if mapped here.
    pub(crate) fn local(&self, addr: u64, len: u64) -> Option<u64> {
        let off = addr.checked_sub(self.remote_base)?;
        (off.checked_add(len)? <= self.size as u64).then(|| self.range.base() + off)
    }
}

/// One connection (see the module docs).
pub(crate) struct ConnInner {
    pub(crate) id: u64,
    pub(crate) initiator: bool,
    pub(crate) peer_addr: SocketAddr,
    pub(crate) remote_gpu: usize,
    pub(crate) peer_token: u128,
    pub(crate) nonce: u64,
    pub(crate) ipc: bool,
    pub(crate) threads: usize,
    pub(crate) shared: Arc<Shared>,
    control: Mutex<TcpStream>,
    sockets: Vec<TcpStream>,
    writers: Mutex<Option<Vec<mpsc::Sender<Job>>>>,
    rr: AtomicUsize,
    work: Mutex<Option<mpsc::Sender<Work>>>,
    copied: Mutex<Option<mpsc::Sender<Copied>>>,
    st: Mutex<State>,
    cv: Condvar,
    mappings: Mutex<HashMap<u64, Option<Arc<RemoteMapping>>>>,
    next_seq: AtomicU64,
    handles: Mutex<Vec<JoinHandle<()>>>,
    closing: AtomicBool,
    shm: Option<ShmCtl>,
    counters: Counters,
    this: Weak<ConnInner>,
    /// Descriptor requests being served (shared-memory control path).
    fd_serving: AtomicUsize,
    /// The queue pair of an RDMA (verbs) connection.
    pub(crate) rdma: Option<Arc<verbs::RcConn>>,
}

/// Parameters of a connection whose sockets are open and whose handshake is done.
pub(crate) struct ConnParts {
    pub(crate) id: u64,
    pub(crate) initiator: bool,
    pub(crate) peer_addr: SocketAddr,
    pub(crate) remote_gpu: usize,
    pub(crate) peer_token: u128,
    pub(crate) nonce: u64,
    pub(crate) ipc: bool,
    pub(crate) control: TcpStream,
    pub(crate) data: Vec<TcpStream>,
    /// The shared control page, when both sides agreed on it.
    pub(crate) shm: Option<ShmPage>,
    /// The connected queue pair of an RDMA (verbs) connection.
    pub(crate) rdma: Option<Arc<verbs::RcConn>>,
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(f).map_err(|e| Error::system("spawning a thread", e))
}

impl ConnInner {
    /// Starts the connection's threads.
    pub(crate) fn start(shared: Arc<Shared>, p: ConnParts) -> Result<Arc<ConnInner>> {
        let io = |what: &str, e: std::io::Error| Error::system(what, e);
        let control_r = p.control.try_clone().map_err(|e| io("cloning a socket", e))?;
        let mut readers = Vec::new();
        let mut writer_socks = Vec::new();
        let mut sockets = vec![p.control.try_clone().map_err(|e| io("cloning a socket", e))?];
        for s in &p.data {
            readers.push(s.try_clone().map_err(|e| io("cloning a socket", e))?);
            writer_socks.push(s.try_clone().map_err(|e| io("cloning a socket", e))?);
            sockets.push(s.try_clone().map_err(|e| io("cloning a socket", e))?);
        }
        let chunk = shared.config.chunk_bytes;
        let op_timeout = shared.config.op_timeout;
        for (i, s) in p.data.iter().chain(std::iter::once(&p.control)).enumerate() {
            s.set_nodelay(true).map_err(|e| io("TCP_NODELAY", e))?;
            s.set_write_timeout(Some(op_timeout)).map_err(|e| io("setting a socket timeout", e))?;
            // Data sockets: a frame that stalls half way fails the
            // connection after the op timeout (a region's drop waits for
            // the frame landing in it); between frames they may idle.
            let read_timeout = (i < p.data.len()).then_some(op_timeout);
            s.set_read_timeout(read_timeout).map_err(|e| io("setting a socket timeout", e))?;
        }
        let (work_tx, work_rx) = mpsc::channel::<Work>();
        let (copied_tx, copied_rx) = mpsc::channel::<Copied>();
        let mut txs = Vec::new();
        let mut rxs = Vec::new();
        for _ in 0..p.data.len() {
            let (tx, rx) = mpsc::channel::<Job>();
            txs.push(tx);
            rxs.push(rx);
        }
        let shm = match p.shm {
            Some(page) => {
                let page = Arc::new(page);
                let out = shm::out_ring(p.initiator);
                Some(ShmCtl {
                    out: Mutex::new(Outbox::new(RingTx::new(page.clone(), out))),
                    inbox: Mutex::new(RingRx::new(page.clone(), 1 - out)),
                    #[cfg(test)]
                    page,
                    queue: Mutex::new(VecDeque::new()),
                    resolving: Mutex::new(HashSet::new()),
                    copies: if p.initiator {
                        Some(Copies { stream: shared.device.new_stream()?, inflight: Mutex::default() })
                    } else {
                        None
                    },
                })
            }
            None => None,
        };
        let has_shm = shm.is_some();
        let conn = Arc::new_cyclic(|this| ConnInner {
            id: p.id,
            initiator: p.initiator,
            peer_addr: p.peer_addr,
            remote_gpu: p.remote_gpu,
            peer_token: p.peer_token,
            nonce: p.nonce,
            ipc: p.ipc,
            threads: p.data.len(),
            shared: shared.clone(),
            control: Mutex::new(p.control),
            sockets,
            writers: Mutex::new(Some(txs)),
            rr: AtomicUsize::new(0),
            work: Mutex::new(p.initiator.then_some(work_tx)),
            copied: Mutex::new((p.initiator && !has_shm).then_some(copied_tx)),
            st: Mutex::new(State::default()),
            cv: Condvar::new(),
            mappings: Mutex::new(HashMap::new()),
            next_seq: AtomicU64::new(1),
            handles: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
            shm,
            counters: Counters::default(),
            this: this.clone(),
            fd_serving: AtomicUsize::new(0),
            rdma: p.rdma,
        });
        if let Some(r) = &conn.rdma {
            r.attach(&conn);
        }
        let mut handles = Vec::new();
        let tag = format!("p2p{}{}", if p.initiator { 'i' } else { 't' }, p.id);
        {
            let c = conn.clone();
            handles.push(spawn(format!("{tag}-ctl"), move || c.control_loop(control_r))?);
        }
        for (i, ((r, w), rx)) in readers.into_iter().zip(writer_socks).zip(rxs).enumerate() {
            let (rb, wb) =
                (HostMappedBuffer::new(&shared.device, chunk)?, HostMappedBuffer::new(&shared.device, chunk)?);
            let (rs, ws) = (shared.device.new_stream()?, shared.device.new_stream()?);
            let c = conn.clone();
            handles.push(spawn(format!("{tag}-rd{i}"), move || c.reader_loop(r, rb, rs))?);
            let c = conn.clone();
            handles.push(spawn(format!("{tag}-wr{i}"), move || c.writer_loop(w, rx, wb, ws))?);
        }
        if p.initiator {
            let stream = shared.device.new_stream()?;
            let c = conn.clone();
            let s2 = stream.clone();
            handles.push(spawn(format!("{tag}-work"), move || c.work_loop(work_rx, stream))?);
            if !has_shm {
                let c = conn.clone();
                handles.push(spawn(format!("{tag}-done"), move || c.complete_loop(copied_rx, s2))?);
            }
        }
        *lock(&conn.handles) = handles;
        if has_shm {
            shared.progress.add(&conn);
        }
        Ok(conn)
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The connection's error, if it failed or closed.
    pub(crate) fn error(&self) -> Option<Error> {
        lock(&self.st).error.clone()
    }

    /// Fails the connection: every transfer in flight gets `e`, later ones
    /// too; the sockets are shut so every thread ends.
    pub(crate) fn fail(&self, e: Error) {
        // Frames the peer put on the ring before it went away come first
        // (its goodbye among them: its error is the one to report).
        // At most what a full ring holds: a peer that keeps writing cannot
        // hold this thread here.
        let e = match self.shm.is_some() && self.error().is_none() {
            true => self.drain_inbox(shm::RING_BYTES / wire::CONTROL_BYTES).err().unwrap_or(e),
            false => e,
        };
        if self.set_error(e) {
            self.teardown();
        }
    }

    /// Records `e` as the connection's error (if it has none yet) and fails
    /// every transfer in flight with it; `false` when it had failed already.
    fn set_error(&self, e: Error) -> bool {
        let ops: Vec<Arc<Op>> = {
            let mut st = lock(&self.st);
            if st.error.is_some() {
                return false;
            }
            st.error = Some(e.clone());
            st.cts.clear();
            let mut ops: Vec<Arc<Op>> = st.recvs.drain().map(|(_, s)| s.op).collect();
            ops.extend(st.writes_out.drain().map(|(_, o)| o));
            ops.extend(st.reads.drain().map(|(_, s)| s.op));
            st.writes_in.clear();
            ops
        };
        if !self.closing.load(Ordering::SeqCst) {
            tracing::debug!(conn = self.id, error = %e, "p2p connection failed");
        }
        for op in ops {
            op.finish(Err(e.clone()));
        }
        self.cv.notify_all();
        self.shared.fds_cv.notify_all();
        true
    }

    /// Shuts the sockets and ends the channels, so every thread ends (and
    /// an RDMA queue pair goes to the error state, failing its transfers).
    fn teardown(&self) {
        if let Some(r) = &self.rdma {
            r.shut(&self.error().unwrap_or_else(|| Error::invalid_usage("point-to-point connection closed")));
        }
        for s in &self.sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
        lock(&self.writers).take();
        lock(&self.work).take();
        lock(&self.copied).take();
    }

    /// Closes the connection (a goodbye to the peer first) and joins its threads.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        // Our own error first, so that the peer's reaction to the goodbye
        // cannot make this side's later calls report a remote failure.
        let closed = Error::invalid_usage(format!("point-to-point connection {} is closed", self.id));
        if self.set_error(closed.clone()) {
            let bye = Control::new(wire::C_BYE, 0, 0, 0, 0);
            match &self.shm {
                // The goodbye behind every frame still waiting for room on
                // the ring, given a moment to get there (the peer reads the
                // ring before it trusts the sockets' EOF).
                Some(shm) => {
                    let deadline = Instant::now() + self.shared.config.op_timeout.min(Duration::from_secs(1));
                    let mut out = lock(&shm.out);
                    if out.send(shm::frame(&bye)).is_ok() {
                        while !out.flush().unwrap_or(true) && Instant::now() < deadline {
                            drop(out);
                            std::thread::sleep(Duration::from_micros(100));
                            out = lock(&shm.out);
                        }
                    }
                }
                None => {
                    let _ = lock(&self.control).write_all(&bye.encode());
                }
            }
        }
        self.teardown();
        let handles = std::mem::take(&mut *lock(&self.handles));
        let me = std::thread::current().id();
        for h in handles {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        self.abandon(&self.error().unwrap_or(closed));
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends a control frame: on the ring with the shared-memory control
    /// path, else on the control socket.
    pub(crate) fn send_control(&self, c: &Control) -> Result<()> {
        let Some(shm) = &self.shm else {
            return self.send_control_tcp(c);
        };
        let r = lock(&shm.out).send(shm::frame(c));
        match r {
            Ok(()) => {
                self.counters.shm_sent.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.fail(e.clone());
                Err(e)
            }
        }
    }

    /// Sends a control frame on the control socket.
    pub(crate) fn send_control_tcp(&self, c: &Control) -> Result<()> {
        let bytes = c.encode();
        let r = lock(&self.control).write_all(&bytes).map_err(|e| wire::io_err("writing a control frame", e));
        match &r {
            Ok(()) => {
                self.counters.tcp_sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.fail(e.clone()),
        }
        r
    }

    /// Which path the control frames take.
    pub(crate) fn control_path(&self) -> ControlPath {
        if self.shm.is_some() {
            ControlPath::SharedMemory
        } else {
            ControlPath::Tcp
        }
    }

    pub(crate) fn control_stats(&self) -> ControlStats {
        let c = &self.counters;
        ControlStats {
            shm_sent: c.shm_sent.load(Ordering::Relaxed),
            shm_received: c.shm_received.load(Ordering::Relaxed),
            tcp_sent: c.tcp_sent.load(Ordering::Relaxed),
            tcp_received: c.tcp_received.load(Ordering::Relaxed),
        }
    }

    /// Queues `w` (initiator side): for the worker, or with the
    /// shared-memory control path on the connection's queue, which this
    /// thread then tries to run at once.
    pub(crate) fn submit(&self, w: Work) -> Result<()> {
        tracing::trace!(conn = self.id, "p2p: transfer submitted");
        self.check_usable()?;
        if let Some(shm) = &self.shm {
            {
                let mut q = lock(&shm.queue);
                // Under the queue's lock: a failure either shows here or
                // finds the transfer queued (and fails it).
                self.check_usable()?;
                q.push_back(w);
            }
            // The peer's posted receives may sit on the ring still: take
            // them here, so a send whose receive is posted starts on this
            // thread rather than after the progress thread's next pass.
            if let Err(e) = self.drain_inbox(FRAMES_PER_PASS) {
                self.fail(e);
            }
            self.advance();
            self.shared.progress.kick();
            return Ok(());
        }
        let tx = lock(&self.work);
        let tx = tx.as_ref().ok_or_else(|| {
            self.error().unwrap_or_else(|| Error::invalid_usage("this connection cannot initiate transfers"))
        })?;
        tx.send(w).map_err(|_| self.error().unwrap_or_else(|| Error::internal("p2p worker is gone")))
    }

    /// Posts a receive (target side): tells the peer where its next message may land.
    pub(crate) fn post_recv(self: &Arc<Self>, mr: Arc<MrInner>, addr: u64, max_len: usize) -> Result<Arc<Op>> {
        let op = Op::new(self);
        let seq = self.next_seq();
        mr.posted.store(true, Ordering::SeqCst);
        {
            let mut st = lock(&self.st);
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            st.recvs.insert(
                seq,
                RecvSlot {
                    op: op.clone(),
                    mr: mr.clone(),
                    addr,
                    max_len: max_len as u64,
                    expected: None,
                    landed: 0,
                    error: None,
                },
            );
        }
        let cts = match (&self.rdma, mr.rdma_keys) {
            (Some(_), Some((_, rkey))) => Control::new(wire::C_CTS_RDMA, seq, u64::from(rkey), addr, max_len as u64),
            _ => Control::new(wire::C_CTS, seq, mr.id, addr, max_len as u64),
        };
        self.send_control(&cts)?;
        if self.shm.is_some() {
            self.shared.progress.kick();
        }
        Ok(op)
    }

    fn enqueue(&self, job: Job) -> Result<()> {
        let w = lock(&self.writers);
        let w = w.as_ref().ok_or_else(|| self.error().unwrap_or_else(|| Error::internal("p2p writers are gone")))?;
        let i = self.rr.fetch_add(1, Ordering::Relaxed) % w.len();
        w[i].send(job).map_err(|_| self.error().unwrap_or_else(|| Error::internal("p2p writer is gone")))
    }

    /// Splits `len` bytes at `src` into data frames over the sockets.
    #[allow(clippy::too_many_arguments)]
    fn stripe(
        &self,
        kind: u32,
        seq: u64,
        mr_id: u64,
        at: u64,
        mr: &Arc<MrInner>,
        src: u64,
        len: usize,
        op: Option<&Arc<Op>>,
    ) -> Result<()> {
        let chunk = self.shared.config.chunk_bytes;
        let n = len.div_ceil(chunk);
        if let Some(op) = op {
            op.pending.store(n, Ordering::SeqCst);
        }
        for i in 0..n {
            let off = i * chunk;
            let piece = chunk.min(len - off);
            self.enqueue(Job {
                hdr: DataHeader { kind, seq, mr: mr_id, addr: at + off as u64, len: piece as u64 },
                mr: mr.clone(),
                src: src + off as u64,
                op: op.map(|o| (o.clone(), len)),
            })?;
        }
        Ok(())
    }

    // ---- the initiator's worker ----

    fn work_loop(self: Arc<Self>, rx: mpsc::Receiver<Work>, stream: Stream) {
        for w in rx {
            let op = match &w {
                Work::Send { op, .. } | Work::Write { op, .. } | Work::Read { op, .. } => op.clone(),
                Work::Resolve(mr) => {
                    // Cached (mapped or not) for the progress thread; a
                    // failure here failed the connection.
                    let _ = self.mapping(*mr);
                    if let Some(shm) = &self.shm {
                        lock(&shm.resolving).remove(mr);
                    }
                    self.shared.progress.kick();
                    continue;
                }
            };
            if let Some(e) = self.error() {
                op.finish(Err(e));
                continue;
            }
            let r = match w {
                Work::Send { op, mr, addr, len } => self.do_send(&op, &mr, addr, len, &stream),
                Work::Write { op, mr, addr, len, remote, raddr } => {
                    self.do_write(&op, &mr, addr, len, &remote, raddr, &stream)
                }
                Work::Read { op, mr, addr, len, remote, raddr } => {
                    self.do_read(&op, &mr, addr, len, &remote, raddr, &stream)
                }
                Work::Resolve(_) => Ok(()),
            };
            if let Err(e) = r {
                op.finish(Err(e));
            }
        }
    }

    fn wait_cts(&self) -> Result<Cts> {
        let timeout = self.shared.config.op_timeout;
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.st);
        loop {
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            if let Some(c) = st.cts.pop_front() {
                return Ok(c);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(st);
                let e = Error::Timeout(format!(
                    "send: the peer posted no receive within {timeout:?} (P2pConfig::op_timeout); the connection is failed"
                ));
                self.fail(e.clone());
                return Err(e);
            }
            st = self.cv.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Queues a copy on the copy engine; the completer finishes `op` (and
    /// tells the peer about receive `send_seq`) once it is done. Copies run
    /// back to back on the stream, each waited for by the completer in batches.
    #[allow(clippy::too_many_arguments)]
    fn queue_copy(
        &self,
        stream: &Stream,
        dst: u64,
        src: u64,
        len: usize,
        mr: &Arc<MrInner>,
        op: &Arc<Op>,
        send_seq: Option<u64>,
    ) -> Result<()> {
        mr.begin()?;
        let queued = if len == 0 {
            Ok(())
        } else {
            // SAFETY: one of `src`, `dst` lies in a registered region of this
            // device, counted busy above (its drop waits until the completer
            // ends the count, after the copy); the other lies in a peer's
            // allocation mapped into this device (`RemoteMapping::local`
            // checked the span), kept mapped by this connection; different
            // allocations, so they do not overlap.
            unsafe { stream.memcpy_raw(dst, src, len) }
        };
        let sent = queued.and_then(|()| {
            let tx = lock(&self.copied);
            let tx =
                tx.as_ref().ok_or_else(|| self.error().unwrap_or_else(|| Error::internal("p2p completer gone")))?;
            tx.send(Copied { op: op.clone(), mr: mr.clone(), len, send_seq })
                .map_err(|_| self.error().unwrap_or_else(|| Error::internal("p2p completer gone")))
        });
        if let Err(e) = sent {
            // The copy may be queued: wait for it before the count ends.
            let _ = stream.synchronize();
            mr.end();
            return Err(e);
        }
        Ok(())
    }

    fn complete_loop(self: Arc<Self>, rx: mpsc::Receiver<Copied>, stream: Stream) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while let Ok(c) = rx.try_recv() {
                batch.push(c);
            }
            let r = stream.synchronize();
            for c in batch {
                c.mr.end();
                let r = r.clone().and_then(|()| match c.send_seq {
                    Some(seq) => self.send_control(&Control::new(wire::C_SEND, seq, c.len as u64, 1, 0)),
                    None => Ok(()),
                });
                match r {
                    Ok(()) => c.op.finish(Ok(c.len)),
                    Err(e) => {
                        c.op.finish(Err(e.clone()));
                        self.fail(e);
                    }
                }
            }
        }
    }

    fn do_send(&self, op: &Arc<Op>, mr: &Arc<MrInner>, addr: u64, len: usize, stream: &Stream) -> Result<()> {
        let cts = self.wait_cts()?;
        if len as u64 > cts.max_len {
            return Err(self.too_large(&cts, len));
        }
        if let Some(rc) = &self.rdma {
            let rkey = cts.rkey.ok_or_else(|| Error::remote("the peer posted a receive without an RDMA key"))?;
            let to = self.shared.config.op_timeout;
            return rc.transfer(op, mr, addr, len, cts.addr, rkey, verbs::Kind::Send(cts.seq), to);
        }
        if let Some(dst) = self.ipc_local(mr, cts.mr, cts.addr, len as u64)? {
            return self.queue_copy(stream, dst, addr, len, mr, op, Some(cts.seq));
        }
        self.send_over_tcp(op, mr, addr, len, cts.seq)
    }

    /// The rest of a send for receive `seq` whose bytes take the sockets.
    fn send_over_tcp(&self, op: &Arc<Op>, mr: &Arc<MrInner>, addr: u64, len: usize, seq: u64) -> Result<()> {
        self.send_control(&Control::new(wire::C_SEND, seq, len as u64, 0, 0))?;
        if len == 0 {
            op.finish(Ok(0));
            return Ok(());
        }
        self.stripe(wire::D_SEND, seq, 0, 0, mr, addr, len, Some(op))
    }

    /// The refusal of a message too large for receive `cts`.
    fn too_large(&self, cts: &Cts, len: usize) -> Error {
        if let Err(e) = self.send_control(&Control::new(wire::C_TOO_LARGE, cts.seq, len as u64, 0, 0)) {
            return e;
        }
        Error::invalid_argument(format!(
            "send of {len} bytes: the message is larger than the peer's receive region of {} bytes",
            cts.max_len
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn do_write(
        &self,
        op: &Arc<Op>,
        mr: &Arc<MrInner>,
        addr: u64,
        len: usize,
        remote: &RemoteRegion,
        raddr: u64,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(rc) = &self.rdma {
            let to = self.shared.config.op_timeout;
            return rc.transfer(op, mr, addr, len, raddr, remote.rdma_key()?, verbs::Kind::Write, to);
        }
        if let Some(dst) = self.ipc_local(mr, remote.mr_id, raddr, len as u64)? {
            return self.queue_copy(stream, dst, addr, len, mr, op, None);
        }
        self.write_over_tcp(op, mr, addr, len, remote, raddr)
    }

    /// A write whose bytes take the sockets.
    fn write_over_tcp(
        &self,
        op: &Arc<Op>,
        mr: &Arc<MrInner>,
        addr: u64,
        len: usize,
        remote: &RemoteRegion,
        raddr: u64,
    ) -> Result<()> {
        let seq = self.next_seq();
        {
            let mut st = lock(&self.st);
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            st.writes_out.insert(seq, op.clone());
        }
        self.send_control(&Control::new(wire::C_WRITE, seq, remote.mr_id, raddr, len as u64))?;
        self.stripe(wire::D_WRITE, seq, remote.mr_id, raddr, mr, addr, len, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn do_read(
        &self,
        op: &Arc<Op>,
        mr: &Arc<MrInner>,
        addr: u64,
        len: usize,
        remote: &RemoteRegion,
        raddr: u64,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(rc) = &self.rdma {
            let to = self.shared.config.op_timeout;
            return rc.transfer(op, mr, addr, len, raddr, remote.rdma_key()?, verbs::Kind::Read, to);
        }
        if let Some(src) = self.ipc_local(mr, remote.mr_id, raddr, len as u64)? {
            return self.queue_copy(stream, addr, src, len, mr, op, None);
        }
        self.read_over_tcp(op, mr, addr, len, remote, raddr)
    }

    /// A read whose bytes take the sockets.
    fn read_over_tcp(
        &self,
        op: &Arc<Op>,
        mr: &Arc<MrInner>,
        addr: u64,
        len: usize,
        remote: &RemoteRegion,
        raddr: u64,
    ) -> Result<()> {
        if len == 0 {
            op.finish(Ok(0));
            return Ok(());
        }
        let seq = self.next_seq();
        {
            let mut st = lock(&self.st);
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            st.reads.insert(
                seq,
                ReadSlot { op: op.clone(), mr: mr.clone(), addr, len: len as u64, landed: 0, error: None },
            );
        }
        self.send_control(&Control::new(wire::C_READ, seq, remote.mr_id, raddr, len as u64))
    }

    /// Where the peer's `raddr .. + len` (in its region `remote_mr`) is
    /// mapped here, when this connection copies on the copy engine and the
    /// local region is device memory: `None` means "go over TCP".
    fn ipc_local(&self, local: &MrInner, remote_mr: u64, raddr: u64, len: u64) -> Result<Option<u64>> {
        if !self.ipc || local.host {
            return Ok(None);
        }
        Ok(self.mapping(remote_mr)?.and_then(|m| m.local(raddr, len)))
    }

    /// The peer's region `remote_mr`'s allocation mapped here (asked for once).
    pub(crate) fn mapping(&self, remote_mr: u64) -> Result<Option<Arc<RemoteMapping>>> {
        if !self.ipc {
            return Ok(None);
        }
        if let Some(m) = lock(&self.mappings).get(&remote_mr) {
            return Ok(m.clone());
        }
        let req = self.next_seq();
        self.send_control(&Control::new(wire::C_FD_REQ, req, remote_mr, 0, 0))?;
        let deadline = Instant::now() + self.shared.config.op_timeout;
        let mail = {
            let mut fds = lock(&self.shared.fds);
            loop {
                if let Some(m) = fds.remove(&(self.nonce, req)) {
                    break m;
                }
                if let Some(e) = self.error() {
                    return Err(e);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    drop(fds);
                    let e = Error::Timeout("the same-host peer did not send its memory's descriptor in time".into());
                    self.fail(e.clone());
                    return Err(e);
                }
                fds = self.shared.fds_cv.wait_timeout(fds, left).unwrap_or_else(|p| p.into_inner()).0;
            }
        };
        let mapped = match mail {
            Ok((base, size, fd)) => {
                use std::os::fd::AsFd;
                let r = AddressRange::reserve(&self.shared.device, size).and_then(|mut range| {
                    range.map_fd(0, fd.as_fd(), size)?;
                    Ok(range)
                });
                match r {
                    Ok(range) => Some(Arc::new(RemoteMapping { range, remote_base: base, size })),
                    Err(e) => {
                        tracing::info!(error = %e, "p2p: cannot map the peer's memory; this region goes over TCP");
                        None
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "p2p: the peer's region is not shareable; it goes over TCP");
                None
            }
        };
        // The first mapping of a region stays: copies may be in flight into
        // it (two threads can fetch one region at once: a caller of
        // `mapped_address` and the worker).
        Ok(lock(&self.mappings).entry(remote_mr).or_insert(mapped).clone())
    }

    // ---- the shared-memory control path ----

    /// One pass of the progress thread over this connection: the backlog
    /// to the ring, the peer's frames, the initiator's queue, finished
    /// copies. Returns (whether anything happened, whether work is in
    /// flight that the thread should keep polling for).
    fn progress(&self) -> (bool, bool) {
        let Some(shm) = &self.shm else {
            return (false, false);
        };
        if let Some(e) = self.error() {
            self.abandon(&e);
            return (false, false);
        }
        let mut busy = false;
        if let Some(mut out) = try_lock(&shm.out) {
            match out.flush() {
                Ok(empty) => busy |= !empty,
                Err(e) => {
                    drop(out);
                    self.fail(e);
                    return (true, false);
                }
            }
        }
        let mut active = match self.drain_inbox(FRAMES_PER_PASS) {
            Ok(n) => n > 0,
            Err(e) => {
                self.fail(e);
                return (true, false);
            }
        };
        active |= self.advance();
        let (done, in_flight) = self.poll_copies();
        (active || done, busy || in_flight)
    }

    /// Whether the progress thread is done with the connection (failed or
    /// closed, nothing left queued or in flight).
    fn finished(&self) -> bool {
        let Some(shm) = &self.shm else {
            return true;
        };
        self.error().is_some()
            && lock(&shm.queue).is_empty()
            && shm.copies.as_ref().is_none_or(|c| {
                let inf = lock(&c.inflight);
                inf.queue.is_empty() && inf.issuing == 0
            })
    }

    /// Handles up to `max` frames from the peer's ring; returns how many.
    /// A thread already doing so (the frames' handlers failing the
    /// connection) takes none.
    fn drain_inbox(&self, max: usize) -> Result<usize> {
        let Some(shm) = &self.shm else {
            return Ok(0);
        };
        if DRAINING.with(Cell::get) {
            return Ok(0);
        }
        /// Clears `DRAINING` when dropped (a handler's panic too).
        struct Draining;
        impl Drop for Draining {
            fn drop(&mut self) {
                DRAINING.with(|d| d.set(false));
            }
        }
        DRAINING.with(|d| d.set(true));
        let _draining = Draining;
        let mut rx = lock(&shm.inbox);
        let mut n = 0;
        while n < max {
            let Some(c) = rx.pop()? else {
                break;
            };
            self.counters.shm_received.fetch_add(1, Ordering::Relaxed);
            n += 1;
            self.on_control(c)?;
        }
        Ok(n)
    }

    /// Starts the queued transfers whose turn came and whose peer answer
    /// is here (a receive posted, a region mapped or known not to be);
    /// returns whether any started. Whoever holds the queue runs it.
    fn advance(&self) -> bool {
        let Some(shm) = &self.shm else {
            return false;
        };
        let Some(mut q) = try_lock(&shm.queue) else {
            return false;
        };
        let mut any = false;
        while let Some(w) = q.front() {
            if let Some(e) = self.error() {
                for w in q.drain(..) {
                    if let Some(op) = w.op() {
                        op.finish(Err(e.clone()));
                    }
                }
                return true;
            }
            let Some(r) = self.step(w) else {
                break;
            };
            any = true;
            if let (Some(w), Err(e)) = (q.pop_front(), r) {
                if let Some(op) = w.op() {
                    op.finish(Err(e));
                }
            }
        }
        any
    }

    /// Starts `w` if it can start now without blocking (`None`: not yet).
    fn step(&self, w: &Work) -> Option<Result<()>> {
        match w {
            Work::Send { op, mr, addr, len } => {
                let cts = *lock(&self.st).cts.front()?;
                let dst = if *len as u64 > cts.max_len {
                    None
                } else {
                    self.try_ipc_local(mr, cts.mr, cts.addr, *len as u64)?
                };
                // Taken only now: this thread holds the queue, the only
                // consumer of receives on this path (a failure empties them).
                let taken = lock(&self.st).cts.pop_front();
                if taken.is_none() {
                    return Some(Err(self.error().unwrap_or_else(|| Error::internal("a posted receive vanished"))));
                }
                if *len as u64 > cts.max_len {
                    return Some(Err(self.too_large(&cts, *len)));
                }
                Some(match dst {
                    Some(dst) => self.queue_copy_shm(dst, *addr, *len, mr, op, Some(cts.seq)),
                    None => self.send_over_tcp(op, mr, *addr, *len, cts.seq),
                })
            }
            Work::Write { op, mr, addr, len, remote, raddr } => {
                Some(match self.try_ipc_local(mr, remote.mr_id, *raddr, *len as u64)? {
                    Some(dst) => self.queue_copy_shm(dst, *addr, *len, mr, op, None),
                    None => self.write_over_tcp(op, mr, *addr, *len, remote, *raddr),
                })
            }
            Work::Read { op, mr, addr, len, remote, raddr } => {
                Some(match self.try_ipc_local(mr, remote.mr_id, *raddr, *len as u64)? {
                    Some(src) => self.queue_copy_shm(*addr, src, *len, mr, op, None),
                    None => self.read_over_tcp(op, mr, *addr, *len, remote, *raddr),
                })
            }
            Work::Resolve(_) => Some(Ok(())),
        }
    }

    /// As [`ConnInner::ipc_local`] without blocking: `None` while the
    /// peer's descriptor is being fetched (the worker is asked to).
    fn try_ipc_local(&self, local: &MrInner, remote_mr: u64, raddr: u64, len: u64) -> Option<Option<u64>> {
        if !self.ipc || local.host {
            return Some(None);
        }
        if let Some(m) = lock(&self.mappings).get(&remote_mr) {
            return Some(m.as_ref().and_then(|m| m.local(raddr, len)));
        }
        let shm = self.shm.as_ref()?;
        if lock(&shm.resolving).insert(remote_mr) {
            let sent = lock(&self.work).as_ref().is_some_and(|tx| tx.send(Work::Resolve(remote_mr)).is_ok());
            if !sent {
                lock(&shm.resolving).remove(&remote_mr);
            }
        }
        None
    }

    /// Queues a copy on the connection's stream and an event after it; the
    /// progress thread finishes `op` (and tells the peer about receive
    /// `send_seq`) once the event is reached.
    #[allow(clippy::too_many_arguments)]
    fn queue_copy_shm(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        mr: &Arc<MrInner>,
        op: &Arc<Op>,
        send_seq: Option<u64>,
    ) -> Result<()> {
        let copies =
            self.shm.as_ref().and_then(|s| s.copies.as_ref()).ok_or_else(|| {
                Error::internal("a copy on a point-to-point connection that does not initiate transfers")
            })?;
        mr.begin()?;
        // The driver calls without the in-flight lock, which the progress
        // thread takes to find finished copies (held across them, it made
        // this thread wait for the other's `cuEventQuery` calls and the
        // other wait for these: 4 KiB messages went at half the rate).
        // This thread holds the connection's queue, so copies enter the
        // stream and the in-flight list in the same order.
        let spare = {
            let mut inf = lock(&copies.inflight);
            inf.issuing += 1;
            inf.spare.pop()
        };
        let queued = (|| {
            if len > 0 {
                // SAFETY: as in `queue_copy`: one span lies in a registered
                // region of this device, counted busy above (its drop waits
                // until the progress thread ends the count, after the
                // event behind the copy); the other in a peer's allocation
                // mapped here (`RemoteMapping::local` checked the span),
                // kept mapped by this connection; different allocations.
                unsafe { copies.stream.memcpy_raw(dst, src, len) }?;
            }
            let ev = match spare {
                Some(ev) => ev,
                None => Event::new_untimed(&self.shared.device)?,
            };
            copies.stream.record(&ev)?;
            Ok(ev)
        })();
        let mut inf = lock(&copies.inflight);
        inf.issuing -= 1;
        match queued {
            Ok(ev) => {
                tracing::trace!(conn = self.id, len, send_seq, in_flight = inf.queue.len(), "p2p: copy queued");
                inf.queue.push_back((ev, Copied { op: op.clone(), mr: mr.clone(), len, send_seq }));
                Ok(())
            }
            Err(e) => {
                drop(inf);
                // The copy may be queued: wait for it before the count ends.
                let _ = copies.stream.synchronize();
                mr.end();
                Err(e)
            }
        }
    }

    /// Finishes the copies whose events were reached, in order; returns
    /// (whether any finished, whether some are still in flight).
    fn poll_copies(&self) -> (bool, bool) {
        let Some(copies) = self.shm.as_ref().and_then(|s| s.copies.as_ref()) else {
            return (false, false);
        };
        let mut done = Vec::new();
        let mut failed = None;
        let in_flight = {
            let Some(mut inf) = try_lock(&copies.inflight) else {
                return (false, true);
            };
            while let Some((ev, _)) = inf.queue.front() {
                match ev.query() {
                    Ok(true) => {
                        if let Some((ev, c)) = inf.queue.pop_front() {
                            if inf.spare.len() < SPARE_EVENTS {
                                inf.spare.push(ev);
                            }
                            done.push(c);
                        }
                    }
                    Ok(false) => break,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            !inf.queue.is_empty()
        };
        let any = !done.is_empty();
        for c in done {
            tracing::trace!(conn = self.id, len = c.len, send_seq = c.send_seq, "p2p: copy done");
            c.mr.end();
            let r = match c.send_seq {
                Some(seq) => self.send_control(&Control::new(wire::C_SEND, seq, c.len as u64, 1, 0)),
                None => Ok(()),
            };
            match r {
                Ok(()) => c.op.finish(Ok(c.len)),
                Err(e) => c.op.finish(Err(e)),
            }
        }
        if let Some(e) = failed {
            self.fail(e.clone());
            self.abandon(&e);
            return (true, false);
        }
        (any, in_flight)
    }

    /// After a failure: fails the queued transfers, waits for the copies
    /// in flight (the regions' counts end only after them), fails them.
    fn abandon(&self, e: &Error) {
        let Some(shm) = &self.shm else {
            return;
        };
        let queued: Vec<Work> = lock(&shm.queue).drain(..).collect();
        for w in queued {
            if let Some(op) = w.op() {
                op.finish(Err(e.clone()));
            }
        }
        if let Some(copies) = &shm.copies {
            let mut inf = lock(&copies.inflight);
            if inf.queue.is_empty() {
                return;
            }
            let _ = copies.stream.synchronize();
            for (_, c) in inf.queue.drain(..) {
                c.mr.end();
                c.op.finish(Err(e.clone()));
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn shm_page(&self) -> Option<&ShmPage> {
        self.shm.as_ref().map(|s| &*s.page)
    }

    // ---- the control socket ----

    fn control_loop(self: Arc<Self>, sock: TcpStream) {
        let mut r = BufReader::with_capacity(64 << 10, sock);
        loop {
            let c = match Control::read_from(&mut r) {
                Ok(c) => c,
                Err(e) => {
                    self.fail(e.context(format!("point-to-point connection {} to {}", self.id, self.peer_addr)));
                    return;
                }
            };
            self.counters.tcp_received.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.on_control(c) {
                self.fail(e);
                return;
            }
        }
    }

    fn on_control(&self, c: Control) -> Result<()> {
        match c.kind {
            wire::C_CTS => {
                tracing::trace!(conn = self.id, seq = c.a, "p2p: clear-to-send in");
                lock(&self.st).cts.push_back(Cts { seq: c.a, mr: c.b, addr: c.c, max_len: c.d, rkey: None });
                self.cv.notify_all();
            }
            wire::C_CTS_RDMA if self.rdma.is_some() => {
                let rkey = u32::try_from(c.b).map_err(|_| Error::remote("malformed RDMA key in a posted receive"))?;
                let cts = Cts { seq: c.a, mr: 0, addr: c.c, max_len: c.d, rkey: Some(rkey) };
                lock(&self.st).cts.push_back(cts);
                self.cv.notify_all();
            }
            wire::C_SEND => {
                let mut st = lock(&self.st);
                let slot = st.recvs.get_mut(&c.a).ok_or_else(|| {
                    Error::remote(format!("peer sent a message for receive {} that was not posted", c.a))
                })?;
                if c.b > slot.max_len {
                    return Err(Error::remote("peer sent a message larger than the receive region"));
                }
                slot.expected = Some(c.b);
                if c.c == 1 {
                    slot.landed = c.b;
                }
                Self::recv_done(&mut st, c.a);
            }
            wire::C_TOO_LARGE => {
                let slot = lock(&self.st).recvs.remove(&c.a);
                if let Some(s) = slot {
                    s.op.finish(Err(Error::invalid_argument(format!(
                        "recv: the peer's message of {} bytes is larger than the receive region of {} bytes",
                        c.b, s.max_len
                    ))));
                }
            }
            wire::C_WRITE => {
                let check = self.shared.checked_mr(c.b, c.c, c.d).map(|_| ());
                let mut st = lock(&self.st);
                let w = st.writes_in.entry(c.a).or_default();
                w.expected = Some(c.d);
                if let Err(e) = check {
                    w.error.get_or_insert(e);
                }
                let ack = Self::write_done(&mut st, c.a);
                drop(st);
                if let Some(ack) = ack {
                    self.send_control(&ack)?;
                }
            }
            wire::C_WRITE_ACK => {
                let op = lock(&self.st).writes_out.remove(&c.a);
                if let Some(op) = op {
                    op.finish(match c.to_error() {
                        Some(e) => Err(e),
                        None => Ok(c.b as usize),
                    });
                }
            }
            wire::C_READ => match self.shared.checked_mr(c.b, c.c, c.d) {
                Ok(mr) => self.stripe(wire::D_READ, c.a, 0, 0, &mr, c.c, c.d as usize, None)?,
                Err(e) => self.send_control(&Control::failed(wire::C_READ_ERR, c.a, &e))?,
            },
            wire::C_READ_ERR => {
                let slot = lock(&self.st).reads.remove(&c.a);
                if let Some(s) = slot {
                    s.op.finish(Err(c.to_error().unwrap_or_else(|| Error::remote("read failed at the peer"))));
                }
            }
            // Passing a descriptor may wait for the peer (up to the op
            // timeout): not on the progress thread, which serves every
            // connection of the endpoint.
            // A peer asks once per region, so a few at a time at most: more
            // are refused rather than given a thread each.
            wire::C_FD_REQ if self.shm.is_some() => {
                let me = self.this.upgrade().ok_or_else(|| Error::internal("p2p connection vanished"))?;
                let (req, mr) = (c.a, c.b);
                if self.fd_serving.fetch_add(1, Ordering::SeqCst) >= MAX_FD_SERVING {
                    self.fd_serving.fetch_sub(1, Ordering::SeqCst);
                    let e = Error::remote(format!("more than {MAX_FD_SERVING} descriptor requests at once"));
                    return self.send_control(&Control::failed(wire::C_FD_NO, req, &e));
                }
                let r = spawn(format!("p2p{}-fd", self.id), move || {
                    if let Err(e) = me.serve_fd(req, mr) {
                        let _ = me.send_control(&Control::failed(wire::C_FD_NO, req, &e));
                    }
                    me.fd_serving.fetch_sub(1, Ordering::SeqCst);
                });
                if let Err(e) = r {
                    self.fd_serving.fetch_sub(1, Ordering::SeqCst);
                    self.send_control(&Control::failed(wire::C_FD_NO, req, &e))?;
                }
            }
            wire::C_FD_REQ => {
                if let Err(e) = self.serve_fd(c.a, c.b) {
                    self.send_control(&Control::failed(wire::C_FD_NO, c.a, &e))?;
                }
            }
            wire::C_FD_NO => {
                let e = c.to_error().unwrap_or_else(|| Error::remote("descriptor refused"));
                lock(&self.shared.fds).insert((self.nonce, c.a), Err(e));
                self.shared.fds_cv.notify_all();
            }
            wire::C_READY => {}
            wire::C_BYE => {
                return Err(Error::remote(format!(
                    "the peer ({}) closed point-to-point connection {}",
                    self.peer_addr, self.id
                )))
            }
            k => return Err(Error::remote(format!("unexpected control frame {k}"))),
        }
        Ok(())
    }

    fn serve_fd(&self, req: u64, mr_id: u64) -> Result<()> {
        if !self.ipc {
            return Err(Error::invalid_usage("descriptors are only passed between endpoints of one host"));
        }
        let mr = self
            .shared
            .mr(mr_id)
            .filter(|m| m.advertised.load(Ordering::SeqCst) || m.posted.load(Ordering::SeqCst))
            .ok_or_else(|| Error::invalid_argument(format!("memory region {mr_id} is not registered and exposed")))?;
        let alloc = mr.alloc.as_ref().ok_or_else(|| {
            Error::invalid_argument(format!("memory region {mr_id} is not in shareable (SymmetricMemory) memory"))
        })?;
        let fd = alloc.export_fd()?;
        let header = crate::window::fd_passing::Header {
            magic: self.nonce as u128,
            seq: req,
            from_rank: alloc.addr(),
            alloc_size: alloc.size() as u64,
        };
        let deadline = Instant::now() + self.shared.config.op_timeout;
        use std::os::fd::AsFd;
        crate::window::fd_passing::send_fd(
            &unix_name(self.peer_token),
            &header,
            fd.as_fd(),
            deadline,
            &self.shared.shutdown,
        )
    }

    /// Finishes receive `seq` if all its bytes are in.
    fn recv_done(st: &mut State, seq: u64) {
        let done = st.recvs.get(&seq).is_some_and(|s| s.expected == Some(s.landed));
        if done {
            if let Some(s) = st.recvs.remove(&seq) {
                s.op.finish(match s.error {
                    Some(e) => Err(e),
                    None => Ok(s.landed as usize),
                });
            }
        }
    }

    /// The acknowledgement of write `seq` if all its bytes are in.
    fn write_done(st: &mut State, seq: u64) -> Option<Control> {
        let done = st.writes_in.get(&seq).is_some_and(|w| w.expected == Some(w.landed));
        if !done {
            return None;
        }
        let w = st.writes_in.remove(&seq)?;
        Some(match w.error {
            Some(e) => Control::failed(wire::C_WRITE_ACK, seq, &e),
            None => Control::new(wire::C_WRITE_ACK, seq, w.landed, 0, 0),
        })
    }

    // ---- data sockets ----

    fn writer_loop(
        self: Arc<Self>,
        mut sock: TcpStream,
        rx: mpsc::Receiver<Job>,
        bounce: HostMappedBuffer,
        stream: Stream,
    ) {
        for job in rx {
            if let Some(e) = self.error() {
                if let Some((op, _)) = &job.op {
                    op.finish(Err(e));
                }
                continue;
            }
            match self.emit(&job, &mut sock, &bounce, &stream) {
                Ok(()) => {
                    if let Some((op, total)) = &job.op {
                        if op.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
                            op.finish(Ok(*total));
                        }
                    }
                }
                Err(e) => {
                    if let Some((op, _)) = &job.op {
                        op.finish(Err(e.clone()));
                    }
                    self.fail(e);
                }
            }
        }
    }

    fn emit(&self, job: &Job, sock: &mut TcpStream, bounce: &HostMappedBuffer, stream: &Stream) -> Result<()> {
        let g = job.mr.hold()?;
        let len = job.hdr.len as usize;
        let io = |e| wire::io_err("sending data", e);
        sock.write_all(&job.hdr.encode()).map_err(io)?;
        if job.mr.host {
            // SAFETY: `src .. src + len` lies in the registered host region
            // (checked when the transfer was submitted), valid while it is
            // registered, which `g` holds.
            let src = unsafe { std::slice::from_raw_parts(job.src as *const u8, len) };
            sock.write_all(src).map_err(io)?;
        } else {
            // SAFETY: the bounce buffer is this thread's alone, `bounce.len()` bytes.
            let buf = unsafe { std::slice::from_raw_parts_mut(bounce.host_ptr(), bounce.len()) };
            let mut off = 0;
            while off < len {
                let n = buf.len().min(len - off);
                stream.read_raw(job.src + off as u64, &mut buf[..n])?;
                sock.write_all(&buf[..n]).map_err(io)?;
                off += n;
            }
        }
        drop(g);
        Ok(())
    }

    fn reader_loop(self: Arc<Self>, sock: TcpStream, bounce: HostMappedBuffer, stream: Stream) {
        let mut r = BufReader::with_capacity(256 << 10, sock);
        loop {
            let mut h = [0u8; wire::DATA_BYTES];
            let mut got = 0;
            while got < h.len() {
                match r.read(&mut h[got..]) {
                    Ok(0) => {
                        let e = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                        self.fail(wire::io_err(
                            &format!("point-to-point connection {} to {}", self.id, self.peer_addr),
                            e,
                        ));
                        return;
                    }
                    Ok(n) => got += n,
                    // Idle between frames: keep waiting (the connection's
                    // failure shuts the socket, which ends the wait).
                    Err(e)
                        if got == 0
                            && matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.fail(wire::io_err(
                            &format!("point-to-point connection {} to {}", self.id, self.peer_addr),
                            e,
                        ));
                        return;
                    }
                }
            }
            let r2 = DataHeader::decode(&h).and_then(|hdr| self.on_data(hdr, &mut r, &bounce, &stream));
            if let Err(e) = r2 {
                self.fail(e);
                return;
            }
        }
    }

    /// Lands one data frame; `Err` only for what breaks the connection.
    fn on_data(&self, h: DataHeader, r: &mut impl Read, bounce: &HostMappedBuffer, stream: &Stream) -> Result<()> {
        match h.kind {
            wire::D_SEND => {
                let dest = {
                    let st = lock(&self.st);
                    match st.recvs.get(&h.seq) {
                        Some(s) if h.addr.checked_add(h.len).is_some_and(|e| e <= s.max_len) => {
                            Some((s.mr.clone(), s.addr + h.addr))
                        }
                        Some(_) => None,
                        None => {
                            return Err(Error::remote(format!(
                                "peer sent data for receive {} that was not posted",
                                h.seq
                            )))
                        }
                    }
                };
                let res = match dest {
                    Some((mr, dst)) => land(&mr, dst, h.len, r, bounce, stream)?,
                    None => {
                        drain(r, h.len, bounce)?;
                        Err(Error::remote("peer sent data past the end of the receive region"))
                    }
                };
                let mut st = lock(&self.st);
                if let Some(s) = st.recvs.get_mut(&h.seq) {
                    s.landed += h.len;
                    if let Err(e) = res {
                        s.error.get_or_insert(e);
                    }
                }
                Self::recv_done(&mut st, h.seq);
            }
            wire::D_WRITE => {
                let res = match self.shared.checked_mr(h.mr, h.addr, h.len) {
                    Ok(mr) => land(&mr, h.addr, h.len, r, bounce, stream)?,
                    Err(e) => {
                        drain(r, h.len, bounce)?;
                        Err(e)
                    }
                };
                let mut st = lock(&self.st);
                let w = st.writes_in.entry(h.seq).or_default();
                w.landed += h.len;
                if let Err(e) = res {
                    w.error.get_or_insert(e);
                }
                let ack = Self::write_done(&mut st, h.seq);
                drop(st);
                if let Some(ack) = ack {
                    self.send_control(&ack)?;
                }
            }
            _ => {
                let dest = {
                    let st = lock(&self.st);
                    match st.reads.get(&h.seq) {
                        Some(s) if h.addr.checked_add(h.len).is_some_and(|e| e <= s.len) => {
                            Some((s.mr.clone(), s.addr + h.addr))
                        }
                        Some(_) => return Err(Error::remote("peer sent read data past the end of the request")),
                        None => None,
                    }
                };
                let res = match dest {
                    Some((mr, dst)) => land(&mr, dst, h.len, r, bounce, stream)?,
                    // A read that already failed (its op is gone): drop the bytes.
                    None => {
                        drain(r, h.len, bounce)?;
                        return Ok(());
                    }
                };
                let mut st = lock(&self.st);
                let done = match st.reads.get_mut(&h.seq) {
                    Some(s) => {
                        s.landed += h.len;
                        if let Err(e) = res {
                            s.error.get_or_insert(e);
                        }
                        s.landed == s.len
                    }
                    None => false,
                };
                if done {
                    if let Some(s) = st.reads.remove(&h.seq) {
                        s.op.finish(match s.error {
                            Some(e) => Err(e),
                            None => Ok(s.len as usize),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Reads and drops `len` bytes.
fn drain(r: &mut impl Read, len: u64, bounce: &HostMappedBuffer) -> Result<()> {
    // SAFETY: the bounce buffer is this thread's alone, `bounce.len()` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(bounce.host_ptr(), bounce.len()) };
    let mut left = len as usize;
    while left > 0 {
        let n = buf.len().min(left);
        r.read_exact(&mut buf[..n]).map_err(|e| wire::io_err("receiving data", e))?;
        left -= n;
    }
    Ok(())
}

/// Reads `len` bytes from `r` into `dst` (in region `mr`). The outer error
/// breaks the connection (the socket failed); the inner one is the
/// transfer's (the region went away, a device copy failed): the bytes are
/// consumed either way.
fn land(
    mr: &MrInner,
    dst: u64,
    len: u64,
    r: &mut impl Read,
    bounce: &HostMappedBuffer,
    stream: &Stream,
) -> Result<Result<()>> {
    let g = match mr.hold() {
        Ok(g) => g,
        Err(e) => {
            drain(r, len, bounce)?;
            return Ok(Err(e));
        }
    };
    let len = len as usize;
    let io = |e| wire::io_err("receiving data", e);
    if mr.host {
        // SAFETY: `dst .. dst + len` lies in the registered host region
        // (checked by the caller against the region's span), valid while
        // registered, which `g` holds; only this transfer writes there.
        let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
        r.read_exact(d).map_err(io)?;
        return Ok(Ok(()));
    }
    // SAFETY: the bounce buffer is this thread's alone, `bounce.len()` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(bounce.host_ptr(), bounce.len()) };
    let mut off = 0;
    let mut res = Ok(());
    while off < len {
        let n = buf.len().min(len - off);
        r.read_exact(&mut buf[..n]).map_err(io)?;
        if res.is_ok() {
            res = stream.write_raw(dst + off as u64, &buf[..n]);
        }
        off += n;
    }
    drop(g);
    Ok(res)
}
