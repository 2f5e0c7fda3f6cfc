//! The RDMA (verbs) transport of point-to-point connections (cargo
//! feature `verbs`; see the [module docs](super) for the protocol).
//!
//! One device per endpoint ([`Rdma`]: protection domain, one completion
//! queue, a poller thread), one RC queue pair per connection ([`RcConn`]).
//! Every registered region ([`super::Mr`]) is registered with the device
//! too. The initiator posts RDMA WRITEs or READs of at most the port's
//! largest message; a transfer's last request (a flush READ after writes)
//! is signaled and carries the transfer's completion: the poller finishes
//! it, and for a send tells the receiver (`C_SEND`, "landed") over the
//! control socket. The device calls themselves are `devcomm-gin`'s
//! (`transport::verbs::rc`).

use super::link::{lock, ConnInner, MrInner, Op};
use super::wire::{self, Control};
use crate::error::{Error, Result};
use crate::gin::resources::from_gin_as;
use crate::runtime::Device;
use devcomm_gin::transport::verbs::plan::{split_wr_id, wr_id, SendQueue};
use devcomm_gin::transport::verbs::rc::{
    self, Completion, MrKeys, PostWr, QpRecord, RcNic, WrOpcode, ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ,
    ACCESS_REMOTE_WRITE,
};
use devcomm_gin::transport::verbs::{Dmabuf, VerbsConfig};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of the flush read that ends a transfer's writes (see the module docs of `p2p`).
const FLUSH_BYTES: u64 = 8;
/// Queue pairs the completion queue is sized for.
const MAX_CONNS: u32 = 256;

fn from_gin(e: devcomm_gin::GinHostError) -> Error {
    from_gin_as(e, "p2p verbs")
}

/// An endpoint's RDMA device.
pub(crate) struct Rdma {
    // Field order is drop order: the device (deregistering the scratch
    // word) goes before the scratch memory.
    nic: Mutex<Box<dyn RcNic>>,
    scratch: *mut u64,
    scratch_lkey: u32,
    limits: rc::DeviceLimits,
    config: VerbsConfig,
    conns: Mutex<HashMap<usize, Weak<RcConn>>>,
    /// Transfers in flight on every connection (the poller polls closely while any is).
    in_flight: AtomicUsize,
    poller: OnceLock<std::thread::Thread>,
}

// SAFETY: `scratch` is heap memory only the NIC writes (flush reads land
// there; the CPU never reads it), freed in `Drop` after the device; the
// device is behind a mutex.
unsafe impl Send for Rdma {}
// SAFETY: as above.
unsafe impl Sync for Rdma {}

impl Drop for Rdma {
    fn drop(&mut self) {
        let _ = self.nic.get_mut().map(|n| n.dereg(MrKeys { lkey: self.scratch_lkey, rkey: 0 }));
        // SAFETY: allocated by `Box::into_raw` in `with_nic`, freed once;
        // the device no longer names it (deregistered or destroyed above).
        drop(unsafe { Box::from_raw(self.scratch) });
    }
}

impl Rdma {
    /// Opens the RDMA device the `DEVCOMM_GIN_IB_*` variables name (or the
    /// first with an active port).
    ///
    /// Errors: [`Error::InvalidUsage`] naming what is missing (libibverbs,
    /// a device, an active port), [`Error::InvalidArgument`] for bad variables.
    pub(crate) fn open() -> Result<Arc<Rdma>> {
        let config = VerbsConfig::from_env().map_err(from_gin)?;
        let nic = rc::open(&config, MAX_CONNS).map_err(from_gin)?;
        Rdma::with_nic(nic, config)
    }

