//! The verbs transport: RDMA WRITE for data and RDMA ATOMIC FETCH_AND_ADD
//! for signals, over one reliable-connected (RC) queue pair per peer.
//! Built with the cargo feature `verbs` (off by default).
//!
//! **Status: built and unit-tested only.** No RDMA NIC exists on the
//! project's machines: neither the development/CI machines nor the GPU
//! machine (which has rdma-core 50 installed; `ibv_get_device_list` lists no
//! device). Soft-RoCE cannot stand in for one either: the development/CI
//! kernel has no RDMA subsystem (`rdma link` answers "Failed to open
//! NETLINK_RDMA socket"), and the GPU machine's kernel has the InfiniBand
//! core and mlx5 built in but neither `rdma_rxe` nor `siw`
//! (`CONFIG_RDMA_RXE`/`CONFIG_RDMA_SIW` not set, no loadable modules), so
//! `rdma link add rxe0 type rxe netdev ...` fails with "Invalid argument".
//!
//! What runs without a NIC is tested: the planning layer ([`plan`]: proxy
//! operation → work requests, send-queue and staging accounting), the
//! connection records ([`conninfo`]: encoding, validation), the
//! configuration, the queue-pair attributes each rank derives from its
//! peer's record, the executor (staging, selective signaling, waits on a
//! full queue, retirement of zero-copy puts, peer failure, graceful close)
//! driven through a software model of a NIC that executes the work requests
//! on process memory, the ABI of the FFI declarations against the system's
//! `verbs.h`, and the clean [`GinHostError::Unavailable`] when libibverbs or
//! a device is missing. The end-to-end test
//! (`loopback_put_and_signal_when_a_device_exists`) connects a loopback
//! queue pair and checks puts and signals where a device exists (with
//! soft-RoCE too); elsewhere it checks the `Unavailable` error.
//!
//! # How it works
//!
//! `libibverbs.so.1` is loaded at run time ([`VerbsConfig::library`]), so
//! building needs no rdma-core, and a machine without it gets
//! `Unavailable` from [`VerbsTransport::connect`] rather than a process that
//! fails to start. [`VerbsTransport::connect`] is collective:
//!
//! 1. each rank opens its device ([`VerbsConfig::device`], or the first with
//!    an active port), creates a protection domain, one completion queue and
//!    one RC queue pair per rank — its own included (a loopback QP, so that
//!    this rank's signals are only ever updated by the NIC, see below) —
//!    and registers its memory ([`VerbsMemory`]): the windows (remote write
//!    and read), the signal array (remote atomic), a staging ring, a scratch
//!    word and the control words;
//! 2. the ranks exchange [`conninfo`] records with
//!    [`crate::Bootstrap::allgather`]: LID/GID, port, MTU, per peer the QP
//!    number and first PSN, and the windows' and signal array's addresses and
//!    rkeys. A rank that could not set up sends a failure record instead, so
//!    every rank returns an error naming it rather than waiting;
//! 3. every QP goes INIT → RTR → RTS toward its peer (GRH on RoCE or across
//!    IB subnets), and a second allgather confirms that every rank is ready
//!    before any request is posted.
//!
//! Operations ([`plan`]): a get ([`Transport::get`]) is RDMA READs from
//! the peer's window into this rank's registered window, retired by the
//! last read's completion. A put is RDMA WRITEs of at most the port's
//! largest message, inline (`IBV_SEND_INLINE`) when the data is host data of
//! at most the QP's inline size, otherwise from registered memory: the
//! source window itself (zero copy, [`Transport::put_from_device`] on a
//! registered window) or a slot of the staging ring the data is copied into
//! (host data; device data outside the registered windows is read into it
//! with [`LocalMemory::read_device`]). A signal is an
//! `IBV_WR_ATOMIC_FETCH_AND_ADD` of the increment on the peer's 8-byte signal
//! word, posted on the same QP after the data with `IBV_SEND_FENCE`. Every
//! operation's last request is signaled (plus, at least, every
//! [`VerbsConfig::signal_interval`]-th); [`Transport::progress`] polls the
//! completion queue. A full send queue or staging ring waits on the
//! completion queue — nothing is ever dropped.
//!
//! Completion: inline and staged data is consumed when `put` returns. A
//! zero-copy put still reads its source after that, so it gets a mark
//! ([`Transport::issued`]) and retires ([`Transport::retired`]) once its last
//! request has completed; the proxy completes its ticket (local counter,
//! credit) only then. [`Transport::flush`] waits until every outstanding
//! request of every live peer has completed.
//!
//! # Ordering: a signal is seen only after its data
//!
//! * On one RC QP, the responder executes requests in order (PSN order), and
//!   the InfiniBand ordering rules let neither an RDMA READ nor an ATOMIC
//!   pass an earlier RDMA WRITE: the fetch-and-add on the signal executes
//!   after the WRITEs before it were executed at the peer. The same holds
//!   for [`Transport::signal`] after earlier puts, as they use the same QP.
//! * `IBV_SEND_FENCE` on the atomic makes it wait, at the requester, until
//!   every earlier RDMA READ and ATOMIC of the QP has completed. That is
//!   what orders the atomic after the *flush read* below, and signals after
//!   earlier signals.
//! * Executed is not yet visible to a GPU: the peer's NIC writes the data
//!   into GPU memory over PCIe (GPUDirect RDMA) and the signal into host
//!   memory (in devcomm, signals live in host memory the GPU polls). These
//!   are two PCIe targets, and a posted write to one can still be in flight
//!   when the write to the other lands. So, when
//!   [`VerbsConfig::flush_before_signal`] is set (the default), a signal that
//!   follows unflushed writes is preceded by an RDMA READ of a few of the
//!   last written bytes: the responder's PCIe read of GPU memory cannot pass
//!   its earlier posted writes to it, so the read's response means the data
//!   is in GPU memory — and the fenced atomic starts only after that
//!   response. (This is NCCL's "GDR flush" idea applied to one-sided
//!   signals.) Window registrations do not use `IBV_ACCESS_RELAXED_ORDERING`,
//!   which would allow the NIC's PCIe writes to be reordered.
//! * The signal word changes atomically for readers: one aligned 8-byte NIC
//!   write.
//!
//! # Atomics and the CPU
//!
//! RDMA atomics are atomic with respect to the CPU's atomics only if the
//! device reports `IBV_ATOMIC_GLOB` ([`VerbsTransport::atomics_global`]);
//! with `IBV_ATOMIC_HCA` they are atomic only among the HCA's own atomics.
//! This transport therefore sends even a rank's signals to itself through
//! its loopback QP. A caller that also adds to the same signal words with
//! CPU atomics (the copy-engine transport for same-host peers) must only do
//! so when [`VerbsTransport::atomics_global`] is true. (Current NICs perform
//! atomics in host byte order; very old ConnectX-3 firmware did not.)
//!
//! # GPU memory (GPUDirect RDMA)
//!
//! A window is registered from its [`VerbsWindow`]: with
//! [`VerbsWindow::dmabuf`] through `ibv_reg_dmabuf_mr` (rdma-core ≥ 34,
//! Linux ≥ 5.12, the NVIDIA open kernel driver; the dmabuf comes from
//! `cuMemGetHandleForAddressRange(..., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)`
//! on a page-aligned range), with its device virtual address as the iova so
//! that peers use device addresses; without it through `ibv_reg_mr` on the
//! address, which works for host memory, and for device memory where the
//! `nvidia-peermem` kernel module is loaded. The `LocalMemory` trait is
//! unchanged: `devcomm` passes the list of windows when it connects the
//! transport.
//!
//! # Failures
//!
//! A completion with an error status (retry count exceeded, remote access
//! error, ...) moves its QP to the error state: the peer is failed, reported
//! as a [`PeerFailure`] by the next [`Transport::progress`], and operations
//! to it return `Remote`. A peer whose requests do not complete within
//! [`VerbsConfig::wait_timeout`] while this rank waits for them is failed
//! the same way. A graceful [`Transport::close`] first writes 1 into this
//! rank's control word at every peer; a peer that finds it set treats the
//! following errors as "rank left", not as a failure, as the TCP transport
//! does. Closing moves every QP to the error state, so nothing is written
//! to this rank's memory afterwards.

