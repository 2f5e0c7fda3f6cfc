//! The rank side of the bootstrap: connect, join, then host-side collectives
//! through the root, with a background reader that records remote failures.

use super::unique_id::UniqueId;
use super::wire::{self, CollOp, Msg};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pause between connection attempts while the root is not up yet.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Writes to the root never block longer than this.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Parameters of [`BootstrapClient::connect`].
#[derive(Clone, Debug)]
pub struct JoinParams {
    /// Number of ranks in the job.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Opaque bytes about this rank, handed to every rank.
    pub info: Vec<u8>,
    /// Bound on connecting plus waiting for every rank to join.
    pub timeout: Duration,
    /// Bound on each later collective.
    pub op_timeout: Duration,
}

#[derive(Default)]
struct State {
    results: HashMap<u64, Result<Vec<Vec<u8>>>>,
    /// First remote failure (peer died, peer aborted, root lost).
    error: Option<Error>,
    /// Set once this rank aborted: every later op fails with it.
    local_abort: Option<Error>,
    finalize_done: bool,
    /// This side is closing (finalize, abort, destroy): EOF is expected.
    closing: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    abort_flag: Arc<AtomicBool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, e: Error) {
        let mut st = self.lock();
        if st.error.is_none() && !st.finalize_done && st.local_abort.is_none() {
            tracing::debug!("bootstrap: {e}");
            st.error = Some(e);
            self.abort_flag.store(true, Ordering::SeqCst);
        }
        drop(st);
        self.cv.notify_all();
    }
}

/// One rank's live connection to its bootstrap root.
pub struct BootstrapClient {
    rank: usize,
    nranks: usize,
    root: UniqueId,
    op_timeout: Duration,
    writer: Mutex<TcpStream>,
    shared: Arc<Shared>,
    next_seq: AtomicU64,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for BootstrapClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapClient")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("root", &self.root)
            .finish()
    }
}

