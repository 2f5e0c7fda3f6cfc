//! The GIN part of a device communicator: memory shared by the GPU and the
//! proxy, the proxy itself, and the adapters `devcomm-gin` needs.
//!
//! Memory (see `devcomm_device::abi::gin` for who writes what):
//!
//! * host memory the GPU can read and write ([`HostMappedBuffer`]): rings,
//!   tails, signals, counters — each region 4096-byte aligned;
//! * device memory: producer tickets, cached tails, signal shadows.

use super::stream_copy_queue::StreamCopyQueue;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::gin::{GinTransport, GinType, GIN_TRANSPORT_ENV};
use crate::runtime::{
    AddressRange, Device, DeviceBuffer, HostMappedBuffer, SharedHostBuffer, SharedHostMapping, Stream,
};
use crate::window::{allgather_outcome, fd_passing};
use devcomm_device::abi::gin::{GinSlot, GinState, GinStateParts, QueueTail, SLOT_BYTES, TAIL_STRIDE};
use devcomm_gin::transport::copy_engine::{CopyEngineTransport, SameHostPeer};
use devcomm_gin::{Bootstrap, CopyQueue, GinHostError, GinHostMemory, GinResult, LocalMemory};
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::dev_comm::DevCommRequirements;

/// Maps the proxy's errors onto devcomm's.
pub(crate) fn from_gin(e: GinHostError) -> Error {
    from_gin_as(e, "GIN")
}

/// [`from_gin`] with the messages prefixed by `who` (another user of
/// `devcomm-gin`'s layers: the point-to-point engine's verbs transport).
pub(crate) fn from_gin_as(e: GinHostError, who: &str) -> Error {
    match e {
        GinHostError::Invalid(m) => Error::InvalidArgument(format!("{who}: {m}")),
        GinHostError::Remote(m) => Error::RemoteError(format!("{who}: {m}")),
        GinHostError::System(m) => Error::SystemError(format!("{who}: {m}")),
        GinHostError::Timeout(m) => Error::Timeout(format!("{who}: {m}")),
        GinHostError::Unavailable(m) => Error::InvalidUsage(format!("{who}: {m}")),
    }
}

/// The communicator's bootstrap, as `devcomm-gin` sees it.
pub(crate) struct CommBootstrap<'c>(pub(crate) &'c Communicator);

impl Bootstrap for CommBootstrap<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn nranks(&self) -> usize {
        self.0.count()
    }
    fn allgather(&self, data: &[u8]) -> GinResult<Vec<Vec<u8>>> {
        self.0.bootstrap_allgather(data).map_err(|e| GinHostError::Remote(e.to_string()))
    }
}

/// This rank's windows, as the proxy reaches them: window ids resolve
/// through the communicator's window table; synchronous reads and writes go
/// through a stream of the proxy's own, asynchronous work through
/// [`StreamCopyQueue`]s.
pub(crate) struct CommMemory {
    device: Device,
    stream: Stream,
    table: Arc<Mutex<HashMap<u32, (u64, u64)>>>,
    /// Longest wait for one synchronous copy (the proxy thread and the TCP
    /// receivers make them): a device that never runs it fails the
    /// operation (`Timeout`) instead of hanging them.
    copy_limit: std::time::Duration,
}

impl LocalMemory for CommMemory {
    fn window_addr(&self, window: u32, offset: u64, bytes: u64) -> GinResult<u64> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let &(base, size) = table
            .get(&window)
            .ok_or_else(|| GinHostError::Invalid(format!("window {window} is not registered on this rank")))?;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(GinHostError::Invalid(format!(
                "{bytes} bytes at offset {offset} exceed window {window} ({size} bytes)"
            )));
        }
        Ok(base + offset)
    }

    fn write_device(&self, addr: u64, data: &[u8]) -> GinResult<()> {
        // `data` is the proxy's or a receiver's own heap buffer (pageable),
        // as `write_raw_within` requires.
        self.stream.write_raw_within(addr, data, self.copy_limit).map_err(copy_err)
    }

    fn read_device(&self, addr: u64, out: &mut [u8]) -> GinResult<()> {
        // As above: `out` is a heap buffer of the proxy's.
        self.stream.read_raw_within(addr, out, self.copy_limit).map_err(copy_err)
    }

    fn copy_queue(&self) -> GinResult<Box<dyn CopyQueue>> {
        Ok(Box::new(StreamCopyQueue::new(&self.device)?))
    }
}