pub mod conninfo;
mod ffi;
#[doc(hidden)]
pub mod model;
pub mod plan;
pub mod rc;

use super::{GetSource, PeerFailure, PutTarget, Transport};
use crate::descriptor::RemoteSignal;
use crate::{Bootstrap, GinHostError, GinResult, LocalMemory};
use conninfo::{ConnInfo, ConnRecord, QpEndpoint, WindowInfo};
use plan::{LocalRef, PlanLimits, QpPlanState, SendQueue, Source, Staging, WrOpcode, WrSpec};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Environment variable naming the device and optionally the port:
/// `mlx5_0` or `mlx5_0:1` (as NCCL's `NCCL_IB_HCA` for one device).
pub const ENV_HCA: &str = "DEVCOMM_GIN_IB_HCA";
/// Environment variable with the GID index (RoCE: the index of the RoCE v2
/// GID to use; InfiniBand: normally 0).
pub const ENV_GID_INDEX: &str = "DEVCOMM_GIN_IB_GID_INDEX";
/// Environment variable with the traffic class (RoCE DSCP << 2 | ECN).
pub const ENV_TC: &str = "DEVCOMM_GIN_IB_TC";
/// Environment variable with the service level.
pub const ENV_SL: &str = "DEVCOMM_GIN_IB_SL";
/// Environment variable with the ACK timeout exponent (4.096 µs × 2^n).
pub const ENV_TIMEOUT: &str = "DEVCOMM_GIN_IB_TIMEOUT";
/// Environment variable turning the flush read before signals off (`0`) or on (`1`).
pub const ENV_FLUSH: &str = "DEVCOMM_GIN_IB_FLUSH";

/// Settings of the verbs transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// The library to load.
    pub library: String,
    /// Device name (`mlx5_0`); `None`: the first device with an active `port`.
    pub device: Option<String>,
    /// Port number (from 1).
    pub port: u8,
    /// GID index.
    pub gid_index: u8,
    /// Traffic class of the GRH.
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Send-queue depth per peer (capped by the device).
    pub send_queue_depth: u32,
    /// At least one request in this many is signaled (1..=depth).
    pub signal_interval: u32,
    /// Inline data asked for per QP (the device may grant less).
    pub max_inline: u32,
    /// Bytes of the registered staging ring for host data.
    pub staging_bytes: usize,
    /// Largest piece of staged data per work request (at most half the ring).
    pub staging_piece: usize,
    /// Precede a signal by a read of the last written bytes (see the module
    /// docs: needed when data and signals are on different PCIe targets).
    pub flush_before_signal: bool,
    /// Local ACK timeout exponent: 4.096 µs × 2^n per try (0..=31).
    pub ack_timeout: u8,
    /// Transport retries before a QP fails (0..=7).
    pub retry_count: u8,
    /// Longest wait for completions before the blocking peer is failed.
    pub wait_timeout: Duration,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            library: "libibverbs.so.1".into(),
            device: None,
            port: 1,
            gid_index: 0,
            traffic_class: 0,
            service_level: 0,
            send_queue_depth: 512,
            signal_interval: 64,
            max_inline: 128,
            staging_bytes: 32 << 20,
            staging_piece: 1 << 20,
            flush_before_signal: true,
            ack_timeout: 20,
            retry_count: 7,
            wait_timeout: Duration::from_secs(120),
        }
    }
}

/// Splits `mlx5_0:1` into the device and the port.
pub fn parse_hca(v: &str) -> GinResult<(String, Option<u8>)> {
    let v = v.trim();
    let bad = || GinHostError::Invalid(format!("{ENV_HCA}={v:?} is not DEVICE or DEVICE:PORT (e.g. mlx5_0:1)"));
    let (dev, port) = match v.split_once(':') {
        Some((d, p)) => (d, Some(p.parse::<u8>().ok().filter(|&p| p >= 1).ok_or_else(bad)?)),
        None => (v, None),
    };
    if dev.is_empty() || dev.contains(|c: char| c.is_whitespace() || c == ',' || c == ':') {
        return Err(bad());
    }
    Ok((dev.to_owned(), port))
}

impl VerbsConfig {
    /// The default, with the `DEVCOMM_GIN_IB_*` variables applied.
    pub fn from_env() -> GinResult<VerbsConfig> {
        VerbsConfig::from_vars(|k| std::env::var(k).ok())
    }

    /// The default, with the variables `var` returns applied.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> GinResult<VerbsConfig> {
        fn num<T: std::str::FromStr>(name: &str, v: &str, max: u64) -> GinResult<T> {
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|&n| n <= max)
                .and_then(|n| n.to_string().parse().ok())
                .ok_or_else(|| GinHostError::Invalid(format!("{name}={v:?} is not a number in 0..={max}")))
        }
        let mut c = VerbsConfig::default();
        if let Some(v) = var(ENV_HCA) {
            let (d, p) = parse_hca(&v)?;
            c.device = Some(d);
            if let Some(p) = p {
                c.port = p;
            }
        }
        if let Some(v) = var(ENV_GID_INDEX) {
            c.gid_index = num(ENV_GID_INDEX, &v, 255)?;
        }
        if let Some(v) = var(ENV_TC) {
            c.traffic_class = num(ENV_TC, &v, 255)?;
        }
        if let Some(v) = var(ENV_SL) {
            c.service_level = num(ENV_SL, &v, 15)?;
        }
        if let Some(v) = var(ENV_TIMEOUT) {
            c.ack_timeout = num(ENV_TIMEOUT, &v, 31)?;
        }
        if let Some(v) = var(ENV_FLUSH) {
            c.flush_before_signal = num::<u8>(ENV_FLUSH, &v, 1)? == 1;
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the settings' ranges (`Invalid` naming the wrong one).
    pub fn validate(&self) -> GinResult<()> {
        let bad = |m: String| Err(GinHostError::Invalid(format!("verbs transport settings: {m}")));
        if self.port == 0 {
            return bad("port 0 (ports count from 1)".into());
        }
        if self.send_queue_depth < 2 {
            return bad(format!("send queue depth {} (at least 2)", self.send_queue_depth));
        }
        if self.signal_interval == 0 {
            return bad("signal interval 0".into());
        }
        if self.staging_piece == 0 || self.staging_piece > self.staging_bytes / 2 {
            return bad(format!(
                "staging piece {} must be in 1..={} (half the staging ring)",
                self.staging_piece,
                self.staging_bytes / 2
            ));
        }
        if self.staging_piece > u32::MAX as usize {
            return bad(format!("staging piece {} exceeds a work request", self.staging_piece));
        }
        if self.ack_timeout > 31 || self.retry_count > 7 || self.service_level > 15 {
            return bad(format!(
                "ack timeout {} (0..=31), retry count {} (0..=7), service level {} (0..=15)",
                self.ack_timeout, self.retry_count, self.service_level
            ));
        }
        Ok(())
    }
}

