//! A software model of an RDMA NIC, for tests (hidden from the docs): no
//! RDMA device exists on the project's machines, so the executors above
//! the FFI (the GIN verbs transport, devcomm's point-to-point verbs
//! transport) are tested against this model instead.
//!
//! It executes each work request when it is posted (in order, so fences
//! hold trivially) against process memory, checking keys and ranges as a
//! NIC does: the remote key must be registered by the NIC that owns the
//! queue pair's peer and cover the remote range (else a remote access
//! error), the local key must cover the local buffer. Completions come the
//! way an RC send queue produces them: signaled successes, and an error
//! for every request once the queue pair failed (the first one's status
//! says why, the rest are flushed). A post beyond the send-queue depth is
//! refused, as a real queue would. A queue pair whose peer's NIC is gone
//! (dropped, or [`Fabric::kill`]ed: a host that died) fails its requests
//! with "retry count exceeded", as an unanswered RC queue pair does.
//!
//! What it does not model: timing (everything lands at once), partial
//! writes, PCIe ordering, the wire. It is a test double, not an emulator.

use super::rc::{
    Completion, DeviceLimits, MrKeys, Nic, PortAddr, PostWr, QpCaps, QpRecord, RcNic, WrOpcode, WC_REM_ACCESS_ERR,
    WC_RETRY_EXC_ERR, WC_WR_FLUSH_ERR,
};
use super::{Dmabuf, VerbsConfig};
use crate::{GinHostError, GinResult};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One registered region: (address, length, owning NIC).
type Region = (u64, u64, u64);

#[derive(Default)]
struct FabricState {
    rkeys: HashMap<u32, Region>,
    lkeys: HashMap<u32, Region>,
    /// Queue pair number → owning NIC, for live queue pairs.
    qps: HashMap<u32, u64>,
    dead: HashSet<u64>,
    next_key: u32,
    next_qpn: u32,
    next_nic: u64,
}

/// The memory regions and queue pairs of every model NIC of a test: what
/// NICs check requests against (shared by the NICs that talk).
#[derive(Default)]
pub struct Fabric {
    state: Mutex<FabricState>,
}

impl Fabric {
    /// An empty fabric.
    pub fn new() -> Arc<Fabric> {
        Arc::new(Fabric::default())
    }

    /// Registers a region under remote key `rkey` (owned by `nic`).
    pub fn add_rkey(&self, nic: &ModelNic, rkey: u32, addr: u64, len: u64) {
        lock(&self.state).rkeys.insert(rkey, (addr, len, nic.id));
    }

    /// Registers a region under local key `lkey` (owned by `nic`).
    pub fn add_lkey(&self, nic: &ModelNic, lkey: u32, addr: u64, len: u64) {
        lock(&self.state).lkeys.insert(lkey, (addr, len, nic.id));
    }

    /// The host of the NIC with these knobs dies: requests to its queue
    /// pairs fail with "retry count exceeded" from now on (its memory is
    /// not touched).
    pub fn kill(&self, nic: &Knobs) {
        lock(&self.state).dead.insert(nic.id);
    }
}

/// Knobs shared between a test and one model NIC.
#[derive(Default)]
pub struct Knobs {
    id: u64,
    /// Completions handed out per poll (0: the NIC stalls).
    pub per_poll: AtomicUsize,
    /// Per queue pair: the path is cut (requests fail with retry exceeded).
    pub broken: Mutex<Vec<bool>>,
    /// Every request posted: (queue pair, request).
    pub log: Mutex<Vec<(usize, PostWr)>>,
}

/// One queue pair of the model.
#[derive(Clone, Copy, Default)]
struct ModelQp {
    qpn: u32,
    /// The peer's queue pair number once connected (`None`: the GIN
    /// tests' pre-wired queue pairs, whose peer is not checked).
    remote: Option<u32>,
    errored: bool,
    destroyed: bool,
    posted: u64,
    done: u64,
}

/// The model NIC (see the module docs).
pub struct ModelNic {
    id: u64,
    name: String,
    fabric: Arc<Fabric>,
    knobs: Arc<Knobs>,
    depth: u64,
    max_inline: u32,
    max_msg: u64,
    qps: Vec<ModelQp>,
    pending: VecDeque<(usize, u64, Completion)>,
}