/// A synchronous copy's error as the proxy reports it (`Timeout` kept).
fn copy_err(e: Error) -> GinHostError {
    match e {
        Error::Timeout(m) => GinHostError::Timeout(format!("a device copy of the GIN proxy: {m}")),
        e => GinHostError::System(e.to_string()),
    }
}

/// The transport this rank's proxy drives (resolved from [`GinTransport`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TransportChoice {
    /// Copy engine for same-host peers, TCP for the others (`auto`).
    CopyEngine,
    /// TCP for everyone.
    Tcp,
    /// RDMA Verbs for everyone (cargo feature `verbs`).
    Verbs,
}

impl TransportChoice {
    fn code(self) -> u8 {
        match self {
            TransportChoice::CopyEngine => 0,
            TransportChoice::Tcp => 1,
            TransportChoice::Verbs => 2,
        }
    }
}

fn transport_code(t: GinTransport) -> u8 {
    match t {
        GinTransport::Auto => 0,
        GinTransport::Tcp => 1,
        GinTransport::Verbs => 2,
    }
}

/// What this rank would use: `asked` ([`GinTransport::requested`]), with
/// `auto` resolved for a device that has (`mem_ops`) 64-bit stream memory
/// operations or not (the copy engine's fences need them; else TCP).
fn transport_choice(asked: GinTransport, mem_ops: bool, dev_name: &str) -> Result<TransportChoice> {
    match asked {
        GinTransport::Auto if !mem_ops => {
            tracing::warn!("{dev_name}: no 64-bit stream memory operations; GIN uses TCP between same-host ranks");
            Ok(TransportChoice::Tcp)
        }
        GinTransport::Auto => Ok(TransportChoice::CopyEngine),
        GinTransport::Tcp => Ok(TransportChoice::Tcp),
        GinTransport::Verbs if !crate::gin::VERBS_BUILT => Err(Error::invalid_argument(format!(
            "the GIN verbs transport was asked for ({GIN_TRANSPORT_ENV}=verbs or Config::gin_transport), but this \
             build of devcomm lacks the `verbs` cargo feature (build with `--features devcomm/verbs`, or use auto or tcp)"
        ))),
        GinTransport::Verbs => Ok(TransportChoice::Verbs),
    }
}

/// The transport every rank uses, from every rank's (asked, resolved) pair
/// in rank order: all must have asked for the same; where `auto` resolved
/// differently (a device without stream memory operations), all use TCP.
fn decide_transport(pairs: &[Vec<u8>]) -> Result<TransportChoice> {
    let name = |c: u8| match c {
        0 => "auto",
        1 => "tcp",
        2 => "verbs",
        _ => "?",
    };
    let Some(first) = pairs.first() else { return Err(Error::internal("no rank's GIN transport")) };
    for (r, p) in pairs.iter().enumerate() {
        if p.len() != 2 || p[0] > 2 || p[1] > 2 {
            return Err(Error::remote(format!("rank {r} sent a malformed GIN transport choice")));
        }
        if p[0] != first[0] {
            return Err(Error::invalid_argument(format!(
                "rank 0 asks for GIN transport {} and rank {r} for {}: every rank must ask for the same \
                 ({GIN_TRANSPORT_ENV} or Config::gin_transport)",
                name(first[0]),
                name(p[0])
            )));
        }
    }
    let resolved = [TransportChoice::CopyEngine, TransportChoice::Tcp, TransportChoice::Verbs];
    let pick = |c: u8| resolved.into_iter().find(|t| t.code() == c).unwrap_or(TransportChoice::Tcp);
    if pairs.iter().all(|p| p[1] == first[1]) {
        Ok(pick(first[1]))
    } else {
        // Only `auto` resolves per device: copy engine on some ranks, TCP on others.
        Ok(TransportChoice::Tcp)
    }
}