impl BootstrapClient {
    /// Connects to the root of `id` (retrying until `p.timeout` while it is
    /// not listening yet), joins as `p.rank` of `p.nranks`, and waits until
    /// every rank has joined. Returns the client and every rank's info.
    ///
    /// `on_connected` sees the socket as soon as it exists, so a caller can
    /// shut it down from another thread to cancel the wait.
    /// `abort_flag` is set when a remote failure is recorded.
    ///
    /// Errors: [`Error::InvalidArgument`] for bad arguments or an id of
    /// another job; [`Error::InvalidUsage`] for a rank already taken;
    /// [`Error::RemoteError`] when another rank fails during the wait or the
    /// root goes away; [`Error::Timeout`] when `p.timeout` passes.
    pub fn connect(
        id: &UniqueId,
        p: JoinParams,
        abort_flag: Arc<AtomicBool>,
        on_connected: &dyn Fn(&TcpStream),
    ) -> Result<(BootstrapClient, Vec<Vec<u8>>)> {
        if p.nranks == 0 {
            return Err(Error::invalid_argument("nranks must be at least 1"));
        }
        if p.nranks > u32::MAX as usize {
            return Err(Error::invalid_argument(format!("nranks {} is too large", p.nranks)));
        }
        if p.rank >= p.nranks {
            return Err(Error::invalid_argument(format!("rank {} is out of range for {} ranks", p.rank, p.nranks)));
        }
        let start = Instant::now();
        let deadline = start + p.timeout;
        let mut stream = connect_with_retry(id, deadline, p.timeout)?;
        on_connected(&stream);
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        let hello = Msg::Hello {
            magic: id.magic(),
            nranks: p.nranks as u32,
            rank: p.rank as u32,
            pid: std::process::id(),
            info: p.info.clone(),
        };
        wire::write_frame(&mut stream, &hello)
            .map_err(|e| e.context(format!("sending hello to bootstrap root {}", id.addr())))?;
        let infos = {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(join_timeout(&p, start));
            }
            stream.set_read_timeout(Some(left)).map_err(|e| Error::system("setting socket timeout", e))?;
            match wire::read_frame(&mut stream) {
                Ok(Some(Msg::Ready { infos })) => infos,
                Ok(Some(Msg::Reject { code, msg })) => return Err(code.to_error(&msg)),
                Ok(Some(Msg::PeerFailed { rank, reason })) => {
                    return Err(Error::remote(format!("rank {rank} failed while ranks were joining: {reason}")))
                }
                Ok(Some(Msg::PeerAborted { rank, reason })) => {
                    return Err(Error::remote(format!("rank {rank} aborted while ranks were joining: {reason}")))
                }
                Ok(Some(other)) => {
                    return Err(Error::remote(format!("bootstrap root sent {other:?} before every rank joined")))
                }
                Ok(None) => {
                    return Err(Error::remote(format!(
                        "bootstrap root {} closed the connection while ranks were joining",
                        id.addr()
                    )))
                }
                Err(Error::Timeout(_)) => return Err(join_timeout(&p, start)),
                Err(e) => return Err(e.context(format!("waiting for ranks to join at bootstrap root {}", id.addr()))),
            }
        };
        if infos.len() != p.nranks {
            return Err(Error::remote(format!(
                "bootstrap root sent {} rank infos for {} ranks",
                infos.len(),
                p.nranks
            )));
        }
        stream.set_read_timeout(None).map_err(|e| Error::system("setting socket timeout", e))?;
        let reader_stream = stream.try_clone().map_err(|e| Error::system("cloning bootstrap socket", e))?;
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), cv: Condvar::new(), abort_flag });
        let reader = {
            let shared = shared.clone();
            let root = *id;
            std::thread::Builder::new()
                .name(format!("devcomm-bootstrap-r{}", p.rank))
                .spawn(move || reader_loop(reader_stream, shared, root))
                .map_err(|e| Error::system("spawning bootstrap reader thread", e))?
        };
        let client = BootstrapClient {
            rank: p.rank,
            nranks: p.nranks,
            root: *id,
            op_timeout: p.op_timeout,
            writer: Mutex::new(stream),
            shared,
            next_seq: AtomicU64::new(0),
            reader: Mutex::new(Some(reader)),
        };
        Ok((client, infos))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The local address this rank uses to reach its root (an address the
    /// root's network can reach back, e.g. for a new root after a split).
    pub fn local_ip(&self) -> Result<std::net::IpAddr> {
        let w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        w.local_addr().map(|a| a.ip()).map_err(|e| Error::system("bootstrap socket address", e))
    }

    /// The first recorded failure, if any (remote failure, or this rank's abort).
    pub fn error(&self) -> Option<Error> {
        let st = self.shared.lock();
        st.local_abort.clone().or_else(|| st.error.clone())
    }

    /// Whether `finalize` completed.
    pub fn is_finalized(&self) -> bool {
        self.shared.lock().finalize_done
    }

    /// Whether this rank aborted.
    pub fn is_aborted(&self) -> bool {
        self.shared.lock().local_abort.is_some()
    }

    fn check(&self) -> Result<()> {
        let st = self.shared.lock();
        if let Some(e) = st.local_abort.clone().or_else(|| st.error.clone()) {
            return Err(e);
        }
        if st.finalize_done || st.closing {
            return Err(Error::invalid_usage("the communicator was finalized or destroyed"));
        }
        Ok(())
    }

    fn send(&self, msg: &Msg) -> Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        wire::write_frame(&mut *w, msg).map_err(|e| {
            let e = Error::remote(format!("lost connection to bootstrap root {}: {}", self.root.addr(), e.message()));
            self.shared.fail(e.clone());
            e
        })
    }

    fn collective(&self, op: CollOp, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.check()?;
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        self.send(&Msg::Coll { seq, op, data: data.to_vec() })?;
        let deadline = Instant::now() + self.op_timeout;
        let mut st = self.shared.lock();
        loop {
            if let Some(r) = st.results.remove(&seq) {
                return r;
            }
            if let Some(e) = st.local_abort.clone().or_else(|| st.error.clone()) {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "bootstrap collective {seq} on rank {} did not complete within {:?} (another rank has not called it)",
                    self.rank, self.op_timeout
                )));
            }
            st = self.shared.cv.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Every rank's `data`, by rank.
    pub fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.collective(CollOp::Allgather, data)
    }

    /// Rank `root`'s `data` (other ranks' `data` is ignored).
    pub fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        if root >= self.nranks {
            return Err(Error::invalid_argument(format!(
                "broadcast root {root} is out of range for {} ranks",
                self.nranks
            )));
        }
        let mine: &[u8] = if root == self.rank { data } else { &[] };
        let mut v = self.collective(CollOp::Broadcast { root: root as u32 }, mine)?;
        if v.len() != 1 {
            return Err(Error::remote(format!("bootstrap broadcast returned {} parts", v.len())));
        }
        Ok(v.remove(0))
    }

    /// Returns once every rank called it.
    pub fn barrier(&self) -> Result<()> {
        self.collective(CollOp::Allgather, &[]).map(drop)
    }

    /// Collective clean shutdown: returns once every rank finalized.
    pub fn finalize(&self) -> Result<()> {
        self.check()?;
        self.send(&Msg::Finalize)?;
        let deadline = Instant::now() + self.op_timeout;
        let mut st = self.shared.lock();
        loop {
            if st.finalize_done {
                st.closing = true;
                return Ok(());
            }
            if let Some(e) = st.local_abort.clone().or_else(|| st.error.clone()) {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "finalize on rank {} timed out after {:?}",
                    self.rank, self.op_timeout
                )));
            }
            st = self.shared.cv.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Tells the root (which tells every other rank) that this rank aborts,
    /// and fails this rank's pending and later operations. Does not block
    /// beyond one small socket write.
    pub fn abort(&self, reason: &str) {
        {
            let mut st = self.shared.lock();
            if st.local_abort.is_some() {
                return;
            }
            st.local_abort = Some(Error::invalid_usage(format!("rank {} aborted this communicator", self.rank)));
            st.closing = true;
        }
        self.shared.abort_flag.store(true, Ordering::SeqCst);
        self.shared.cv.notify_all();
        if let Ok(mut w) = self.writer.try_lock() {
            let _ = w.set_write_timeout(Some(Duration::from_millis(500)));
            let _ = wire::write_frame(&mut *w, &Msg::Abort { reason: reason.to_string() });
        }
    }

    /// Non-collective teardown: closes the connection and joins the reader.
    pub fn shutdown(&self) {
        self.shared.lock().closing = true;
        self.shared.cv.notify_all();
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(Shutdown::Both);
        }
        let handle = self.reader.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for BootstrapClient {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn join_timeout(p: &JoinParams, start: Instant) -> Error {
    Error::Timeout(format!(
        "rank {} of {}: not every rank joined the bootstrap within {:?} (waited {:?})",
        p.rank,
        p.nranks,
        p.timeout,
        start.elapsed()
    ))
}

fn connect_with_retry(id: &UniqueId, deadline: Instant, timeout: Duration) -> Result<TcpStream> {
    let mut last_err;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout(format!(
                "could not reach the bootstrap root at {} within {timeout:?}",
                id.addr()
            )));
        }
        match TcpStream::connect_timeout(&id.addr(), left.min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(e) => last_err = e,
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout(format!(
                "could not reach the bootstrap root at {} within {timeout:?}: {last_err}",
                id.addr()
            )));
        }
        std::thread::sleep(RETRY_PAUSE.min(left));
    }
}