impl Drop for ModelNic {
    fn drop(&mut self) {
        // Its memory may be freed right after: peers' requests then fail as
        // they would (remote access error, or retry exceeded for its QPs).
        let mut f = lock(&self.fabric.state);
        let id = self.id;
        f.rkeys.retain(|_, r| r.2 != id);
        f.lkeys.retain(|_, r| r.2 != id);
        f.qps.retain(|_, &mut n| n != id);
    }
}

impl ModelNic {
    /// A NIC on `fabric` with send queues of `depth` requests, `max_inline`
    /// inline bytes, and `qps` queue pairs created already (pre-wired: no
    /// peer check; [`RcNic::create_qp`] adds connected ones).
    pub fn new(fabric: &Arc<Fabric>, name: &str, depth: u32, max_inline: u32, qps: usize) -> ModelNic {
        let mut f = lock(&fabric.state);
        f.next_nic += 1;
        let id = f.next_nic;
        drop(f);
        let knobs = Arc::new(Knobs { id, per_poll: AtomicUsize::new(usize::MAX), ..Knobs::default() });
        *lock(&knobs.broken) = vec![false; qps];
        let mut nic = ModelNic {
            id,
            name: name.into(),
            fabric: fabric.clone(),
            knobs,
            depth: u64::from(depth.max(1)),
            max_inline,
            max_msg: 1 << 30,
            qps: Vec::new(),
            pending: VecDeque::new(),
        };
        for _ in 0..qps {
            nic.new_qp();
        }
        nic
    }

    /// The same with work requests of at most `max_msg` bytes.
    pub fn with_max_msg(mut self, max_msg: u64) -> ModelNic {
        self.max_msg = max_msg.max(1);
        self
    }

    /// The knobs of this NIC.
    pub fn knobs(&self) -> Arc<Knobs> {
        self.knobs.clone()
    }

    fn new_qp(&mut self) -> usize {
        let mut f = lock(&self.fabric.state);
        f.next_qpn += 1;
        let qpn = f.next_qpn & 0xff_ffff;
        f.qps.insert(qpn, self.id);
        drop(f);
        self.qps.push(ModelQp { qpn, ..ModelQp::default() });
        self.qps.len() - 1
    }

    fn execute(&self, qp: &ModelQp, wr: &PostWr) -> u32 {
        let f = lock(&self.fabric.state);
        let peer = match qp.remote {
            None => None,
            Some(r) => match f.qps.get(&r) {
                Some(&owner) if !f.dead.contains(&owner) => Some(owner),
                _ => return WC_RETRY_EXC_ERR,
            },
        };
        let len = match wr.opcode {
            WrOpcode::AtomicFetchAdd => 8,
            _ => u64::from(wr.sge.1),
        };
        let remote_ok = f.rkeys.get(&wr.rkey).is_some_and(|&(a, l, owner)| {
            peer.is_none_or(|p| p == owner) && wr.remote_addr >= a && wr.remote_addr + len <= a + l
        });
        if !remote_ok || len > self.max_msg {
            return WC_REM_ACCESS_ERR;
        }
        let local_ok = if wr.inline {
            wr.opcode == WrOpcode::RdmaWrite && wr.sge.1 <= self.max_inline
        } else {
            len == 0
                || f.lkeys.get(&wr.sge.2).is_some_and(|&(a, l, owner)| {
                    owner == self.id && wr.sge.0 >= a && wr.sge.0 + u64::from(wr.sge.1) <= a + l
                })
        };
        assert!(local_ok, "the executor posted a bad local buffer: {wr:?}");
        // SAFETY: both ranges were just checked against regions registered
        // on this fabric (live test memory: a NIC withdraws its regions when
        // it drops, and users keep registered memory alive while
        // registered); test memory is accessed atomically where shared
        // (signals) and otherwise only read after completions.
        unsafe {
            match wr.opcode {
                WrOpcode::RdmaWrite => std::ptr::copy(wr.sge.0 as *const u8, wr.remote_addr as *mut u8, len as usize),
                WrOpcode::RdmaRead => std::ptr::copy(wr.remote_addr as *const u8, wr.sge.0 as *mut u8, len as usize),
                WrOpcode::AtomicFetchAdd => {
                    assert_eq!(wr.remote_addr % 8, 0);
                    let old = AtomicU64::from_ptr(wr.remote_addr as *mut u64).fetch_add(wr.add, Ordering::SeqCst);
                    (wr.sge.0 as *mut u64).write_unaligned(old);
                }
            }
        }
        0
    }
}