    /// The endpoint's device `nic` (the model NIC in tests).
    pub(crate) fn with_nic(mut nic: Box<dyn RcNic>, config: VerbsConfig) -> Result<Arc<Rdma>> {
        let scratch = Box::into_raw(Box::new([0u64; 1])) as *mut u64;
        // SAFETY: 8 bytes of heap memory owned by the `Rdma`, freed after
        // the device is dropped (see `Drop`).
        let keys = unsafe { nic.reg(scratch as u64, FLUSH_BYTES, None, ACCESS_LOCAL_WRITE) };
        let keys = match keys {
            Ok(k) => k,
            Err(e) => {
                // SAFETY: allocated above, never registered.
                drop(unsafe { Box::from_raw(scratch) });
                return Err(from_gin(e));
            }
        };
        let limits = nic.limits();
        tracing::info!(device = nic.name(), max_msg = limits.max_msg, depth = limits.depth, "p2p: RDMA device open");
        Ok(Arc::new(Rdma {
            nic: Mutex::new(nic),
            scratch,
            scratch_lkey: keys.lkey,
            limits,
            config,
            conns: Mutex::new(HashMap::new()),
            in_flight: AtomicUsize::new(0),
            poller: OnceLock::new(),
        }))
    }

    /// The device's name.
    pub(crate) fn name(&self) -> String {
        lock(&self.nic).name().to_string()
    }

    /// Registers a region: device memory through a dmabuf of its pages
    /// where the runtime gives one (GPUDirect RDMA without nvidia-peermem),
    /// else by address (host memory; the emulated runtime's device memory;
    /// CUDA memory with nvidia-peermem). Returns (lkey, rkey).
    ///
    /// # Safety
    /// `addr .. addr + len` stays allocated until [`Rdma::dereg`].
    pub(crate) unsafe fn reg(&self, device: &Device, addr: u64, len: usize, host: bool) -> Result<(u32, u32)> {
        const PAGE: u64 = 4096;
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
        let fd = if host {
            None
        } else {
            let base = addr & !(PAGE - 1);
            let end = (addr + len as u64).next_multiple_of(PAGE);
            match device.export_dmabuf(base, end - base) {
                Ok(fd) => fd.map(|fd| (fd, addr - base)),
                Err(e) => {
                    tracing::info!(error = %e, "p2p verbs: no dmabuf for {len} bytes at {addr:#x}; registering the address");
                    None
                }
            }
        };
        use std::os::fd::AsRawFd;
        let dmabuf = fd.as_ref().map(|(fd, offset)| Dmabuf { fd: fd.as_raw_fd(), offset: *offset });
        let mut nic = lock(&self.nic);
        // SAFETY: the caller's contract; the dmabuf fd is open until `fd` drops after the call.
        let keys = unsafe { nic.reg(addr, len as u64, dmabuf, access) }.map_err(from_gin)?;
        Ok((keys.lkey, keys.rkey))
    }

    /// Deregisters a region [`Rdma::reg`] registered.
    pub(crate) fn dereg(&self, keys: (u32, u32)) {
        if let Err(e) = lock(&self.nic).dereg(MrKeys { lkey: keys.0, rkey: keys.1 }) {
            tracing::warn!(error = %e, "p2p verbs: deregistering a region failed");
        }
    }

    /// A new queue pair and its record for the peer.
    pub(crate) fn new_qp(self: &Arc<Self>) -> Result<QpSetup> {
        let mut nic = lock(&self.nic);
        let (qp, caps) = nic.create_qp(self.limits.depth).map_err(from_gin)?;
        let psn = rc::random_psn(qp);
        let record = QpRecord { addr: nic.port(), qpn: caps.qpn, psn };
        Ok(QpSetup { rdma: Some(self.clone()), qp, psn, depth: caps.max_send_wr.max(2), record })
    }

    /// Starts the poller thread (until `shutdown`).
    pub(crate) fn start(self: &Arc<Self>, shutdown: Arc<AtomicBool>) -> Result<JoinHandle<()>> {
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("p2p-rdma-poll".into())
            .spawn(move || me.poll_loop(&shutdown))
            .map_err(|e| Error::system("spawning a thread", e))?;
        let _ = self.poller.set(h.thread().clone());
        Ok(h)
    }

    fn kick(&self) {
        if let Some(t) = self.poller.get() {
            t.unpark();
        }
    }

