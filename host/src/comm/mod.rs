//! Communicators: a group of ranks that found each other through the
//! [bootstrap](crate::bootstrap), with their topology, host-side bootstrap
//! collectives, split, finalize, abort and asynchronous error reporting.
//!
//! ```no_run
//! use devcomm::bootstrap::UniqueId;
//! use devcomm::comm::Communicator;
//! # fn main() -> devcomm::Result<()> {
//! // Rank 0 makes the id and ships `id.to_string()` to the others.
//! let id = UniqueId::new()?;
//! let comm = Communicator::init_rank(1, id, 0)?;
//! let all = comm.bootstrap_allgather(b"hello")?;
//! assert_eq!(all, vec![b"hello".to_vec()]);
//! comm.finalize()?;
//! # Ok(()) }
//! ```

mod config;
mod split;
mod topology;

pub use config::{
    Config, BLOCKING_ENV, BOOTSTRAP_TIMEOUT_ENV, DEFAULT_BOOTSTRAP_TIMEOUT, DEFAULT_OP_TIMEOUT, OP_TIMEOUT_ENV,
};
pub use topology::{RankInfo, HOST_ID_ENV};

use crate::bootstrap::{BootstrapClient, JoinParams, UniqueId};
use crate::error::{Error, Result};
use crate::runtime::{device_count, Device, RuntimeKind, RuntimeSelection};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use topology::Topology;

/// Where a communicator is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommState {
    /// A non-blocking creation is still running its rendezvous.
    Initializing,
    /// Usable.
    Ready,
    /// Creation failed, or a remote failure was recorded: the error.
    Failed(Error),
    /// This rank called [`Communicator::abort`].
    Aborted,
    /// [`Communicator::finalize`] completed.
    Finalized,
}

struct Ready {
    client: BootstrapClient,
    topo: Topology,
}

enum InitState {
    Initializing,
    Ready(Arc<Ready>),
    Failed(Error),
}

struct Shared {
    state: Mutex<InitState>,
    cv: Condvar,
    /// The socket of an init in progress, so abort/drop can cancel it.
    pending_conn: Mutex<Option<TcpStream>>,
    destroyed: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, InitState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores the outcome of the rendezvous, unless abort/drop came first.
    fn complete(&self, outcome: Result<Ready>) {
        let mut st = self.lock();
        let destroyed = self.destroyed.load(Ordering::SeqCst);
        if matches!(*st, InitState::Initializing) && !destroyed {
            *st = match outcome {
                Ok(r) => InitState::Ready(Arc::new(r)),
                Err(e) => InitState::Failed(e),
            };
        } else if let Ok(r) = outcome {
            r.client.shutdown();
        }
        if let Ok(mut c) = self.pending_conn.lock() {
            *c = None;
        }
        drop(st);
        self.cv.notify_all();
    }
}

/// One rank's membership in a group of ranks (`ncclComm_t`'s counterpart).
///
/// Create with [`Communicator::init_rank`] (one call per rank, in any
/// process that can reach the [`UniqueId`]'s root), [`Communicator::init_all`]
/// (one process driving several devices) or [`Communicator::init_from_env`]
/// (torchrun / Slurm / Open MPI / `devcomm-run` variables).
///
/// Dropping a communicator destroys it: non-collective, releases the
/// connection and threads, never blocks on other ranks. Ranks still using
/// the group then see [`Error::RemoteError`]; call [`Communicator::finalize`]
/// on every rank first for a clean collective shutdown.
#[doc(alias = "ncclComm_t")]
pub struct Communicator {
    rank: usize,
    nranks: usize,
    id: UniqueId,
    device: Device,
    config: Config,
    abort_flag: Arc<AtomicBool>,
    shared: Arc<Shared>,
    /// Windows and device communicators: registration state, abort sinks.
    pub(crate) ext: Arc<crate::window::CommExt>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("id", &self.id)
            .field("device", &self.device)
            .field("state", &self.comm_state())
            .finish()
    }
}

impl Communicator {
    /// Joins the communicator of `id` as rank `rank` of `nranks`, with
    /// [`Config::from_env`] (`ncclCommInitRank`). Collective: every rank calls it.
    ///
    /// Errors: [`Error::InvalidArgument`] for `nranks == 0`, `rank >= nranks`
    /// or an id of another job; [`Error::InvalidUsage`] for a rank already
    /// taken; [`Error::RemoteError`] when another rank fails during the
    /// rendezvous; [`Error::Timeout`] when not all ranks join within the
    /// bootstrap timeout.
    #[doc(alias = "ncclCommInitRank")]
    pub fn init_rank(nranks: usize, id: UniqueId, rank: usize) -> Result<Communicator> {
        Communicator::init_rank_with_config(nranks, id, rank, Config::from_env()?)
    }