/// A dmabuf backing a window (GPUDirect RDMA without `nvidia-peermem`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dmabuf {
    /// The dmabuf's file descriptor (only used during
    /// [`VerbsTransport::connect`]; the registration keeps its own reference).
    pub fd: RawFd,
    /// Offset of the window's first byte in the dmabuf.
    pub offset: u64,
}

/// One window of this rank to register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsWindow {
    /// Window id (as in the descriptors).
    pub id: u32,
    /// Address of byte 0: a host address, or a device address (what
    /// [`LocalMemory::window_addr`] returns for offset 0); peers write to
    /// `addr + offset`.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Register through this dmabuf (`ibv_reg_dmabuf_mr`, iova = `addr`);
    /// `None`: `ibv_reg_mr` on `addr`.
    pub dmabuf: Option<Dmabuf>,
}

/// This rank's memory the transport registers: what the NIC may write into
/// (windows, signals) and read from (windows, as put sources).
#[derive(Clone, Debug)]
pub struct VerbsMemory {
    /// The windows.
    pub windows: Vec<VerbsWindow>,
    /// This rank's signal array: `total_signals` 8-aligned u64s.
    pub signals: *mut u64,
    /// Signals in the array.
    pub total_signals: u32,
}

/// Names of the RDMA devices visible through `config.library`:
/// `Unavailable` if the library cannot be loaded or the kernel has no RDMA
/// support; an empty list if there simply is no device.
pub fn devices(config: &VerbsConfig) -> GinResult<Vec<String>> {
    ffi::Verbs::load(&config.library)?.device_names()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerState {
    Up,
    Left,
    Failed,
}

/// How a put's data travels (which limits its plan follows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Host data: inline when small, else copied into staging.
    Host,
    /// From a registered window, zero copy.
    ZeroCopy,
    /// Device data read into staging.
    StagedDevice,
}

/// A put's data as the executor reaches it.
#[derive(Clone, Copy)]
enum Data<'a> {
    /// Host bytes (inline or copied into staging).
    Host(&'a [u8]),
    /// Registered memory at this address (zero copy).
    Registered { addr: u64, lkey: u32 },
    /// Device memory outside the registered windows: read into staging.
    Device { local: &'a dyn LocalMemory, addr: u64 },
}

/// Bytes `offset..offset + len` of `d` (`Invalid` if the plan named others).
fn host_range(d: &[u8], offset: u64, len: u32) -> GinResult<&[u8]> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    start
        .checked_add(len as usize)
        .and_then(|end| d.get(start..end))
        .ok_or_else(|| GinHostError::Invalid(format!("{len} bytes at {offset} past the data ({} bytes)", d.len())))
}

/// The first PSN of a QP: 24 pseudo-random bits.
fn random_psn(rank: usize, peer: usize) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(rank);
    h.write_usize(peer);
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    (h.finish() & 0xff_ffff) as u32
}

/// What an executor needs of the NIC once its queue pairs are connected:
/// the real device (libibverbs) or, in tests, the software model of one
/// ([`model::ModelNic`]). [`rc::RcNic`] adds what setting up queue pairs
/// and registrations needs.
pub trait Nic: Send {
    /// Posts one work request on queue pair `qp`; `Err(errno)` if refused.
    ///
    /// # Safety
    /// The local buffer (`wr.sge`) is registered with its lkey (or, inline,
    /// readable host memory for the call) and stays allocated until the
    /// request's completion is known; the remote range belongs to the
    /// peer's registration `wr.rkey`.
    unsafe fn post(&mut self, qp: usize, wr: &rc::PostWr) -> Result<(), i32>;
    /// Appends the completions available now to `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<rc::Completion>) -> GinResult<usize>;
    /// Moves queue pair `qp` to the error state.
    fn modify_error(&mut self, qp: usize) -> GinResult<()>;
    /// Text of a completion status.
    fn status_str(&self, status: u32) -> String;
    /// The device's name.
    fn name(&self) -> &str;
}

impl Nic for ffi::Hca {
    unsafe fn post(&mut self, qp: usize, wr: &rc::PostWr) -> Result<(), i32> {
        // SAFETY: forwarded (same contract).
        unsafe { ffi::Hca::post(self, qp, wr) }
    }
    fn poll(&mut self, out: &mut Vec<rc::Completion>) -> GinResult<usize> {
        ffi::Hca::poll(self, out)
    }
    fn modify_error(&mut self, qp: usize) -> GinResult<()> {
        ffi::Hca::modify_error(self, qp)
    }
    fn status_str(&self, status: u32) -> String {
        self.verbs().status_str(status)
    }
    fn name(&self) -> &str {
        ffi::Hca::name(self)
    }
}

/// This rank's side as the executor takes it over.
struct Parts {
    nic: Box<dyn Nic>,
    staging_buf: ffi::HostBuf,
    scratch: ffi::HostBuf,
    control: ffi::HostBuf,
    staging_lkey: u32,
    scratch_lkey: u32,
    rank: usize,
    qps: Vec<usize>,
    depth: u32,
    max_inline: u32,
    max_msg: u64,
    local_windows: Vec<(u64, u64, u32)>,
    atomics_global: bool,
}

/// This rank's side, set up before the exchange.
struct LocalSide {
    hca: ffi::Hca,
    staging_buf: ffi::HostBuf,
    scratch: ffi::HostBuf,
    control: ffi::HostBuf,
    staging_lkey: u32,
    scratch_lkey: u32,
    caps: ffi::DeviceCaps,
    port: ffi::PortInfo,
    qps: Vec<usize>,
    depth: u32,
    max_inline: u32,
    info: ConnInfo,
    local_windows: Vec<(u64, u64, u32)>,
}

const WINDOW_ACCESS: i32 = ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_READ;
const SIGNAL_ACCESS: i32 = WINDOW_ACCESS | ffi::IBV_ACCESS_REMOTE_ATOMIC;
const QP_ACCESS: i32 = ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_ATOMIC;

/// The scratch buffer: word 0 receives reads and fetched values; word 1
/// holds the constant 1 written into peers' control words on a graceful close.
fn new_scratch() -> GinResult<ffi::HostBuf> {
    let mut scratch = ffi::HostBuf::new(64)?;
    // SAFETY: in bounds, not registered yet (no NIC can touch it).
    unsafe { scratch.slice_mut(8, 8) }.copy_from_slice(&1u64.to_ne_bytes());
    Ok(scratch)
}