    /// Polls the completion queue and hands each completion to its
    /// connection; polls back to back while transfers are in flight.
    fn poll_loop(&self, shutdown: &AtomicBool) {
        let mut cs: Vec<Completion> = Vec::new();
        while !shutdown.load(Ordering::SeqCst) {
            cs.clear();
            let r = lock(&self.nic).poll(&mut cs);
            if let Err(e) = r {
                // The completion queue broke: every connection fails.
                let e = from_gin(e);
                let conns: Vec<_> = lock(&self.conns).values().filter_map(Weak::upgrade).collect();
                for c in conns {
                    c.broken(e.clone());
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            for c in &cs {
                let (qp, low) = split_wr_id(c.wr_id);
                let conn = lock(&self.conns).get(&qp).and_then(Weak::upgrade);
                match conn {
                    Some(conn) => conn.on_completion(c, low),
                    None => tracing::debug!(wr_id = c.wr_id, "p2p verbs: completion of a closed connection"),
                }
            }
            if cs.is_empty() {
                if self.in_flight.load(Ordering::SeqCst) > 0 {
                    std::thread::yield_now();
                } else {
                    std::thread::park_timeout(Duration::from_millis(5));
                }
            }
        }
    }
}

/// A queue pair made for a connection, not connected yet: destroyed when
/// dropped unless [`QpSetup::connect`] took it.
pub(crate) struct QpSetup {
    rdma: Option<Arc<Rdma>>,
    qp: usize,
    psn: u32,
    depth: u32,
    record: QpRecord,
}

impl Drop for QpSetup {
    fn drop(&mut self) {
        if let Some(r) = &self.rdma {
            let _ = lock(&r.nic).destroy_qp(self.qp);
        }
    }
}

impl QpSetup {
    /// This side's record, for the peer.
    pub(crate) fn record(&self) -> [u8; QpRecord::BYTES] {
        self.record.encode()
    }

    /// Connects the queue pair to the peer's record `remote`.
    ///
    /// Errors: [`Error::RemoteError`] for a malformed record; the device's
    /// refusal otherwise.
    pub(crate) fn connect(mut self, remote: &[u8]) -> Result<Arc<RcConn>> {
        let remote = QpRecord::decode(remote).map_err(|e| Error::remote(format!("the peer's {e}")))?;
        let Some(rdma) = self.rdma.clone() else {
            return Err(Error::internal("a queue pair connected twice"));
        };
        lock(&rdma.nic).connect_qp(self.qp, self.psn, &remote, &rdma.config).map_err(from_gin)?;
        self.rdma = None;
        let c = Arc::new(RcConn {
            qp: self.qp,
            st: Mutex::new(QpState {
                queue: SendQueue::new(self.depth, (self.depth / 4).max(1)),
                tracks: BTreeMap::new(),
                failed: None,
            }),
            room: Condvar::new(),
            conn: OnceLock::new(),
            rdma: rdma.clone(),
        });
        lock(&rdma.conns).insert(self.qp, Arc::downgrade(&c));
        Ok(c)
    }
}

/// What a transfer's last request finishes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// A send into the peer's receive `seq`: `C_SEND` goes out once done.
    Send(u64),
    /// A one-sided write.
    Write,
    /// A one-sided read.
    Read,
}

/// A transfer whose last request is in the send queue.
struct Track {
    op: Arc<Op>,
    mr: Arc<MrInner>,
    len: usize,
    kind: Kind,
}

struct QpState {
    queue: SendQueue,
    /// By the sequence number of their last request.
    tracks: BTreeMap<u64, Track>,
    failed: Option<Error>,
}

/// One connection's queue pair.
pub(crate) struct RcConn {
    qp: usize,
    st: Mutex<QpState>,
    room: Condvar,
    conn: OnceLock<Weak<ConnInner>>,
    rdma: Arc<Rdma>,
}

impl Drop for RcConn {
    fn drop(&mut self) {
        lock(&self.rdma.conns).remove(&self.qp);
        let _ = lock(&self.rdma.nic).destroy_qp(self.qp);
    }
}

impl RcConn {
    /// Ties the queue pair to its connection (failures and `C_SEND` go there).
    pub(crate) fn attach(&self, conn: &Arc<ConnInner>) {
        let _ = self.conn.set(Arc::downgrade(conn));
    }

