//! The bootstrap root: rendezvous of one job's ranks, then their hub.
//!
//! Threads: one accepts connections; one per connection reads frames (with a
//! read timeout until its `Hello`); one owns all job state and does every
//! write. They talk through a channel, so the state needs no lock and a slow
//! or malicious connection can only ever hurt itself.

use super::unique_id::UniqueId;
use super::wire::{self, CollOp, Msg, RejectCode};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a new connection may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a write to a rank may block before that rank counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A handle on a running bootstrap root.
///
/// The root runs on its own threads and keeps running when the handle is
/// dropped; it exits once every rank of its job has finalized or
/// disconnected. The handle only observes it.
#[derive(Clone, Debug)]
pub struct Root {
    id: UniqueId,
    status: Arc<RootStatus>,
}

#[derive(Debug, Default)]
struct RootStatus {
    registered: AtomicUsize,
    finished: AtomicBool,
}

impl Root {
    /// Binds `bind` (port 0 = ephemeral) and starts serving ranks that present `magic`.
    ///
    /// When `bind` is an unspecified address (`0.0.0.0`), the id advertises
    /// loopback; bind a concrete address for ranks on other hosts.
    ///
    /// Errors: [`Error::SystemError`] when the address cannot be bound.
    pub fn spawn(bind: SocketAddr, magic: u128) -> Result<Root> {
        let listener =
            TcpListener::bind(bind).map_err(|e| Error::system(format!("binding bootstrap root to {bind}"), e))?;
        let mut addr = listener.local_addr().map_err(|e| Error::system("bootstrap root address", e))?;
        if addr.ip().is_unspecified() {
            addr.set_ip(if addr.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let id = UniqueId::from_parts(addr, magic);
        let status = Arc::new(RootStatus::default());
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        {
            let (tx, stop, conns) = (tx.clone(), stop.clone(), conns.clone());
            std::thread::Builder::new()
                .name("devcomm-root-accept".into())
                .spawn(move || accept_loop(listener, tx, stop, conns))
                .map_err(|e| Error::system("spawning bootstrap root thread", e))?;
        }
        {
            let status = status.clone();
            let job = Job::new(magic, status);
            std::thread::Builder::new()
                .name("devcomm-root".into())
                .spawn(move || {
                    job.run(rx);
                    stop.store(true, Ordering::SeqCst);
                    // Wake the accept loop, then close every connection still open.
                    let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
                    if let Ok(c) = conns.lock() {
                        for s in c.iter() {
                            let _ = s.shutdown(Shutdown::Both);
                        }
                    }
                    drop(tx);
                })
                .map_err(|e| Error::system("spawning bootstrap root thread", e))?;
        }
        tracing::debug!(%id, "bootstrap root listening");
        Ok(Root { id, status })
    }

    /// The id ranks use to reach this root.
    pub fn id(&self) -> &UniqueId {
        &self.id
    }

    /// How many ranks have joined (their `Hello` accepted) so far.
    pub fn registered_ranks(&self) -> usize {
        self.status.registered.load(Ordering::SeqCst)
    }

    /// Whether the root has exited (its job finalized, failed, or all ranks left).
    pub fn is_finished(&self) -> bool {
        self.status.finished.load(Ordering::SeqCst)
    }
}

enum Event {
    Hello { conn: u64, stream: TcpStream, magic: u128, nranks: u32, rank: u32, pid: u32, info: Vec<u8> },
    Msg { conn: u64, msg: Msg },
    Closed { conn: u64, why: String },
}

fn accept_loop(listener: TcpListener, tx: Sender<Event>, stop: Arc<AtomicBool>, conns: Arc<Mutex<Vec<TcpStream>>>) {
    let mut next_conn = 0u64;
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        next_conn += 1;
        let conn = next_conn;
        if let (Ok(clone), Ok(mut c)) = (stream.try_clone(), conns.lock()) {
            c.push(clone);
        }
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("devcomm-root-conn{conn}"))
            .spawn(move || conn_reader(conn, stream, tx));
        if spawned.is_err() {
            tracing::warn!("bootstrap root could not spawn a connection thread");
        }
    }
}