/// The transport of every rank's proxy: this rank's choice (config, then
/// `DEVCOMM_GIN_TRANSPORT`), agreed on by all ranks — an error on one rank
/// (a bad value, `verbs` without the feature) or ranks asking for different
/// transports is an error on every rank, before any transport connects.
fn agree_transport(comm: &Communicator, dev: &Device) -> Result<TransportChoice> {
    let local = GinTransport::requested(comm.config().gin_transport, |k| std::env::var(k).ok()).and_then(|asked| {
        let c = transport_choice(asked, dev.stream().supports_write_values(), &dev.name())?;
        Ok(vec![transport_code(asked), c.code()])
    });
    let pairs = allgather_outcome(comm, "create_dev_comm (GIN transport)", local)?;
    decide_transport(&pairs)
}

/// How long the copy-engine transport's fences may stay in flight without
/// one passing before it fails: the communicator's op timeout, within
/// 10 s (a loaded emulator's stream threads may pause for seconds) and
/// `DRAIN_TIMEOUT`.
fn fence_timeout(op_timeout: std::time::Duration) -> std::time::Duration {
    op_timeout.clamp(std::time::Duration::from_secs(10), devcomm_gin::transport::copy_engine::DRAIN_TIMEOUT)
}

/// What this process mapped of its same-host peers (kept alive with the transport).
struct PeerMappings {
    _signals: Vec<SharedHostMapping>,
    _windows: Vec<AddressRange>,
}

/// One fd-exchange round among `peers` (same-host world ranks, self excluded):
/// sends `fd` (announcing `size`) to each, returns (from_rank, size, fd) from each.
fn exchange_fd(
    comm: &Communicator,
    peers: &[usize],
    fd: std::os::fd::BorrowedFd<'_>,
    size: u64,
) -> Result<Vec<(usize, u64, std::os::fd::OwnedFd)>> {
    let magic = comm.unique_id().magic();
    let seq = comm.ext.reg_seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let listener = fd_passing::bind(&fd_passing::socket_name(magic, seq, comm.rank()))?;
    comm.bootstrap_barrier()?;
    let deadline = Instant::now() + comm.config().op_timeout;
    let abort = comm.abort_flag();
    let header = fd_passing::Header { magic, seq, from_rank: comm.rank() as u64, alloc_size: size };
    for &p in peers {
        fd_passing::send_fd(&fd_passing::socket_name(magic, seq, p), &header, fd, deadline, abort)?;
    }
    let got = fd_passing::accept_fds(&listener, peers.len(), deadline, abort)?;
    Ok(got.into_iter().map(|(h, f)| (h.from_rank as usize, h.alloc_size, f)).collect())
}