    /// The device's name.
    pub(crate) fn device(&self) -> String {
        self.rdma.name()
    }

    /// Moves `len` bytes between `local` (in `mr`) and the peer's `remote`
    /// (remote key `rkey`): RDMA WRITEs for a send or a write, READs for a
    /// read. Returns once every request is posted; the poller finishes
    /// `op` on the last one's completion. `timeout` bounds the waits for
    /// room in the send queue (then the connection fails).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn transfer(
        &self,
        op: &Arc<Op>,
        mr: &Arc<MrInner>,
        local: u64,
        len: usize,
        remote: u64,
        rkey: u32,
        kind: Kind,
        timeout: Duration,
    ) -> Result<()> {
        let (lkey, _) = mr.rdma_keys.ok_or_else(|| {
            Error::internal(format!("memory region {} is not registered with the RDMA device", mr.id))
        })?;
        if len == 0 {
            if let Kind::Send(seq) = kind {
                self.send_done(seq, 0)?;
            }
            op.finish(Ok(0));
            return Ok(());
        }
        let opcode = if matches!(kind, Kind::Read) { WrOpcode::RdmaRead } else { WrOpcode::RdmaWrite };
        let max = self.rdma.limits.max_msg.min(u64::from(u32::MAX));
        let len64 = len as u64;
        let mut wrs: Vec<PostWr> = (0..len64.div_ceil(max))
            .map(|i| {
                let off = i * max;
                let n = max.min(len64 - off);
                wr(opcode, (local + off, n as u32, lkey), remote + off, rkey)
            })
            .collect();
        if opcode == WrOpcode::RdmaWrite {
            // The flush read: its response means every earlier write of the
            // queue pair is in the peer's memory (reads do not pass writes).
            let n = FLUSH_BYTES.min(len64);
            let scratch = (self.rdma.scratch as u64, n as u32, self.rdma.scratch_lkey);
            wrs.push(wr(WrOpcode::RdmaRead, scratch, remote + len64 - n, rkey));
        }
        mr.begin()?;
        let deadline = Instant::now() + timeout;
        let last = wrs.len() - 1;
        let mut st = lock(&self.st);
        for (i, mut w) in wrs.into_iter().enumerate() {
            loop {
                if let Some(e) = &st.failed {
                    let e = e.clone();
                    drop(st);
                    // Not tracked yet (the last request carries the track).
                    mr.end();
                    return Err(e);
                }
                if st.queue.room() > 0 {
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    drop(st);
                    let e = Error::Timeout(format!(
                        "RDMA send queue of point-to-point connection stayed full for {timeout:?}; the connection is failed"
                    ));
                    self.fail_conn(e.clone());
                    mr.end();
                    return Err(e);
                }
                st = self.room.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
            }
            let Some((seq, signaled)) = st.queue.push(i == last) else {
                drop(st);
                mr.end();
                return Err(Error::internal("RDMA send queue full after waiting for room"));
            };
            w.wr_id = wr_id(self.qp, seq);
            w.signaled = signaled;
            if i == last {
                st.tracks.insert(seq, Track { op: op.clone(), mr: mr.clone(), len, kind });
                self.rdma.in_flight.fetch_add(1, Ordering::SeqCst);
            }
            // SAFETY: the local buffer lies in `mr` (checked when the
            // transfer was submitted), registered with `lkey`, and counted
            // busy (`begin`) until the transfer's track ends it: its drop
            // waits for that, and only then deregisters it; or it is the
            // endpoint's scratch word (registered while the device lives).
            // The remote range was checked against the peer's region by the
            // caller; the NIC checks it against the rkey.
            let posted = unsafe { lock(&self.rdma.nic).post(self.qp, &w) };
            if let Err(errno) = posted {
                st.queue.unpush();
                let t = st.tracks.remove(&seq);
                drop(st);
                let e = Error::system("posting an RDMA request", std::io::Error::from_raw_os_error(errno));
                match t {
                    Some(t) => self.end_track(t, Err(e.clone())),
                    None => mr.end(),
                }
                self.fail_conn(e.clone());
                return Err(e);
            }
        }
        drop(st);
        self.rdma.kick();
        Ok(())
    }