/// Reads one connection: a `Hello` within [`HELLO_TIMEOUT`], then frames until EOF.
/// Anything that is not a well-formed `Hello` first drops the connection.
fn conn_reader(conn: u64, mut stream: TcpStream, tx: Sender<Event>) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let hello = match wire::read_frame(&mut stream) {
        Ok(Some(Msg::Hello { magic, nranks, rank, pid, info })) => (magic, nranks, rank, pid, info),
        Ok(Some(other)) => {
            tracing::warn!(conn, "bootstrap root: first message is not Hello: {other:?}; dropping connection");
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(conn, "bootstrap root: dropping connection: {e}");
            // Tell a devcomm peer of another version why; junk gets the same bytes and a close.
            if e.message().contains("protocol version") {
                let _ = wire::write_frame(
                    &mut stream,
                    &Msg::Reject { code: RejectCode::InvalidArgument, msg: e.message().into() },
                );
            }
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let _ = stream.set_read_timeout(None);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let (magic, nranks, rank, pid, info) = hello;
    if tx.send(Event::Hello { conn, stream: write_half, magic, nranks, rank, pid, info }).is_err() {
        return;
    }
    loop {
        match wire::read_frame(&mut stream) {
            Ok(Some(msg)) => {
                if tx.send(Event::Msg { conn, msg }).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = tx.send(Event::Closed { conn, why: "connection closed".into() });
                return;
            }
            Err(e) => {
                let _ = stream.shutdown(Shutdown::Both);
                let _ = tx.send(Event::Closed { conn, why: e.message().to_string() });
                return;
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Alive,
    Finalized,
    Aborted,
    Gone,
}

struct Slot {
    conn: u64,
    stream: TcpStream,
    pid: u32,
    info: Vec<u8>,
    state: SlotState,
}

struct PendingColl {
    op: CollOp,
    parts: Vec<Option<Vec<u8>>>,
    count: usize,
}

struct Job {
    magic: u128,
    my_pid: u32,
    status: Arc<RootStatus>,
    nranks: Option<usize>,
    slots: Vec<Option<Slot>>,
    by_conn: HashMap<u64, usize>,
    ready: bool,
    failed: Option<String>,
    colls: BTreeMap<u64, PendingColl>,
    finalize_sent: bool,
}

impl Job {
    fn new(magic: u128, status: Arc<RootStatus>) -> Job {
        Job {
            magic,
            my_pid: std::process::id(),
            status,
            nranks: None,
            slots: Vec::new(),
            by_conn: HashMap::new(),
            ready: false,
            failed: None,
            colls: BTreeMap::new(),
            finalize_sent: false,
        }
    }

    fn run(mut self, rx: Receiver<Event>) {
        while let Ok(ev) = rx.recv() {
            match ev {
                Event::Hello { conn, stream, magic, nranks, rank, pid, info } => {
                    self.on_hello(conn, stream, magic, nranks, rank, pid, info)
                }
                Event::Msg { conn, msg } => self.on_msg(conn, msg),
                Event::Closed { conn, why } => self.on_closed(conn, &why),
            }
            if self.done() {
                break;
            }
        }
        self.status.finished.store(true, Ordering::SeqCst);
        tracing::debug!("bootstrap root exits");
    }

    /// Done once a rank has joined and no joined rank is still connected, or
    /// after everyone finalized.
    fn done(&self) -> bool {
        if self.finalize_sent {
            return true;
        }
        let mut any = false;
        for s in self.slots.iter().flatten() {
            any = true;
            if s.state != SlotState::Gone {
                return false;
            }
        }
        any
    }

    #[allow(clippy::too_many_arguments)]
    fn on_hello(
        &mut self,
        conn: u64,
        mut stream: TcpStream,
        magic: u128,
        nranks: u32,
        rank: u32,
        pid: u32,
        info: Vec<u8>,
    ) {
        let reject = |stream: &mut TcpStream, code: RejectCode, msg: String| {
            tracing::warn!(conn, "bootstrap root rejects a rank: {msg}");
            let _ = wire::write_frame(stream, &Msg::Reject { code, msg });
            let _ = stream.shutdown(Shutdown::Both);
        };
        if magic != self.magic {
            return reject(
                &mut stream,
                RejectCode::InvalidArgument,
                "unique id does not belong to this root (magic mismatch: the id is stale or from another job)".into(),
            );
        }
        let (nranks, rank) = (nranks as usize, rank as usize);
        if nranks == 0 || rank >= nranks {
            return reject(
                &mut stream,
                RejectCode::InvalidArgument,
                format!("rank {rank} is out of range for {nranks} ranks"),
            );
        }
        if let Some(n) = self.nranks {
            if n != nranks {
                return reject(
                    &mut stream,
                    RejectCode::InvalidArgument,
                    format!("rank {rank} says the job has {nranks} ranks, but the ranks already joined say {n}"),
                );
            }
        }
        if let Some(why) = &self.failed {
            return reject(&mut stream, RejectCode::Remote, format!("the job already failed: {why}"));
        }
        if self.nranks.is_none() {
            self.nranks = Some(nranks);
            self.slots = (0..nranks).map(|_| None).collect();
        }
        if self.slots[rank].is_some() {
            return reject(&mut stream, RejectCode::InvalidUsage, format!("rank {rank} has already joined this job"));
        }
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        self.slots[rank] = Some(Slot { conn, stream, pid, info, state: SlotState::Alive });
        self.by_conn.insert(conn, rank);
        let joined = self.slots.iter().filter(|s| s.is_some()).count();
        self.status.registered.store(joined, Ordering::SeqCst);
        tracing::debug!(rank, joined, nranks, "bootstrap root: rank joined");
        if joined == nranks {
            self.ready = true;
            let infos = self.slots.iter().flatten().map(|s| s.info.clone()).collect();
            self.send_all(&Msg::Ready { infos }, None);
        }
    }

    fn on_msg(&mut self, conn: u64, msg: Msg) {
        let Some(&rank) = self.by_conn.get(&conn) else {
            return;
        };
        match msg {
            Msg::Coll { seq, op, data } => self.on_coll(rank, seq, op, data),
            Msg::Abort { reason } => {
                if let Some(s) = self.slots[rank].as_mut() {
                    s.state = SlotState::Aborted;
                }
                let r = rank as u32;
                self.failed.get_or_insert_with(|| format!("rank {rank} aborted: {reason}"));
                self.send_all(&Msg::PeerAborted { rank: r, reason }, Some(rank));
            }
            Msg::Finalize => {
                if let Some(s) = self.slots[rank].as_mut() {
                    if s.state == SlotState::Alive {
                        s.state = SlotState::Finalized;
                    }
                }
                self.maybe_finalize_done();
            }
            other => {
                let why = format!("protocol violation: unexpected {other:?}");
                self.drop_rank(rank, &why);
            }
        }
    }

    fn on_coll(&mut self, rank: usize, seq: u64, op: CollOp, data: Vec<u8>) {
        if !self.ready {
            return self.drop_rank(rank, "protocol violation: collective before every rank joined");
        }
        if self.failed.is_some() {
            // Every rank already heard why; the rank side fails this op locally.
            return;
        }
        let n = self.slots.len();
        let p = self.colls.entry(seq).or_insert_with(|| PendingColl { op, parts: vec![None; n], count: 0 });
        if p.parts[rank].is_some() {
            return self
                .drop_rank(rank, &format!("protocol violation: two contributions to bootstrap collective {seq}"));
        }
        let mismatch = p.op != op;
        p.parts[rank] = Some(data);
        p.count += 1;
        if mismatch {
            let msg = format!("ranks called different bootstrap collectives as number {seq} ({:?} and {op:?})", p.op);
            self.colls.remove(&seq);
            return self.send_all(&Msg::CollError { seq, msg }, None);
        }
        if p.count < n {
            return;
        }
        let Some(p) = self.colls.remove(&seq) else {
            return;
        };
        let parts: Vec<Vec<u8>> = p.parts.into_iter().map(Option::unwrap_or_default).collect();
        let data = match op {
            CollOp::Allgather => parts,
            CollOp::Broadcast { root } => match parts.into_iter().nth(root as usize) {
                Some(d) => vec![d],
                None => {
                    let msg = format!("broadcast root {root} is out of range for {n} ranks");
                    return self.send_all(&Msg::CollError { seq, msg }, None);
                }
            },
        };
        let total: usize = data.iter().map(|d| d.len() + 4).sum();
        if total + 16 > wire::MAX_FRAME_LEN {
            let msg = format!("bootstrap collective {seq} result of {total} bytes exceeds the frame limit");
            return self.send_all(&Msg::CollError { seq, msg }, None);
        }
        self.send_all(&Msg::CollResult { seq, data }, None);
    }

    fn maybe_finalize_done(&mut self) {
        if self.finalize_sent || !self.ready {
            return;
        }
        let all = self.slots.iter().flatten().all(|s| matches!(s.state, SlotState::Finalized | SlotState::Gone));
        let some = self.slots.iter().flatten().any(|s| s.state == SlotState::Finalized);
        if all && some && self.failed.is_none() {
            self.finalize_sent = true;
            self.send_all(&Msg::FinalizeDone, None);
        }
    }

    fn on_closed(&mut self, conn: u64, why: &str) {
        let Some(&rank) = self.by_conn.get(&conn) else {
            return;
        };
        let Some(slot) = self.slots[rank].as_mut() else {
            return;
        };
        if slot.conn != conn {
            return;
        }
        let prev = slot.state;
        slot.state = SlotState::Gone;
        match prev {
            SlotState::Alive => {
                let reason = format!("rank {rank} lost its bootstrap connection before finalizing ({why}): process died or communicator destroyed");
                tracing::debug!("bootstrap root: {reason}");
                self.failed.get_or_insert_with(|| reason.clone());
                self.send_all(&Msg::PeerFailed { rank: rank as u32, reason }, Some(rank));
            }
            SlotState::Finalized => self.maybe_finalize_done(),
            SlotState::Aborted | SlotState::Gone => {}
        }
    }

    /// Closes `rank`'s connection; its reader reports `Closed`, which tells the others.
    fn drop_rank(&mut self, rank: usize, why: &str) {
        tracing::warn!(rank, "bootstrap root drops a rank: {why}");
        if let Some(s) = self.slots[rank].as_ref() {
            let _ = s.stream.shutdown(Shutdown::Both);
        }
    }

    /// Sends `msg` to every connected rank but `except`; ranks in the root's
    /// own process last, so they cannot exit before the others were told.
    fn send_all(&mut self, msg: &Msg, except: Option<usize>) {
        let buf = match msg.encode() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("bootstrap root cannot encode {msg:?}: {e}");
                return;
            }
        };
        let mut order: Vec<usize> = (0..self.slots.len()).filter(|&r| Some(r) != except).collect();
        order.sort_by_key(|&r| self.slots[r].as_ref().is_some_and(|s| s.pid == self.my_pid));
        for r in order {
            let Some(s) = self.slots[r].as_mut() else {
                continue;
            };
            if s.state == SlotState::Gone || s.state == SlotState::Aborted {
                continue;
            }
            use std::io::Write;
            if let Err(e) = s.stream.write_all(&buf) {
                tracing::warn!(rank = r, "bootstrap root cannot write to rank: {e}");
                let _ = s.stream.shutdown(Shutdown::Both);
            }
        }
    }
}