/// Maps every same-host peer's signal array and used windows into this
/// process; returns the copy-engine peer table (indexed by world rank).
fn map_same_host_peers(
    comm: &Communicator,
    req: &DevCommRequirements,
    signals: &SharedHostBuffer,
    total_signals: u32,
) -> Result<(Vec<Option<SameHostPeer>>, PeerMappings)> {
    let n = comm.count();
    let me = comm.rank();
    let mut same: Vec<usize> = Vec::new();
    for p in 0..n {
        if p != me && comm.same_host(p)? {
            same.push(p);
        }
    }
    let windows = req.live_windows()?;
    let mut peers: Vec<Option<SameHostPeer>> = (0..n).map(|_| None).collect();
    // Ourselves: our own windows and signals.
    let own: HashMap<u32, (u64, u64)> = comm.ext.window_table.lock().unwrap_or_else(|p| p.into_inner()).clone();
    peers[me] = Some(SameHostPeer { windows: own, signals: signals.host_ptr() as *mut u64, total_signals });
    let mut maps = PeerMappings { _signals: Vec::new(), _windows: Vec::new() };
    // Signal arrays.
    let fd = signals.export_fd()?;
    for (from, size, f) in exchange_fd(comm, &same, fd.as_fd(), signals.len() as u64)? {
        let m = SharedHostMapping::map(f.as_fd(), size as usize)?;
        peers[from] = Some(SameHostPeer { windows: HashMap::new(), signals: m.host_ptr() as *mut u64, total_signals });
        maps._signals.push(m);
    }
    // Windows: where each rank's window sits in its allocation, then the allocations.
    let mut mine = Vec::new();
    for w in &windows {
        mine.extend_from_slice(&w.desc.id().to_le_bytes());
        mine.extend_from_slice(&w.offset_in_alloc().to_le_bytes());
        mine.extend_from_slice(&w.desc.size().to_le_bytes());
    }
    let layouts = comm.bootstrap_allgather(&mine)?;
    for (k, w) in windows.iter().enumerate() {
        let fd = w.alloc().export_fd()?;
        for (from, size, f) in exchange_fd(comm, &same, fd.as_fd(), w.alloc().size() as u64)? {
            let rec = layouts.get(from).and_then(|b| b.get(k * 20..k * 20 + 20)).ok_or_else(|| {
                Error::remote(format!("rank {from} declared fewer windows with use_window than this rank"))
            })?;
            let id = u32::from_le_bytes(rec[0..4].try_into().unwrap_or_default());
            let offset = u64::from_le_bytes(rec[4..12].try_into().unwrap_or_default());
            let wsize = u64::from_le_bytes(rec[12..20].try_into().unwrap_or_default());
            let mut range = AddressRange::reserve(comm.device(), size as usize)?;
            range.map_fd(0, f.as_fd(), size as usize)?;
            if let Some(p) = peers[from].as_mut() {
                p.windows.insert(id, (range.base() + offset, wsize));
            }
            maps._windows.push(range);
        }
    }
    Ok((peers, maps))
}

/// Offsets of the regions inside the host buffer.
struct HostLayout {
    rings: usize,
    tails: usize,
    counters: usize,
    len: usize,
}

fn host_layout(rings: usize, depth: usize, counters: usize) -> HostLayout {
    let page = |x: usize| x.next_multiple_of(4096);
    let r = 0;
    let t = page(r + rings * depth * SLOT_BYTES);
    let c = page(t + rings * TAIL_STRIDE);
    HostLayout { rings: r, tails: t, counters: c, len: page(c + counters.max(1) * 8) }
}

/// The GIN errors of a communicator's device communicators, for its
/// `get_async_error`: the proxies of live ones (by id), and the first error
/// a proxy stopped with when nobody received it (a dropped handle).
#[derive(Default)]
pub(crate) struct GinErrors {
    next: std::sync::atomic::AtomicU64,
    live: Mutex<Vec<(u64, devcomm_gin::proxy::ProxyMonitor)>>,
    unclaimed: Mutex<Option<Error>>,
}

impl GinErrors {
    fn register(&self, m: devcomm_gin::proxy::ProxyMonitor) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.live.lock().unwrap_or_else(|p| p.into_inner()).push((id, m));
        id
    }

    fn deregister(&self, id: u64) {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
    }

    /// Keeps `e` (the first such) for `get_async_error`: a proxy's stop error nobody received.
    pub(crate) fn unclaimed(&self, e: Error) {
        self.unclaimed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }

    /// The first error of a live proxy, else the unclaimed one.
    pub(crate) fn first(&self) -> Option<Error> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = live.iter().find_map(|(_, m)| m.error()) {
            return Some(from_gin(e));
        }
        drop(live);
        self.unclaimed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// GIN memory and the running proxy of one device communicator.