/// Opens the device: the named one, or the first with `port` active.
fn open_device(verbs: &std::sync::Arc<ffi::Verbs>, config: &VerbsConfig) -> GinResult<(ffi::Hca, ffi::PortInfo)> {
    let names = match &config.device {
        Some(d) => vec![d.clone()],
        None => verbs.device_names()?,
    };
    if names.is_empty() {
        return Err(GinHostError::Unavailable(
            "no RDMA device found (libibverbs is installed, but ibv_get_device_list lists no device)".into(),
        ));
    }
    let mut why = Vec::new();
    for name in &names {
        let hca = match ffi::Hca::open(verbs.clone(), Some(name)) {
            Ok(h) => h,
            Err(e) => {
                why.push(format!("{name}: {e}"));
                continue;
            }
        };
        match hca.query_device() {
            Ok(c) if c.phys_port_cnt < config.port => {
                why.push(format!("{name}: no port {} ({} ports)", config.port, c.phys_port_cnt));
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                why.push(format!("{name}: {e}"));
                continue;
            }
        }
        match hca.query_port(config.port) {
            Ok(p) if p.state == ffi::IBV_PORT_ACTIVE => return Ok((hca, p)),
            Ok(p) => why.push(format!("{name} port {}: not active (state {})", config.port, p.state)),
            Err(e) => why.push(format!("{name} port {}: {e}", config.port)),
        }
    }
    Err(GinHostError::Unavailable(format!("no usable RDMA port: {}", why.join("; "))))
}

/// The GID of `config`'s index on the port (RoCE: must exist; InfiniBand:
/// zeros if it cannot be read).
fn port_gid(hca: &ffi::Hca, port: &ffi::PortInfo, config: &VerbsConfig) -> GinResult<[u8; 16]> {
    let ethernet = port.link_layer == ffi::IBV_LINK_LAYER_ETHERNET;
    if ethernet && i32::from(config.gid_index) >= port.gid_tbl_len {
        return Err(GinHostError::Unavailable(format!(
            "RoCE port {}:{} has {} GIDs, index {} asked for (set {ENV_GID_INDEX})",
            hca.name(),
            config.port,
            port.gid_tbl_len,
            config.gid_index
        )));
    }
    let gid = match hca.query_gid(config.port, config.gid_index) {
        Ok(g) => g,
        Err(e) if ethernet => return Err(e),
        Err(_) => [0; 16],
    };
    if ethernet && gid == [0; 16] {
        return Err(GinHostError::Unavailable(format!(
            "RoCE port {}:{} has no GID at index {} (set {ENV_GID_INDEX})",
            hca.name(),
            config.port,
            config.gid_index
        )));
    }
    Ok(gid)
}

fn setup_local(rank: usize, nranks: usize, mem: &VerbsMemory, config: &VerbsConfig) -> GinResult<LocalSide> {
    config.validate()?;
    let verbs = ffi::Verbs::load(&config.library)?;
    let (mut hca, port) = open_device(&verbs, config)?;
    let caps = hca.query_device()?;
    if caps.atomic_cap == ffi::IBV_ATOMIC_NONE {
        return Err(GinHostError::Unavailable(format!(
            "RDMA device {} has no atomic operations (atomic_cap NONE); the verbs transport needs them for signals",
            hca.name()
        )));
    }
    if mem.windows.iter().any(|w| w.dmabuf.is_some()) && !verbs.has_dmabuf() {
        return Err(GinHostError::Unavailable(
            "dmabuf windows need ibv_reg_dmabuf_mr, which this libibverbs lacks (rdma-core 34 or newer)".into(),
        ));
    }
    let gid = port_gid(&hca, &port, config)?;
    let mut depth = config.send_queue_depth.min(caps.max_qp_wr.max(2));
    // After a failure every outstanding request completes (with an error),
    // signaled or not: the CQ must hold nranks × depth entries.
    depth = depth.min((caps.max_cqe as usize / nranks).clamp(2, u32::MAX as usize) as u32);
    let cqe = (depth as u64 * nranks as u64).clamp(1, caps.max_cqe.max(1) as u64) as u32;
    hca.create_cq(cqe)?;
    let mut qps = Vec::with_capacity(nranks);
    let mut endpoints = Vec::with_capacity(nranks);
    let mut max_inline = config.max_inline;
    for peer in 0..nranks {
        let (i, c) = hca.create_qp(depth, config.max_inline)?;
        hca.modify_init(i, config.port, QP_ACCESS)?;
        max_inline = max_inline.min(c.max_inline_data);
        depth = depth.min(c.max_send_wr.max(1));
        qps.push(i);
        endpoints.push(QpEndpoint { qpn: c.qpn, psn: random_psn(rank, peer) });
    }
    let mut windows = Vec::with_capacity(mem.windows.len());
    let mut local_windows = Vec::new();
    for w in &mem.windows {
        if windows.iter().any(|x: &WindowInfo| x.id == w.id) {
            return Err(GinHostError::Invalid(format!("window {} listed twice", w.id)));
        }
        if w.addr.checked_add(w.len).is_none() {
            return Err(GinHostError::Invalid(format!("window {} at {:#x} of {} bytes wraps", w.id, w.addr, w.len)));
        }
        let keys = if w.len == 0 {
            ffi::MrKeys::default()
        } else {
            match w.dmabuf {
                // SAFETY: `connect`'s contract: the window stays allocated and
                // the fd is an open dmabuf of it while the transport lives.
                Some(d) => unsafe { hca.reg_dmabuf_mr(d.offset, w.len, w.addr, d.fd, WINDOW_ACCESS)? },
                // SAFETY: as above (the window's range stays mapped).
                None => unsafe { hca.reg_mr(w.addr, w.len, WINDOW_ACCESS)? },
            }
        };
        windows.push(WindowInfo { id: w.id, rkey: keys.rkey, addr: w.addr, len: w.len });
        if w.len > 0 {
            local_windows.push((w.addr, w.len, keys.lkey));
        }
    }
    let signals_addr = mem.signals as u64;
    if signals_addr % 8 != 0 || (mem.total_signals > 0 && mem.signals.is_null()) {
        return Err(GinHostError::Invalid(format!("signal array at {signals_addr:#x} is not 8-byte aligned")));
    }
    let signals_rkey = if mem.total_signals == 0 {
        0
    } else {
        // SAFETY: `connect`'s contract: the signal array stays allocated
        // while the transport lives.
        unsafe { hca.reg_mr(signals_addr, 8 * mem.total_signals as u64, SIGNAL_ACCESS)? }.rkey
    };
    let staging_buf = ffi::HostBuf::new(config.staging_bytes)?;
    let scratch = new_scratch()?;
    let control = ffi::HostBuf::new(8 * nranks)?;
    // SAFETY: the buffers are owned by the transport next to the Hca and
    // dropped after it (field order of `VerbsTransport`).
    let staging_lkey =
        unsafe { hca.reg_mr(staging_buf.addr(), staging_buf.len() as u64, ffi::IBV_ACCESS_LOCAL_WRITE)? }.lkey;
    // SAFETY: as above.
    let scratch_lkey = unsafe { hca.reg_mr(scratch.addr(), scratch.len() as u64, ffi::IBV_ACCESS_LOCAL_WRITE)? }.lkey;
    // SAFETY: as above.
    let control_keys = unsafe {
        hca.reg_mr(control.addr(), control.len() as u64, ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE)?
    };
    let info = ConnInfo {
        rank: rank as u32,
        nranks: nranks as u32,
        lid: port.lid,
        port: config.port,
        link_layer: port.link_layer,
        mtu: port.active_mtu.clamp(1, 5),
        gid_index: config.gid_index,
        gid,
        signals_addr,
        signals_rkey,
        total_signals: mem.total_signals,
        control_addr: control.addr(),
        control_rkey: control_keys.rkey,
        qps: endpoints,
        windows,
    };
    Ok(LocalSide {
        hca,
        staging_buf,
        scratch,
        control,
        staging_lkey,
        scratch_lkey,
        caps,
        port,
        qps,
        depth,
        max_inline,
        info,
        local_windows,
    })
}