impl Nic for ModelNic {
    unsafe fn post(&mut self, qp: usize, wr: &PostWr) -> Result<(), i32> {
        let Some(&q) = self.qps.get(qp).filter(|q| !q.destroyed) else {
            return Err(22); // EINVAL
        };
        if q.posted - q.done >= self.depth {
            return Err(12); // ENOMEM: the send queue is full
        }
        lock(&self.knobs.log).push((qp, *wr));
        let seq = q.posted;
        let broken = lock(&self.knobs.broken).get(qp).copied().unwrap_or(false);
        let status = if q.errored {
            WC_WR_FLUSH_ERR
        } else if broken {
            WC_RETRY_EXC_ERR
        } else {
            self.execute(&q, wr)
        };
        let q = &mut self.qps[qp];
        q.posted += 1;
        if status != 0 {
            q.errored = true;
        }
        if status != 0 || wr.signaled {
            let c = Completion { wr_id: wr.wr_id, status, vendor_err: 0, qp_num: q.qpn };
            self.pending.push_back((qp, seq, c));
        }
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> GinResult<usize> {
        let n = self.knobs.per_poll.load(Ordering::SeqCst).min(self.pending.len());
        for _ in 0..n {
            let Some((qp, seq, c)) = self.pending.pop_front() else { break };
            let q = &mut self.qps[qp];
            q.done = q.done.max(seq + 1);
            out.push(c);
        }
        Ok(n)
    }
    fn modify_error(&mut self, qp: usize) -> GinResult<()> {
        let q = self.qps.get_mut(qp).ok_or_else(|| GinHostError::Invalid(format!("no queue pair {qp}")))?;
        q.errored = true;
        Ok(())
    }
    fn status_str(&self, status: u32) -> String {
        match status {
            WC_WR_FLUSH_ERR => "Work Request Flushed Error".into(),
            WC_REM_ACCESS_ERR => "remote access error".into(),
            WC_RETRY_EXC_ERR => "transport retry counter exceeded".into(),
            s => format!("status {s}"),
        }
    }
    fn name(&self) -> &str {
        &self.name
    }
}

impl RcNic for ModelNic {
    fn port(&self) -> PortAddr {
        PortAddr { lid: self.id as u16, gid: [0; 16], port: 1, link_layer: 1, mtu: 5 }
    }
    fn limits(&self) -> DeviceLimits {
        DeviceLimits { max_msg: self.max_msg, depth: self.depth as u32, max_rd_atomic: 16, max_dest_rd_atomic: 16 }
    }
    unsafe fn reg(&mut self, addr: u64, len: u64, _dmabuf: Option<Dmabuf>, _access: i32) -> GinResult<MrKeys> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(GinHostError::Invalid(format!("registering {len} bytes at {addr:#x}")));
        }
        let mut f = lock(&self.fabric.state);
        f.next_key += 2;
        let keys = MrKeys { lkey: f.next_key, rkey: f.next_key + 1 };
        f.lkeys.insert(keys.lkey, (addr, len, self.id));
        f.rkeys.insert(keys.rkey, (addr, len, self.id));
        Ok(keys)
    }
    fn dereg(&mut self, keys: MrKeys) -> GinResult<()> {
        let mut f = lock(&self.fabric.state);
        match (f.lkeys.remove(&keys.lkey), f.rkeys.remove(&keys.rkey)) {
            (Some(_), Some(_)) => Ok(()),
            _ => Err(GinHostError::Invalid(format!("no memory region with keys {keys:?}"))),
        }
    }
    fn create_qp(&mut self, depth: u32) -> GinResult<(usize, QpCaps)> {
        let i = self.new_qp();
        lock(&self.knobs.broken).push(false);
        let caps = QpCaps { qpn: self.qps[i].qpn, max_send_wr: depth.min(self.depth as u32), max_inline_data: 0 };
        Ok((i, caps))
    }
    fn connect_qp(&mut self, qp: usize, _local_psn: u32, remote: &QpRecord, _config: &VerbsConfig) -> GinResult<()> {
        let q = self.qps.get_mut(qp).ok_or_else(|| GinHostError::Invalid(format!("no queue pair {qp}")))?;
        q.remote = Some(remote.qpn);
        Ok(())
    }
    fn destroy_qp(&mut self, qp: usize) -> GinResult<()> {
        let q = self.qps.get_mut(qp).ok_or_else(|| GinHostError::Invalid(format!("no queue pair {qp}")))?;
        q.destroyed = true;
        q.errored = true;
        let qpn = q.qpn;
        lock(&self.fabric.state).qps.remove(&qpn);
        Ok(())
    }
}