    /// As [`Communicator::init_rank`] with an explicit [`Config`]
    /// (`ncclCommInitRankConfig`). With `config.blocking == false` it returns
    /// at once; see [`Communicator::get_async_error`] and [`Communicator::wait_ready`].
    pub fn init_rank_with_config(nranks: usize, id: UniqueId, rank: usize, config: Config) -> Result<Communicator> {
        if nranks == 0 {
            return Err(Error::invalid_argument("nranks must be at least 1"));
        }
        if rank >= nranks {
            return Err(Error::invalid_argument(format!("rank {rank} is out of range for {nranks} ranks")));
        }
        config.validate()?;
        let device = match &config.device {
            Some(d) => d.clone(),
            None => default_device(rank)?,
        };
        let info = RankInfo::local(rank, &device).encode();
        let abort_flag = Arc::new(AtomicBool::new(false));
        let comm = Communicator {
            rank,
            nranks,
            id,
            device,
            config,
            ext: Arc::new(crate::window::CommExt::new(abort_flag.clone())),
            abort_flag,
            shared: Arc::new(Shared {
                state: Mutex::new(InitState::Initializing),
                cv: Condvar::new(),
                pending_conn: Mutex::new(None),
                destroyed: AtomicBool::new(false),
            }),
        };
        let params = JoinParams {
            nranks,
            rank,
            info,
            timeout: comm.config.bootstrap_timeout,
            op_timeout: comm.config.op_timeout,
        };
        let (shared, flag) = (comm.shared.clone(), comm.abort_flag.clone());
        if comm.config.blocking {
            shared.complete(rendezvous(&id, params, flag, &shared));
            comm.ready()?;
        } else {
            std::thread::Builder::new()
                .name(format!("devcomm-init-r{rank}"))
                .spawn(move || {
                    let outcome = rendezvous(&id, params, flag, &shared);
                    shared.complete(outcome);
                })
                .map_err(|e| Error::system("spawning communicator init thread", e))?;
        }
        Ok(comm)
    }

    /// One communicator per device, all in this process (`ncclCommInitAll`):
    /// rank `i` drives `devices[i]`. Runs one thread per rank internally.
    ///
    /// Errors: [`Error::InvalidArgument`] for an empty list; otherwise the
    /// first rank's error.
    #[doc(alias = "ncclCommInitAll")]
    pub fn init_all(devices: &[Device]) -> Result<Vec<Communicator>> {
        Communicator::init_all_with_config(devices, Config::from_env()?)
    }

    /// As [`Communicator::init_all`], opening devices `0..n` of runtime `sel`.
    pub fn init_all_count(sel: RuntimeSelection, n: usize) -> Result<Vec<Communicator>> {
        if n == 0 {
            return Err(Error::invalid_argument("init_all needs at least one device"));
        }
        let devices = (0..n).map(|i| Device::open(sel, i)).collect::<Result<Vec<_>>>()?;
        Communicator::init_all(&devices)
    }