pub(crate) struct GinResources {
    pub(crate) state: GinState,
    pub(crate) backend: GinType,
    /// Host view of the memory the proxy serves (signals, counters).
    pub(crate) mem: GinHostMemory,
    proxy: Option<devcomm_gin::proxy::Proxy>,
    /// The communicator's record of GIN errors, and this proxy's id there.
    errors: (Arc<crate::window::CommExt>, u64),
    // Dropped after the proxy (field order): the proxy reads this memory.
    _peers: Option<PeerMappings>,
    _signals: SharedHostBuffer,
    _host: HostMappedBuffer,
    _dev: DeviceBuffer<u64>,
}

impl GinResources {
    /// Allocates GIN memory, connects the transport and starts the proxy.
    /// Collective (the transport connects every pair of ranks).
    pub(crate) fn create(comm: &Communicator, req: &DevCommRequirements, backend: GinType) -> Result<GinResources> {
        if backend != GinType::Proxy {
            return Err(Error::invalid_usage(format!(
                "GIN backend {backend} has no host implementation in this build (the proxy does)"
            )));
        }
        let dev = comm.device().clone();
        let nranks = comm.count();
        let (contexts, depth) = req.gin_shape();
        let rings = contexts as usize * nranks;
        let total_signals =
            req.gin_signal_count as usize + req.rail_gin_barrier_count as usize + req.world_gin_barrier_count as usize;
        let counters = req.gin_counter_count as usize;
        let lay = host_layout(rings, depth as usize, counters);
        let host = HostMappedBuffer::new(&dev, lay.len)?;
        // Signals in shared memory: same-host peers' proxies add to them directly.
        let shared = SharedHostBuffer::new(&dev, total_signals.max(1) * 8)?;
        let dev_words = 3 * rings + total_signals.max(1);
        let mut dev_mem = dev.alloc::<u64>(dev_words)?;
        dev.stream().memset(&mut dev_mem, 0)?;
        dev.stream().synchronize()?;
        let h = host.host_ptr();
        let d = host.device_addr();
        let parts = GinStateParts {
            backend: backend.code(),
            connection: req.gin_connection_type.code(),
            contexts,
            queue_depth: depth,
            signal_count: req.gin_signal_count,
            counter_count: req.gin_counter_count,
            rail_barrier_count: req.rail_gin_barrier_count,
            world_barrier_count: req.world_gin_barrier_count,
            rings: d + lay.rings as u64,
            tails: d + lay.tails as u64,
            heads: dev_mem.device_addr(),
            tail_cache: dev_mem.device_addr() + rings as u64 * 8,
            signals: shared.device_addr(),
            counters: d + lay.counters as u64,
            shadows: dev_mem.device_addr() + 3 * rings as u64 * 8,
        };
        // SAFETY: the addresses are this rank's GIN memory just allocated
        // (host-mapped rings/tails/counters, device heads/caches/shadows,
        // shared signals), sized by the counts, owned by `GinResources`
        // together with the proxy that serves the rings.
        let state = unsafe { GinState::from_parts(parts) };
        // SAFETY: offsets inside the live host buffer, which outlives the proxy
        // (field order of GinResources).
        let mem = unsafe {
            GinHostMemory {
                rings: h.add(lay.rings) as *mut GinSlot,
                tails: h.add(lay.tails) as *mut QueueTail,
                signals: shared.host_ptr() as *mut u64,
                counters: h.add(lay.counters) as *mut u64,
                contexts,
                nranks: nranks as u32,
                depth,
                total_signals: total_signals as u32,
                counters_len: counters as u32,
            }
        };
        let local: Arc<dyn LocalMemory> = Arc::new(CommMemory {
            device: dev.clone(),
            stream: dev.new_stream()?,
            table: comm.ext.window_table.clone(),
            copy_limit: fence_timeout(comm.config().op_timeout),
        });
        let boot = CommBootstrap(comm);
        // SAFETY: the signals region holds `total_signals` u64s of the host
        // buffer, which outlives the transport and the proxy (field order).
        let landing = unsafe { devcomm_gin::transport::Landing::new(local.clone(), mem.signals, total_signals as u32) };
        let connect_tcp = move || -> Result<devcomm_gin::transport::tcp::TcpTransport> {
            let tcp = devcomm_gin::transport::tcp::TcpConfig::from_env().map_err(from_gin)?;
            devcomm_gin::transport::tcp::TcpTransport::connect(&boot, landing, &tcp).map_err(from_gin)
        };
        let (transport, peer_maps): (Box<dyn devcomm_gin::transport::Transport>, Option<PeerMappings>) =
            match agree_transport(comm, &dev)? {
                TransportChoice::Tcp => (Box::new(connect_tcp()?), None),
                TransportChoice::CopyEngine => {
                    let tcp_transport = connect_tcp()?;
                    let (peers, maps) = map_same_host_peers(comm, req, &shared, total_signals as u32)?;
                    // SAFETY: the mappings live in `maps`, kept in GinResources
                    // until after the proxy (and so the transport) is gone.
                    let mut ce = unsafe { CopyEngineTransport::new(local.clone(), peers, Box::new(tcp_transport)) }
                        .map_err(from_gin)?;
                    // Copies that never complete fail the transport (every
                    // ring, peers told) within about the op timeout, not never.
                    ce.set_fence_timeout(fence_timeout(comm.config().op_timeout));
                    (Box::new(ce), Some(maps))
                }
                #[cfg(feature = "verbs")]
                TransportChoice::Verbs => {
                    (Box::new(super::verbs::connect(comm, req, &shared, total_signals as u32)?), None)
                }
                #[cfg(not(feature = "verbs"))]
                TransportChoice::Verbs => {
                    return Err(Error::internal("GIN verbs transport chosen in a build without it"));
                }
            };
        // SAFETY: `mem` names the live host buffer (kept until the proxy has
        // stopped, by field order and `stop`); producers post with
        // `devcomm_device::gin::proxy::post`, which accesses shared words atomically.
        let proxy =
            unsafe { devcomm_gin::proxy::Proxy::start(mem, local, transport, comm.rank()) }.map_err(from_gin)?;
        let id = comm.ext.gin_errors.register(proxy.monitor());
        Ok(GinResources {
            state,
            backend,
            mem,
            proxy: Some(proxy),
            errors: (comm.ext.clone(), id),
            _peers: peer_maps,
            _signals: shared,
            _host: host,
            _dev: dev_mem,
        })
    }