/// Checks every rank's record; the peers' infos in rank order, or the first
/// failure (naming its rank).
fn merge_records(rank: usize, nranks: usize, records: &[Vec<u8>]) -> GinResult<Vec<ConnInfo>> {
    if records.len() != nranks {
        return Err(GinHostError::Invalid(format!("allgather returned {} records for {nranks} ranks", records.len())));
    }
    let mut out = Vec::with_capacity(nranks);
    for (r, b) in records.iter().enumerate() {
        match conninfo::decode(b) {
            Ok(ConnRecord::Ready(c)) => {
                if c.rank as usize != r || c.nranks as usize != nranks {
                    return Err(GinHostError::Invalid(format!(
                        "record {r} says rank {} of {} (expected {r} of {nranks})",
                        c.rank, c.nranks
                    )));
                }
                out.push(c);
            }
            Ok(ConnRecord::Failed(m)) if r == rank => return Err(GinHostError::Unavailable(m)),
            Ok(ConnRecord::Failed(m)) => {
                return Err(GinHostError::Remote(format!("rank {r} could not set up the verbs transport: {m}")))
            }
            Err(e) => return Err(GinHostError::Invalid(format!("record of rank {r}: {e}"))),
        }
    }
    let ll = |l: u8| if l == ffi::IBV_LINK_LAYER_ETHERNET { "Ethernet (RoCE)" } else { "InfiniBand" };
    let mine = ll(out[rank].link_layer);
    if let Some(c) = out.iter().find(|c| ll(c.link_layer) != mine) {
        return Err(GinHostError::Invalid(format!(
            "rank {} uses {} and rank {rank} {mine}: the ranks' ports cannot reach each other",
            c.rank,
            ll(c.link_layer)
        )));
    }
    Ok(out)
}

/// Attributes that move this rank's QP toward `peer` into RTR.
fn rtr_params(me: &ConnInfo, peer: &ConnInfo, config: &VerbsConfig, max_qp_rd_atom: u8) -> ffi::RtrParams {
    rtr_to(&me.port_addr(), &peer.port_addr(), peer.qps[me.rank as usize], config, max_qp_rd_atom)
}

/// Attributes that move a QP on port `me` toward the peer's QP `dest` on
/// port `peer` into RTR.
fn rtr_to(
    me: &rc::PortAddr,
    peer: &rc::PortAddr,
    dest: QpEndpoint,
    config: &VerbsConfig,
    max_qp_rd_atom: u8,
) -> ffi::RtrParams {
    let ethernet = me.link_layer == ffi::IBV_LINK_LAYER_ETHERNET;
    // InfiniBand needs a GRH only to leave the subnet (different GID prefix).
    let other_subnet = peer.gid[..8] != me.gid[..8] && peer.gid != [0; 16];
    ffi::RtrParams {
        port: me.port,
        mtu: me.mtu.min(peer.mtu),
        dest_qpn: dest.qpn,
        rq_psn: dest.psn,
        dlid: peer.lid,
        sl: config.service_level,
        grh: (ethernet || other_subnet).then_some(ffi::Grh {
            dgid: peer.gid,
            sgid_index: config.gid_index,
            hop_limit: 255,
            traffic_class: config.traffic_class,
        }),
        max_dest_rd_atomic: max_qp_rd_atom.clamp(1, 16),
        min_rnr_timer: 12,
    }
}

/// Attributes that move this rank's QP toward `peer` into RTS.
fn rts_params(me: &ConnInfo, peer: usize, config: &VerbsConfig, max_qp_init_rd_atom: u8) -> ffi::RtsParams {
    rts_with(me.qps[peer].psn, config, max_qp_init_rd_atom)
}

/// RTR → RTS attributes of a QP sending from PSN `sq_psn`.
fn rts_with(sq_psn: u32, config: &VerbsConfig, max_qp_init_rd_atom: u8) -> ffi::RtsParams {
    ffi::RtsParams {
        sq_psn,
        timeout: config.ack_timeout,
        retry_cnt: config.retry_count,
        rnr_retry: 7,
        max_rd_atomic: max_qp_init_rd_atom.clamp(1, 16),
    }
}

/// Status of the second exchange: empty means ready.
fn ready_record(r: &GinResult<()>) -> Vec<u8> {
    match r {
        Ok(()) => Vec::new(),
        Err(e) => conninfo::encode(&ConnRecord::Failed(e.to_string())),
    }
}

fn check_ready(rank: usize, records: &[Vec<u8>], own: GinResult<()>) -> GinResult<()> {
    own?;
    for (r, b) in records.iter().enumerate() {
        if b.is_empty() || r == rank {
            continue;
        }
        let m = match conninfo::decode(b) {
            Ok(ConnRecord::Failed(m)) => m,
            _ => "a malformed status".into(),
        };
        return Err(GinHostError::Remote(format!("rank {r} could not connect its verbs queue pairs: {m}")));
    }
    Ok(())
}

/// The verbs transport (see the module docs).
pub struct VerbsTransport {
    // Field order is drop order: the NIC (destroying QPs and deregistering
    // every region) goes before the buffers it registered.
    nic: Box<dyn Nic>,
    staging_buf: ffi::HostBuf,
    scratch: ffi::HostBuf,
    control: ffi::HostBuf,
    staging_lkey: u32,
    scratch_lkey: u32,
    rank: usize,
    qps: Vec<usize>,
    peers: Vec<plan::RemotePeer>,
    control_remote: Vec<(u64, u32)>,
    queues: Vec<SendQueue>,
    plans: Vec<QpPlanState>,
    state: Vec<PeerState>,
    failures: Vec<PeerFailure>,
    local_windows: Vec<(u64, u64, u32)>,
    staging: Staging,
    host_limits: PlanLimits,
    device_limits: PlanLimits,
    staged_limits: PlanLimits,
    wrs: Vec<WrSpec>,
    completions: Vec<ffi::Completion>,
    /// Zero-copy puts issued (the [`Transport::issued`] mark).
    marks: u64,
    /// Zero-copy puts not known complete: (mark, peer, last request's sequence).
    in_flight: VecDeque<(u64, usize, u64)>,
    wait_timeout: Duration,
    atomics_global: bool,
    closed: bool,
}

// SAFETY: the raw pointers inside (verbs objects, registered buffers) are
// owned by the transport and only used through `&mut self`; libibverbs
// objects may be used from any thread.
unsafe impl Send for VerbsTransport {}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("rank", &self.rank)
            .field("nranks", &self.qps.len())
            .field("device", &self.nic.name())
            .finish_non_exhaustive()
    }
}