    /// As [`Communicator::init_all`] with an explicit [`Config`] (its
    /// `device` is ignored and `blocking` is forced on).
    pub fn init_all_with_config(devices: &[Device], config: Config) -> Result<Vec<Communicator>> {
        if devices.is_empty() {
            return Err(Error::invalid_argument("init_all needs at least one device"));
        }
        config.validate()?;
        let id = UniqueId::new()?;
        let n = devices.len();
        let results: Vec<Result<Communicator>> = std::thread::scope(|s| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, dev)| {
                    let cfg = config.clone().with_device(dev.clone()).with_blocking(true);
                    s.spawn(move || Communicator::init_rank_with_config(n, id, rank, cfg))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("init_all thread panicked"))))
                .collect()
        });
        results.into_iter().collect()
    }

    /// Joins the job described by the launcher's environment (see
    /// [`crate::env::LaunchEnv`]), with [`Config::from_env`]. Rank 0 hosts
    /// the root at `MASTER_ADDR:MASTER_PORT` unless `DEVCOMM_UNIQUE_ID` is set.
    pub fn init_from_env() -> Result<Communicator> {
        Communicator::init_from_env_with_config(Config::from_env()?)
    }

    /// As [`Communicator::init_from_env`] with an explicit [`Config`]. When
    /// `config.device` is `None`, the device is `LOCAL_RANK` modulo the
    /// number of devices of `DEVCOMM_RUNTIME`'s runtime.
    pub fn init_from_env_with_config(mut config: Config) -> Result<Communicator> {
        let env = crate::env::LaunchEnv::from_env()?;
        if config.device.is_none() {
            config.device = Some(open_device_for(env.local_rank.unwrap_or(env.rank))?);
        }
        let id = env.unique_id()?;
        Communicator::init_rank_with_config(env.world_size, id, env.rank, config)
    }

    /// Number of ranks (`ncclCommCount`).
    #[doc(alias = "ncclCommCount")]
    pub fn count(&self) -> usize {
        self.nranks
    }

    /// This rank (`ncclCommUserRank`).
    #[doc(alias = "ncclCommUserRank")]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The device this rank drives (`ncclCommCuDevice`).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The bootstrap id it was created from.
    pub fn unique_id(&self) -> UniqueId {
        self.id
    }

    /// The abort flag: set by [`Communicator::abort`], and also when a remote
    /// failure is recorded (peer died, peer aborted, root lost), so that
    /// device-side waits that poll it return instead of hanging.
    pub fn abort_flag(&self) -> &Arc<AtomicBool> {
        &self.abort_flag
    }

    fn ready(&self) -> Result<Arc<Ready>> {
        match &*self.shared.lock() {
            InitState::Ready(r) => Ok(r.clone()),
            InitState::Failed(e) => Err(e.clone()),
            InitState::Initializing => Err(Error::InProgress(format!(
                "communicator rank {} of {} is still initializing",
                self.rank, self.nranks
            ))),
        }
    }

    /// Blocks until a non-blocking creation finished (bounded by the
    /// bootstrap timeout plus a second); returns its outcome.
    pub fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + self.config.bootstrap_timeout + Duration::from_secs(1);
        let mut st = self.shared.lock();
        loop {
            match &*st {
                InitState::Ready(_) => return Ok(()),
                InitState::Failed(e) => return Err(e.clone()),
                InitState::Initializing => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!("communicator rank {} did not become ready", self.rank)));
            }
            st = self.shared.cv.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Where the communicator is in its life.
    pub fn comm_state(&self) -> CommState {
        match &*self.shared.lock() {
            InitState::Initializing => CommState::Initializing,
            InitState::Failed(e) => CommState::Failed(e.clone()),
            InitState::Ready(r) => {
                if r.client.is_aborted() {
                    CommState::Aborted
                } else if let Some(e) = r.client.error() {
                    CommState::Failed(e)
                } else if r.client.is_finalized() {
                    CommState::Finalized
                } else {
                    CommState::Ready
                }
            }
        }
    }

    /// `Ok(())`, or what went wrong asynchronously (`ncclCommGetAsyncError`):
    /// [`Error::InProgress`] while a non-blocking creation runs, its error if
    /// it failed, [`Error::RemoteError`] naming the rank once a peer died or
    /// aborted or the root was lost, [`Error::InvalidUsage`] after this rank
    /// aborted; else the first error a GIN proxy of one of its device
    /// communicators met (a failed peer or transport, an operation it could
    /// not carry out: what kernels see as a failed ring), while that device
    /// communicator lives — and after it was dropped, if its proxy stopped
    /// with an error nobody received (a
    /// [`DevCommHandle::destroy`](crate::dev_comm::DevCommHandle::destroy)
    /// returns it instead).
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn get_async_error(&self) -> Result<()> {
        if let Some(e) = self.ready()?.client.error() {
            return Err(e);
        }
        match self.ext.gin_errors.first() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every rank's [`RankInfo`], by rank.
    pub fn rank_infos(&self) -> Result<Vec<RankInfo>> {
        Ok(self.ready()?.topo.infos.clone())
    }

    /// Rank `peer`'s [`RankInfo`].
    pub fn rank_info(&self, peer: usize) -> Result<RankInfo> {
        self.check_peer(peer)?;
        Ok(self.ready()?.topo.infos[peer].clone())
    }

    /// The ranks on this rank's host (itself included), ascending: the
    /// candidates for load/store access.
    pub fn local_ranks(&self) -> Result<Vec<usize>> {
        Ok(self.ready()?.topo.ranks_on_host_of(self.rank))
    }

    /// This rank's index among [`Communicator::local_ranks`].
    pub fn local_rank(&self) -> Result<usize> {
        let local = self.local_ranks()?;
        local.iter().position(|&r| r == self.rank).ok_or_else(|| Error::internal("rank missing from its own host"))
    }

    /// Whether rank `peer` runs on the same host as this rank.
    pub fn same_host(&self, peer: usize) -> Result<bool> {
        self.check_peer(peer)?;
        let r = self.ready()?;
        Ok(r.topo.host_of[peer] == r.topo.host_of[self.rank])
    }

    /// Number of distinct hosts in the communicator.
    pub fn num_hosts(&self) -> Result<usize> {
        Ok(self.ready()?.topo.nhosts)
    }

    /// Index of rank `peer`'s host (hosts numbered by first appearance in rank order).
    pub fn host_index(&self, peer: usize) -> Result<usize> {
        self.check_peer(peer)?;
        Ok(self.ready()?.topo.host_of[peer])
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::invalid_argument(format!("rank {peer} is out of range for {} ranks", self.nranks)));
        }
        Ok(())
    }

    /// Host-side allgather through the bootstrap: every rank's `data`, by rank.
    /// Collective; every rank must issue the same sequence of bootstrap
    /// operations, and not concurrently on one communicator.
    ///
    /// Errors: [`Error::RemoteError`] when a rank failed or aborted or the
    /// root was lost; [`Error::Timeout`] past the op timeout.
    pub fn bootstrap_allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.ready()?.client.allgather(data)
    }

    /// Host-side broadcast through the bootstrap: rank `root`'s `data`
    /// (other ranks' `data` is ignored). Collective.
    pub fn bootstrap_broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        self.ready()?.client.broadcast(root, data)
    }

    /// Host-side barrier through the bootstrap. Collective.
    pub fn bootstrap_barrier(&self) -> Result<()> {
        self.ready()?.client.barrier()
    }

    /// Collective clean shutdown (`ncclCommFinalize`): returns once every
    /// rank finalized. Afterwards only dropping the communicator is useful.
    #[doc(alias = "ncclCommFinalize")]
    pub fn finalize(&self) -> Result<()> {
        self.ready()?.client.finalize()
    }

    /// Aborts (`ncclCommAbort`, without the destroy): sets the abort flag,
    /// tells the root, which tells every other rank, and fails this rank's
    /// pending and later operations. Never blocks on other ranks.
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(&self) {
        self.abort_with_reason("aborted by the application");
    }

    /// As [`Communicator::abort`], with a reason the other ranks will see.
    pub fn abort_with_reason(&self, reason: &str) {
        self.abort_flag.store(true, Ordering::SeqCst);
        self.ext.abort_sinks.fire();
        let ready = {
            let mut st = self.shared.lock();
            match &*st {
                InitState::Ready(r) => Some(r.clone()),
                InitState::Failed(_) => None,
                InitState::Initializing => {
                    *st = InitState::Failed(Error::invalid_usage(format!(
                        "rank {} aborted the communicator while it was initializing",
                        self.rank
                    )));
                    if let Ok(c) = self.shared.pending_conn.lock() {
                        if let Some(c) = c.as_ref() {
                            let _ = c.shutdown(Shutdown::Both);
                        }
                    }
                    None
                }
            }
        };
        self.shared.cv.notify_all();
        if let Some(r) = ready {
            r.client.abort(reason);
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let ready = {
            let st = self.shared.lock();
            self.shared.destroyed.store(true, Ordering::SeqCst);
            if let Ok(c) = self.shared.pending_conn.lock() {
                if let Some(c) = c.as_ref() {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
            match &*st {
                InitState::Ready(r) => Some(r.clone()),
                _ => None,
            }
        };
        if let Some(r) = ready {
            r.client.shutdown();
        }
    }
}

fn rendezvous(id: &UniqueId, params: JoinParams, flag: Arc<AtomicBool>, shared: &Shared) -> Result<Ready> {
    let on_connected = |s: &TcpStream| {
        if let (Ok(mut slot), Ok(c)) = (shared.pending_conn.lock(), s.try_clone()) {
            if shared.destroyed.load(Ordering::SeqCst) {
                let _ = c.shutdown(Shutdown::Both);
            }
            *slot = Some(c);
        }
    };
    let rank = params.rank;
    let (client, infos) = BootstrapClient::connect(id, params, flag, &on_connected)?;
    let infos = infos.iter().map(|b| RankInfo::decode(b)).collect::<Result<Vec<_>>>()?;
    if let Some((r, i)) = infos.iter().enumerate().find(|(r, i)| i.rank != *r) {
        return Err(Error::remote(format!("bootstrap slot {r} holds the info of rank {}", i.rank)));
    }
    let topo = Topology::new(infos);
    tracing::debug!(rank, nhosts = topo.nhosts, "communicator ready");
    Ok(Ready { client, topo })
}

/// The device rank `rank` drives when the config names none:
/// ordinal `LOCAL_RANK` (else `rank`) modulo the device count.
fn default_device(rank: usize) -> Result<Device> {
    let local = std::env::var("LOCAL_RANK").ok().and_then(|v| v.trim().parse::<usize>().ok());
    open_device_for(local.unwrap_or(rank))
}

fn open_device_for(index: usize) -> Result<Device> {
    let sel = RuntimeSelection::from_env()?;
    let (kind, count) = device_count(sel)?;
    if count == 0 {
        return Err(Error::CudaError(format!("the {kind} runtime reports no devices")));
    }
    let sel = match kind {
        RuntimeKind::Cuda => RuntimeSelection::Cuda,
        RuntimeKind::Emulated => RuntimeSelection::Emulated,
    };
    Device::open(sel, index % count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emu(i: usize) -> Device {
        Device::open(RuntimeSelection::Emulated, i).unwrap()
    }

    fn cfg(i: usize) -> Config {
        Config::default().with_timeouts(Duration::from_secs(10)).with_device(emu(i))
    }

    #[test]
    fn single_rank_lifecycle() {
        let id = UniqueId::new().unwrap();
        let c = Communicator::init_rank_with_config(1, id, 0, cfg(0)).unwrap();
        assert_eq!((c.count(), c.rank()), (1, 0));
        assert_eq!(c.bootstrap_allgather(b"x").unwrap(), vec![b"x".to_vec()]);
        assert_eq!(c.bootstrap_broadcast(0, b"y").unwrap(), b"y".to_vec());
        c.bootstrap_barrier().unwrap();
        assert_eq!(c.local_ranks().unwrap(), vec![0]);
        assert_eq!(c.comm_state(), CommState::Ready);
        c.finalize().unwrap();
        assert_eq!(c.comm_state(), CommState::Finalized);
        assert!(matches!(c.bootstrap_barrier(), Err(Error::InvalidUsage(_))));
    }

    #[test]
    fn init_all_threads() {
        let devs: Vec<_> = (0..3).map(emu).collect();
        let comms = Communicator::init_all_with_config(&devs, Config::default().with_timeouts(Duration::from_secs(10)))
            .unwrap();
        assert_eq!(comms.len(), 3);
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let all = c.bootstrap_allgather(&[c.rank() as u8]).unwrap();
                    assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
                    assert_eq!(c.local_ranks().unwrap(), vec![0, 1, 2]);
                    assert!(c.same_host(2).unwrap());
                    assert_eq!(c.rank_info(1).unwrap().device_ordinal, 1);
                    c.finalize().unwrap();
                });
            }
        });
    }

    #[test]
    fn nonblocking_init_reports_in_progress() {
        let id = UniqueId::new().unwrap();
        let c0 = Communicator::init_rank_with_config(2, id, 0, cfg(0).with_blocking(false)).unwrap();
        assert!(matches!(c0.get_async_error(), Err(Error::InProgress(_))));
        assert_eq!(c0.comm_state(), CommState::Initializing);
        let c1 = Communicator::init_rank_with_config(2, id, 1, cfg(1).with_blocking(false)).unwrap();
        c0.wait_ready().unwrap();
        c1.wait_ready().unwrap();
        assert_eq!(c0.get_async_error(), Ok(()));
        drop(c1);
        // c1 left without finalize: c0 hears about it.
        let t = Instant::now();
        while c0.get_async_error().is_ok() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(matches!(c0.get_async_error(), Err(Error::RemoteError(m)) if m.contains("rank 1")));
        assert!(c0.abort_flag().load(Ordering::SeqCst));
    }

    #[test]
    fn drop_while_initializing_does_not_hang() {
        let id = UniqueId::new().unwrap();
        let c = Communicator::init_rank_with_config(2, id, 0, cfg(0).with_blocking(false)).unwrap();
        let t = Instant::now();
        drop(c);
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn abort_while_initializing() {
        let id = UniqueId::new().unwrap();
        let c = Communicator::init_rank_with_config(2, id, 0, cfg(0).with_blocking(false)).unwrap();
        c.abort();
        assert!(matches!(c.wait_ready(), Err(Error::InvalidUsage(_))));
        assert!(c.abort_flag().load(Ordering::SeqCst));
    }
}