    /// The first error the proxy met, if any (it goes on serving the rings
    /// the error did not concern).
    pub(crate) fn error(&self) -> Option<Error> {
        self.proxy.as_ref().and_then(|p| p.error()).map(from_gin)
    }

    /// Where each ring with traffic stands: `ring (context, peer): posted
    /// P, completed C` (tickets taken by the device, tickets the proxy
    /// completed), `failed` for a failed ring, and whether the next ticket's
    /// descriptor is published (`next ready`) or not yet (`next unpublished`:
    /// the proxy waits for its producer). For diagnosing a stalled kernel;
    /// reads the device's ticket counters on the device's stream.
    pub(crate) fn progress(&self, dev: &crate::Device) -> Result<String> {
        let rings = self.mem.contexts as usize * self.mem.nranks as usize;
        // The device words start with the ticket counters (`GinStateParts::heads`).
        let mut words = vec![0u64; self._dev.len()];
        dev.stream().read(&self._dev, &mut words)?;
        let heads = &words[..rings];
        // SAFETY: `mem` names this rank's live GIN memory (owned by `self`);
        // `Rings` only loads its shared words atomically here.
        let view = unsafe { devcomm_gin::ring::Rings::new(self.mem) }.map_err(from_gin)?;
        let mut out = Vec::new();
        for (q, &posted) in heads.iter().enumerate() {
            let done = view.completed(q);
            if posted == 0 && done == 0 {
                continue;
            }
            let (c, p) = (q / self.mem.nranks as usize, view.peer_of(q));
            let state = if view.is_failed(q) {
                " failed"
            } else if posted > done {
                if view.poll_at(q, done).is_some() {
                    " next ready"
                } else {
                    " next unpublished"
                }
            } else {
                ""
            };
            out.push(format!("ring ({c}, {p}): posted {posted}, completed {done}{state}"));
        }
        if let Some(t) = self.proxy.as_ref().map(|p| p.monitor()).and_then(|m| m.stalled()) {
            out.push(format!(
                "the proxy has been inside one call for {:.1} s (see ProxyMonitor::stalled: usually another \
                 thread in cudaFree/cuMemFree or another driver call that waits for the device)",
                t.as_secs_f64()
            ));
        }
        Ok(if out.is_empty() { "no GIN traffic".into() } else { out.join("; ") })
    }