impl VerbsTransport {
    /// Connects this rank (`bootstrap.rank()`) to every rank, itself
    /// included; a collective call of all ranks (two allgathers). Every
    /// rank returns an error if any rank could not set up its side:
    /// `Unavailable` here when libibverbs, a device or an active port is
    /// missing, `Remote` naming the rank when it was another rank.
    ///
    /// # Safety
    /// The memory `mem` names — every window's range, and the signal array
    /// (`total_signals` 8-aligned u64s) — stays allocated and mapped until
    /// the transport is dropped (the NIC writes into it whenever a peer
    /// sends); the signal words are only accessed atomically; every
    /// [`Dmabuf::fd`] is an open dmabuf of its window during this call.
    pub unsafe fn connect(
        bootstrap: &dyn Bootstrap,
        mem: &VerbsMemory,
        config: &VerbsConfig,
    ) -> GinResult<VerbsTransport> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        if rank >= nranks {
            return Err(GinHostError::Invalid(format!("rank {rank} of {nranks}")));
        }
        let local = setup_local(rank, nranks, mem, config);
        let record = match &local {
            Ok(l) => ConnRecord::Ready(l.info.clone()),
            Err(e) => ConnRecord::Failed(format!("rank {rank}: {e}")),
        };
        // Every rank takes part in both exchanges whatever happened locally,
        // and all decide on the same records: nobody is left waiting.
        let records = bootstrap.allgather(&conninfo::encode(&record))?;
        let l = local?;
        let infos = merge_records(rank, nranks, &records)?;
        let me = &infos[rank];
        let connected = (|| {
            for (peer, info) in infos.iter().enumerate() {
                let rtr = rtr_params(me, info, config, l.caps.max_qp_rd_atom);
                l.hca.modify_rtr(l.qps[peer], &rtr)?;
                l.hca.modify_rts(l.qps[peer], &rts_params(me, peer, config, l.caps.max_qp_init_rd_atom))?;
            }
            Ok(())
        })();
        let statuses = bootstrap.allgather(&ready_record(&connected))?;
        check_ready(rank, &statuses, connected)?;
        let max_msg = if l.port.max_msg_sz == 0 { 1 << 30 } else { l.port.max_msg_sz as u64 };
        let atomics_global = l.caps.atomic_cap == ffi::IBV_ATOMIC_GLOB;
        tracing::info!(
            rank,
            nranks,
            device = l.hca.name(),
            port = config.port,
            mtu = l.info.mtu,
            atomics_global,
            "GIN verbs transport connected"
        );
        let parts = Parts {
            nic: Box::new(l.hca),
            staging_buf: l.staging_buf,
            scratch: l.scratch,
            control: l.control,
            staging_lkey: l.staging_lkey,
            scratch_lkey: l.scratch_lkey,
            rank,
            qps: l.qps,
            depth: l.depth,
            max_inline: l.max_inline,
            max_msg,
            local_windows: l.local_windows,
            atomics_global,
        };
        Ok(VerbsTransport::assemble(parts, &infos, config))
    }

    /// The executor over `p`, connected to the peers `infos` describe.
    fn assemble(p: Parts, infos: &[ConnInfo], config: &VerbsConfig) -> VerbsTransport {
        let nranks = infos.len();
        let flush_read = config.flush_before_signal;
        let staged_msg = p.max_msg.min(config.staging_piece as u64);
        VerbsTransport {
            staging: Staging::new(p.staging_buf.len() as u64),
            host_limits: PlanLimits { max_msg: staged_msg, max_inline: p.max_inline, flush_read },
            device_limits: PlanLimits { max_msg: p.max_msg, max_inline: 0, flush_read },
            staged_limits: PlanLimits { max_msg: staged_msg, max_inline: 0, flush_read },
            peers: infos.iter().map(ConnInfo::remote_peer).collect(),
            control_remote: infos.iter().map(|c| (c.control_addr, c.control_rkey)).collect(),
            queues: (0..nranks).map(|_| SendQueue::new(p.depth, config.signal_interval)).collect(),
            plans: vec![QpPlanState::default(); nranks],
            state: vec![PeerState::Up; nranks],
            failures: Vec::new(),
            local_windows: p.local_windows,
            wrs: Vec::new(),
            completions: Vec::new(),
            marks: 0,
            in_flight: VecDeque::new(),
            wait_timeout: config.wait_timeout,
            atomics_global: p.atomics_global,
            closed: false,
            nic: p.nic,
            staging_buf: p.staging_buf,
            scratch: p.scratch,
            control: p.control,
            staging_lkey: p.staging_lkey,
            scratch_lkey: p.scratch_lkey,
            rank: p.rank,
            qps: p.qps,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The RDMA device in use.
    pub fn device_name(&self) -> &str {
        self.nic.name()
    }

    /// Whether the device's atomics are atomic with respect to the CPU's
    /// (`IBV_ATOMIC_GLOB`), so that other writers may add to the same signal
    /// words with CPU atomics.
    pub fn atomics_global(&self) -> bool {
        self.atomics_global
    }

    fn check_peer(&mut self, peer: usize) -> GinResult<()> {
        if peer >= self.qps.len() {
            return Err(GinHostError::Invalid(format!("peer {peer} out of range ({} ranks)", self.qps.len())));
        }
        if self.closed {
            return Err(GinHostError::Invalid("GIN verbs transport is closed".into()));
        }
        if self.state[peer] == PeerState::Up && self.control.load_word(peer) != 0 {
            self.state[peer] = PeerState::Left;
        }
        self.peer_status(peer)
    }

    fn peer_status(&self, peer: usize) -> GinResult<()> {
        match self.state[peer] {
            PeerState::Up => Ok(()),
            PeerState::Left => Err(GinHostError::Remote(format!("rank {peer} has closed its GIN transport"))),
            PeerState::Failed => Err(GinHostError::Remote(format!("connection to rank {peer} failed"))),
        }
    }

    /// The peer's QP failed (error completion, post refused, no progress):
    /// its requests are void; report it unless it said goodbye.
    fn peer_broken(&mut self, peer: usize, why: String) {
        self.queues[peer].fail_all();
        if self.state[peer] != PeerState::Up {
            return;
        }
        if self.control.load_word(peer) != 0 {
            self.state[peer] = PeerState::Left;
        } else {
            self.state[peer] = PeerState::Failed;
            let error = GinHostError::Remote(why);
            tracing::warn!(peer, %error, "GIN verbs: peer failed");
            self.failures.push(PeerFailure { peer, error });
        }
        let _ = self.nic.modify_error(self.qps[peer]);
        let queues = &self.queues;
        self.staging.release(|p, s| queues[p].is_done(s));
    }

    /// Polls the completion queue once; returns how many completions came.
    fn poll_cq(&mut self) -> GinResult<usize> {
        let mut cs = std::mem::take(&mut self.completions);
        cs.clear();
        let n = self.nic.poll(&mut cs);
        for c in &cs {
            let (peer, low) = plan::split_wr_id(c.wr_id);
            if peer >= self.queues.len() {
                tracing::error!(wr_id = c.wr_id, "GIN verbs: completion of an unknown work request");
                continue;
            }
            if c.ok() {
                if self.queues[peer].complete(low).is_none() {
                    tracing::debug!(peer, wr_id = c.wr_id, "GIN verbs: stale completion");
                }
            } else if self.state[peer] == PeerState::Up {
                let status = self.nic.status_str(c.status);
                self.peer_broken(
                    peer,
                    format!(
                        "work completion error on the queue pair to rank {peer}: {status} (status {}, vendor error {:#x}, QP {:#x})",
                        c.status, c.vendor_err, c.qp_num
                    ),
                );
            } else {
                self.queues[peer].fail_all();
            }
        }
        self.completions = cs;
        let queues = &self.queues;
        self.staging.release(|p, s| queues[p].is_done(s));
        n
    }

    /// Polls until `ready`, failing `blocker()`'s peer once the wait timeout
    /// passes. `Err` only if the CQ failed or the peer `watch` failed.
    fn wait(
        &mut self,
        watch: Option<usize>,
        ready: impl Fn(&Self) -> bool,
        blocker: impl Fn(&Self) -> Option<usize>,
    ) -> GinResult<()> {
        let mut deadline = Instant::now() + self.wait_timeout;
        let mut idle = 0u32;
        loop {
            if let Some(p) = watch {
                self.peer_status(p)?;
            }
            if ready(self) {
                return Ok(());
            }
            if self.poll_cq()? > 0 {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle > 256 {
                std::thread::yield_now();
            }
            if Instant::now() >= deadline {
                match blocker(self) {
                    Some(p) if self.state[p] == PeerState::Up => {
                        let t = self.wait_timeout;
                        self.peer_broken(p, format!("no completion from rank {p} in {t:?}"));
                        // Go on waiting (for the others) with a fresh limit.
                        deadline = Instant::now() + t;
                    }
                    _ => {
                        return Err(GinHostError::Timeout(format!("GIN verbs: no progress in {:?}", self.wait_timeout)))
                    }
                }
            }
        }
    }

    fn wait_room(&mut self, peer: usize) -> GinResult<()> {
        self.wait(Some(peer), |s| s.queues[peer].room() > 0, |_| Some(peer))
    }

    /// The last mark up to which every zero-copy put has completed (or
    /// was voided by its peer's failure), retiring what has.
    fn retired_mark(&mut self) -> u64 {
        while let Some(&(_, peer, seq)) = self.in_flight.front() {
            if !self.queues[peer].is_done(seq) {
                break;
            }
            self.in_flight.pop_front();
        }
        self.in_flight.front().map_or(self.marks, |&(mark, _, _)| mark - 1)
    }

    /// A staging slot of `len` bytes for the next request to `peer`.
    fn stage(&mut self, peer: usize, len: u64) -> GinResult<u64> {
        loop {
            let seq = self.queues[peer].next_seq();
            if let Some(off) = self.staging.alloc(len, peer, seq) {
                return Ok(off);
            }
            // Full: the oldest slot's request is signaled; wait for it.
            self.wait(
                Some(peer),
                |s| s.staging.used() + 2 * len <= s.staging.capacity() || s.staging.is_empty(),
                |s| s.staging.front_owner(),
            )?;
        }
    }

    /// Posts `self.wrs` (planned for `peer`) with `data`; returns the
    /// sequence number of the last request posted.
    fn post_planned(&mut self, peer: usize, data: Data<'_>) -> GinResult<Option<u64>> {
        let wrs = std::mem::take(&mut self.wrs);
        let r = self.post_all(peer, data, &wrs);
        self.wrs = wrs;
        r
    }

    fn post_all(&mut self, peer: usize, data: Data<'_>, wrs: &[WrSpec]) -> GinResult<Option<u64>> {
        let mut last = None;
        for spec in wrs {
            self.wait_room(peer)?;
            let len = spec.len;
            let mut staged = false;
            let sge = match (spec.local, data) {
                (LocalRef::Scratch, _) => (self.scratch.addr(), len, self.scratch_lkey),
                (LocalRef::Inline { offset }, Data::Host(d)) => (host_range(d, offset, len)?.as_ptr() as u64, len, 0),
                (LocalRef::Data { offset }, Data::Registered { addr, lkey }) => (addr + offset, len, lkey),
                (LocalRef::Data { offset }, Data::Host(d)) => {
                    let src = host_range(d, offset, len)?;
                    let at = self.stage(peer, len as u64)?;
                    // SAFETY: the slot was just allocated: in bounds, not named
                    // by any posted request, no other slice of it alive.
                    let slot = unsafe { self.staging_buf.slice_mut(at as usize, len as usize) };
                    slot.copy_from_slice(src);
                    staged = true;
                    (self.staging_buf.addr() + at, len, self.staging_lkey)
                }
                (LocalRef::Data { offset }, Data::Device { local, addr }) => {
                    let at = self.stage(peer, len as u64)?;
                    // SAFETY: as above.
                    let slot = unsafe { self.staging_buf.slice_mut(at as usize, len as usize) };
                    if let Err(e) = local.read_device(addr + offset, slot) {
                        self.staging.unalloc_last();
                        return Err(e);
                    }
                    staged = true;
                    (self.staging_buf.addr() + at, len, self.staging_lkey)
                }
                (LocalRef::Inline { .. }, _) => {
                    return Err(GinHostError::Invalid("inline data planned for a non-host source".into()))
                }
            };
            let Some((seq, signaled)) = self.queues[peer].push(spec.signaled || staged) else {
                return Err(GinHostError::System("send queue full after waiting for room".into()));
            };
            let wr = ffi::PostWr {
                wr_id: plan::wr_id(peer, seq),
                opcode: spec.opcode,
                sge,
                remote_addr: spec.remote_addr,
                rkey: spec.rkey,
                add: spec.add,
                fence: spec.fence,
                signaled,
                inline: spec.inline(),
            };
            // SAFETY: the local buffer is registered with the lkey given (a
            // window, the staging slot just filled, the scratch word) and
            // stays allocated until the transport drops; the staging slot is
            // not reused before this request's completion (Staging); inline
            // data is the caller's slice, read during the call. The remote
            // range was checked against the peer's registration by the plan.
            let posted = unsafe { self.nic.post(self.qps[peer], &wr) };
            if let Err(errno) = posted {
                self.queues[peer].unpush();
                if staged {
                    self.staging.unalloc_last();
                }
                let e = std::io::Error::from_raw_os_error(errno);
                self.peer_broken(peer, format!("posting to the queue pair of rank {peer} failed: {e}"));
                return Err(GinHostError::Remote(format!("posting to rank {peer}: {e}")));
            }
            last = Some(seq);
        }
        Ok(last)
    }

    /// The lkey of a registered window holding `[addr, addr + bytes)`.
    fn registered(&self, addr: u64, bytes: u64) -> Option<u32> {
        self.local_windows
            .iter()
            .find(|&&(a, l, _)| addr >= a && addr.checked_add(bytes).is_some_and(|end| end <= a + l))
            .map(|&(_, _, k)| k)
    }

    /// Plans a put into `self.wrs`, with the limits of its data's `route`.
    fn plan_put(
        &mut self,
        peer: usize,
        dst_window: u32,
        dst_offset: u64,
        bytes: u64,
        route: Route,
        signal: Option<RemoteSignal>,
    ) -> GinResult<()> {
        let (source, lim) = match route {
            Route::Host => (Source::Host, self.host_limits),
            Route::ZeroCopy => (Source::Registered, self.device_limits),
            Route::StagedDevice => (Source::Registered, self.staged_limits),
        };
        self.wrs.clear();
        let (p, st) = (&self.peers[peer], &mut self.plans[peer]);
        plan::plan_put(p, &lim, st, dst_window, dst_offset, bytes, source, signal, &mut self.wrs)
    }
}

impl Transport for VerbsTransport {
    fn put(&mut self, to: PutTarget, data: &[u8]) -> GinResult<()> {
        let PutTarget { peer, dst_window, dst_offset, signal } = to;
        self.check_peer(peer)?;
        self.plan_put(peer, dst_window, dst_offset, data.len() as u64, Route::Host, signal)?;
        self.post_planned(peer, Data::Host(data)).map(|_| ())
    }

    fn signal(&mut self, peer: usize, signal: u32, value: u64) -> GinResult<()> {
        self.check_peer(peer)?;
        self.wrs.clear();
        let lim = self.host_limits;
        plan::plan_signal(&self.peers[peer], &lim, &mut self.plans[peer], signal, value, &mut self.wrs)?;
        self.post_planned(peer, Data::Host(&[])).map(|_| ())
    }

    fn put_from_device(
        &mut self,
        local: &dyn LocalMemory,
        to: PutTarget,
        src: u64,
        bytes: u64,
        _buf: &mut Vec<u8>,
    ) -> GinResult<()> {
        let PutTarget { peer, dst_window, dst_offset, signal } = to;
        self.check_peer(peer)?;
        if bytes == 0 {
            return self.put(PutTarget::new(peer, dst_window, dst_offset, signal), &[]);
        }
        match self.registered(src, bytes) {
            Some(lkey) => {
                // Zero copy from the registered window: the source is in use
                // until the last request completes, so the operation retires
                // then (`issued` / `retired`).
                self.plan_put(peer, dst_window, dst_offset, bytes, Route::ZeroCopy, signal)?;
                if let Some(seq) = self.post_planned(peer, Data::Registered { addr: src, lkey })? {
                    self.marks += 1;
                    self.in_flight.push_back((self.marks, peer, seq));
                }
                Ok(())
            }
            None => {
                // Not registered: read into staging slots (consumed on return).
                self.plan_put(peer, dst_window, dst_offset, bytes, Route::StagedDevice, signal)?;
                self.post_planned(peer, Data::Device { local, addr: src }).map(|_| ())
            }
        }
    }

    /// RDMA READs from the peer's registered window straight into the
    /// destination (a registered window of this rank); the get retires when
    /// its last read completes (`issued` / `retired`), as a zero-copy put.
    /// Whether a completed read into GPU memory is visible to the GPU's
    /// kernels without a further flush (NCCL's GDR flush read) depends on
    /// the platform; this transport issues none (untested on NICs).
    fn get(&mut self, from: GetSource, dst: u64, bytes: u64) -> GinResult<()> {
        let GetSource { peer, src_window, src_offset } = from;
        self.check_peer(peer)?;
        let Some(lkey) = self.registered(dst, bytes) else {
            return Err(GinHostError::Invalid(format!(
                "a get's destination ({bytes} bytes at {dst:#x}) is not in a window registered with the verbs transport"
            )));
        };
        if peer == self.rank {
            let (src, _) = plan::remote_range(&self.peers[peer], src_window, src_offset, bytes)?;
            if src < dst + bytes && dst < src + bytes {
                return Err(GinHostError::Invalid(format!(
                    "a get of {bytes} bytes from this rank overlaps its destination"
                )));
            }
        }
        self.wrs.clear();
        let lim = self.device_limits;
        plan::plan_get(&self.peers[peer], &lim, src_window, src_offset, bytes, &mut self.wrs)?;
        if let Some(seq) = self.post_planned(peer, Data::Registered { addr: dst, lkey })? {
            self.marks += 1;
            self.in_flight.push_back((self.marks, peer, seq));
        }
        Ok(())
    }

    fn progress(&mut self, failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        // Drain what is there (bounded, so a flood cannot hold the proxy).
        for _ in 0..64 {
            if self.poll_cq()? == 0 {
                break;
            }
        }
        failed.append(&mut self.failures);
        Ok(())
    }

    fn issued(&self) -> u64 {
        self.marks
    }

    fn retired(&mut self) -> GinResult<u64> {
        if !self.in_flight.is_empty() {
            self.poll_cq()?;
        }
        Ok(self.retired_mark())
    }

    fn flush(&mut self) -> GinResult<()> {
        self.wait(
            None,
            |s| s.queues.iter().zip(&s.state).all(|(q, st)| q.idle() || *st != PeerState::Up),
            |s| (0..s.queues.len()).find(|&p| s.state[p] == PeerState::Up && !s.queues[p].idle()),
        )
    }

    fn close(&mut self, graceful: bool) {
        if self.closed {
            return;
        }
        let t = self.wait_timeout;
        if graceful {
            // Bounded: a peer that does not answer must not hold the close.
            self.wait_timeout = t.min(Duration::from_secs(10));
            // Tell every live peer this rank leaves: 1 into our control word there.
            for peer in 0..self.qps.len() {
                if peer == self.rank || self.check_peer(peer).is_err() {
                    continue;
                }
                if let Err(e) = self.post_bye(peer) {
                    tracing::debug!(peer, %e, "GIN verbs: goodbye not sent");
                }
            }
            let _ = self.flush();
            self.wait_timeout = t;
        }
        self.closed = true;
        // From here on the QPs neither send nor accept anything.
        for &q in &self.qps {
            let _ = self.nic.modify_error(q);
        }
    }
}

impl VerbsTransport {
    /// Writes 1 (scratch word 1) into this rank's control word at `peer`.
    fn post_bye(&mut self, peer: usize) -> GinResult<()> {
        self.wait_room(peer)?;
        let (addr, rkey) = self.control_remote[peer];
        let Some((seq, _)) = self.queues[peer].push(true) else {
            return Err(GinHostError::System("send queue full".into()));
        };
        let wr = ffi::PostWr {
            wr_id: plan::wr_id(peer, seq),
            opcode: WrOpcode::RdmaWrite,
            sge: (self.scratch.addr() + 8, 8, self.scratch_lkey),
            remote_addr: addr + 8 * self.rank as u64,
            rkey,
            add: 0,
            fence: false,
            signaled: true,
            inline: false,
        };
        // SAFETY: the scratch buffer is registered with `scratch_lkey` and
        // lives as long as the transport; the remote range is the peer's
        // control word for this rank (its advertised region).
        if let Err(errno) = unsafe { self.nic.post(self.qps[peer], &wr) } {
            self.queues[peer].unpush();
            return Err(GinHostError::Remote(format!("posting to rank {peer}: errno {errno}")));
        }
        Ok(())
    }
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        self.close(true);
    }
}

#[cfg(test)]
mod tests;