    /// Tells the receiver its message of `len` bytes for receive `seq` landed.
    fn send_done(&self, seq: u64, len: usize) -> Result<()> {
        let conn = self.conn.get().and_then(Weak::upgrade).ok_or_else(|| Error::invalid_usage("connection closed"))?;
        conn.send_control(&Control::new(wire::C_SEND, seq, len as u64, 1, 0))
    }

    fn end_track(&self, t: Track, r: Result<usize>) {
        self.rdma.in_flight.fetch_sub(1, Ordering::SeqCst);
        t.mr.end();
        let r = r.and_then(|n| match t.kind {
            Kind::Send(seq) => self.send_done(seq, n).map(|()| n),
            _ => Ok(n),
        });
        t.op.finish(r);
    }

    fn on_completion(&self, c: &Completion, low: u64) {
        if !c.ok() {
            let status = lock(&self.rdma.nic).status_str(c.status);
            let peer = self.conn.get().and_then(Weak::upgrade).map(|c| (c.id, c.peer_addr));
            let what = match peer {
                Some((id, addr)) => format!("point-to-point connection {id} to {addr}"),
                None => "a point-to-point connection".into(),
            };
            let e = Error::remote(format!(
                "RDMA work completion error on {what}: {status} (status {}, vendor error {:#x}, QP {:#x}); the \
                 connection is failed",
                c.status, c.vendor_err, c.qp_num
            ));
            self.fail_conn(e);
            return;
        }
        let done: Vec<Track> = {
            let mut st = lock(&self.st);
            let Some(seq) = st.queue.complete(low) else {
                return;
            };
            let rest = st.tracks.split_off(&(seq + 1));
            let done = std::mem::replace(&mut st.tracks, rest);
            self.room.notify_all();
            done.into_values().collect()
        };
        for t in done {
            let n = t.len;
            self.end_track(t, Ok(n));
        }
    }

    /// Fails the connection (which shuts this queue pair down: [`RcConn::shut`]).
    fn fail_conn(&self, e: Error) {
        match self.conn.get().and_then(Weak::upgrade) {
            Some(c) => c.fail(e.clone()),
            None => self.shut(&e),
        }
        // The connection may have failed already with another error.
        self.shut(&e);
    }

    /// The completion queue broke.
    fn broken(&self, e: Error) {
        self.fail_conn(e);
    }

    /// The connection failed or closed: the queue pair goes to the error
    /// state (the NIC starts nothing more of it), and every transfer in
    /// flight fails with `e`.
    pub(crate) fn shut(&self, e: &Error) {
        let tracks: Vec<Track> = {
            let mut st = lock(&self.st);
            if st.failed.is_none() {
                st.failed = Some(e.clone());
                let _ = lock(&self.rdma.nic).modify_error(self.qp);
            }
            st.queue.fail_all();
            self.room.notify_all();
            std::mem::take(&mut st.tracks).into_values().collect()
        };
        for t in tracks {
            self.rdma.in_flight.fetch_sub(1, Ordering::SeqCst);
            t.mr.end();
            t.op.finish(Err(e.clone()));
        }
    }
}

fn wr(opcode: WrOpcode, sge: (u64, u32, u32), remote_addr: u64, rkey: u32) -> PostWr {
    PostWr { wr_id: 0, opcode, sge, remote_addr, rkey, add: 0, fence: false, signaled: false, inline: false }
}