    /// Stops the proxy after it has drained its rings; returns its error
    /// (the caller's now: the communicator no longer reports it).
    pub(crate) fn stop(&mut self) -> Result<()> {
        let r = match self.proxy.take() {
            Some(p) => p.stop().map_err(from_gin),
            None => Ok(()),
        };
        self.errors.0.gin_errors.deregister(self.errors.1);
        r
    }
}

impl Drop for GinResources {
    fn drop(&mut self) {
        // Dropped without `destroy`: nobody receives the proxy's error, so
        // the communicator keeps it for `get_async_error`.
        if let Err(e) = self.stop() {
            tracing::warn!("GIN proxy stopped with an error: {e}");
            self.errors.0.gin_errors.unclaimed(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_uses_one_transport() {
        let pair = |a: GinTransport, c: TransportChoice| vec![transport_code(a), c.code()];
        let (auto, ce, tcp) = (GinTransport::Auto, TransportChoice::CopyEngine, TransportChoice::Tcp);
        assert_eq!(transport_choice(auto, true, "d").unwrap(), ce);
        assert_eq!(transport_choice(auto, false, "d").unwrap(), tcp);
        assert_eq!(transport_choice(GinTransport::Tcp, true, "d").unwrap(), tcp);
        assert_eq!(decide_transport(&[pair(auto, ce), pair(auto, ce)]).unwrap(), ce);
        // `auto` resolved differently on one rank: everyone uses TCP.
        assert_eq!(decide_transport(&[pair(auto, ce), pair(auto, tcp)]).unwrap(), tcp);
        let v = pair(GinTransport::Verbs, TransportChoice::Verbs);
        assert_eq!(decide_transport(&[v.clone(), v.clone()]).unwrap(), TransportChoice::Verbs);
        let e = decide_transport(&[pair(auto, ce), v]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("rank 1 for verbs")), "{e}");
        assert!(matches!(decide_transport(&[vec![7]]), Err(Error::RemoteError(_))));
    }

    #[test]
    fn verbs_needs_the_feature() {
        let r = transport_choice(GinTransport::Verbs, true, "d");
        if crate::gin::VERBS_BUILT {
            assert_eq!(r.unwrap(), TransportChoice::Verbs);
        } else {
            let e = r.unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("`verbs` cargo feature")), "{e}");
        }
    }

    #[test]
    fn host_regions_are_page_aligned_and_disjoint() {
        let l = host_layout(8 * 4, 256, 3);
        assert_eq!(l.rings, 0);
        assert!(l.tails >= 32 * 256 * 64 && l.tails % 4096 == 0);
        assert!(l.counters >= l.tails + 32 * TAIL_STRIDE && l.counters % 4096 == 0);
        assert!(l.len >= l.counters + 24);
    }
}