fn reader_loop(mut stream: TcpStream, shared: Arc<Shared>, root: UniqueId) {
    loop {
        match wire::read_frame(&mut stream) {
            Ok(Some(Msg::CollResult { seq, data })) => {
                shared.lock().results.insert(seq, Ok(data));
                shared.cv.notify_all();
            }
            Ok(Some(Msg::CollError { seq, msg })) => {
                shared.lock().results.insert(seq, Err(Error::invalid_usage(msg)));
                shared.cv.notify_all();
            }
            Ok(Some(Msg::PeerFailed { rank, reason })) => {
                shared.fail(Error::remote(format!("rank {rank} failed: {reason}")))
            }
            Ok(Some(Msg::PeerAborted { rank, reason })) => {
                shared.fail(Error::remote(format!("rank {rank} aborted: {reason}")))
            }
            Ok(Some(Msg::FinalizeDone)) => {
                let mut st = shared.lock();
                st.finalize_done = true;
                st.closing = true;
                drop(st);
                shared.cv.notify_all();
            }
            Ok(Some(other)) => {
                shared.fail(Error::remote(format!("bootstrap root {} sent an unexpected {other:?}", root.addr())));
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
            Ok(None) | Err(_) => {
                let closing = shared.lock().closing;
                if !closing {
                    shared.fail(Error::remote(format!(
                        "lost connection to the bootstrap root {} (the root's process died or closed it)",
                        root.addr()
                    )));
                }
                shared.cv.notify_all();
                return;
            }
        }
    }
}
