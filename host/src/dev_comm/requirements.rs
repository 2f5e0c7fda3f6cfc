//! [`DevCommRequirements`]: what a device communicator must provide.

use crate::error::{Error, Result};
use crate::team::TeamKind;
use crate::window::{Window, WindowShared};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Most barriers of one kind a device communicator may hold.
pub const MAX_BARRIERS: u32 = 1 << 16;
/// Largest alignment a resource buffer may ask for.
pub const MAX_RESOURCE_ALIGN: u64 = 4096;
/// Most resource buffers one device communicator may hold.
pub const MAX_RESOURCES: usize = 1024;
/// Most GIN signals or counters.
pub const MAX_GIN_IDS: u32 = 1 << 20;
/// Most GIN contexts.
pub const MAX_GIN_CONTEXTS: u32 = 64;
/// Deepest GIN ring.
pub const MAX_GIN_QUEUE_DEPTH: u32 = 1 << 16;
/// Ring depth when none is asked for.
pub const DEFAULT_GIN_QUEUE_DEPTH: u32 = 256;

static NEXT_REQ_ID: AtomicU64 = AtomicU64::new(1);

/// A resource buffer asked for with [`DevCommRequirements::add_resource`]:
/// resolve it to an offset in the resource window with
/// [`DevCommHandle::resource_offset`](super::DevCommHandle::resource_offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResourceHandle {
    pub(crate) req_id: u64,
    pub(crate) index: usize,
}

/// What [`Communicator::create_dev_comm`](crate::comm::Communicator::create_dev_comm)
/// must set up (`ncclDevCommRequirements`). Every rank passes the same
/// requirements (checked).
///
/// ```
/// use devcomm::dev_comm::DevCommRequirements;
/// use devcomm::team::TeamKind;
/// let mut req = DevCommRequirements::new();
/// req.lsa_barrier_count = 4;
/// let scratch = req.add_resource(1 << 16, 256);
/// req.require_team(TeamKind::Lsa, false);
/// # let _ = scratch;
/// ```
#[doc(alias = "ncclDevCommRequirements")]
#[derive(Clone)]
pub struct DevCommRequirements {
    /// LSA barriers (each: one inbox word per LSA peer, and a private epoch).
    pub lsa_barrier_count: u32,
    /// World barriers. Without GIN these exist only when the LSA team is
    /// the world (then they are LSA barriers, numbered after `lsa_barrier_count`).
    pub barrier_count: u32,
    /// Which peers GIN must reach: none (no GIN), every rank, or the rail team.
    pub gin_connection_type: crate::gin::GinConnectionType,
    /// GIN signals (ids `0..gin_signal_count`), each a `u64` on every rank.
    pub gin_signal_count: u32,
    /// GIN counters (local completions), each a `u64`.
    pub gin_counter_count: u32,
    /// GIN contexts (independent rings per peer; a hint, at least 1). 0: 1.
    pub gin_context_count: u32,
    /// Descriptors per ring, a power of two from 2 to [`MAX_GIN_QUEUE_DEPTH`]. 0: [`DEFAULT_GIN_QUEUE_DEPTH`].
    pub gin_queue_depth: u32,
    /// GIN barriers over the rail team.
    pub rail_gin_barrier_count: u32,
    /// GIN barriers over the world.
    pub world_gin_barrier_count: u32,
    pub(crate) id: u64,
    pub(crate) resources: Vec<(u64, u64)>,
    pub(crate) teams: Vec<(TeamKind, bool)>,
    /// Weak: the requirements do not keep a released window mapped.
    pub(crate) windows: Vec<Weak<WindowShared>>,
}

impl Default for DevCommRequirements {
    fn default() -> Self {
        DevCommRequirements::new()
    }
}

impl std::fmt::Debug for DevCommRequirements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCommRequirements")
            .field("lsa_barrier_count", &self.lsa_barrier_count)
            .field("barrier_count", &self.barrier_count)
            .field("resources", &self.resources)
            .field("teams", &self.teams)
            .field("windows", &self.windows.iter().filter_map(|w| w.upgrade().map(|w| w.desc.id())).collect::<Vec<_>>())
            .finish()
    }
}

impl DevCommRequirements {
    /// No barriers, no resources, no teams beyond the defaults, no windows.
    pub fn new() -> Self {
        DevCommRequirements {
            lsa_barrier_count: 0,
            barrier_count: 0,
            gin_connection_type: crate::gin::GinConnectionType::None,
            gin_signal_count: 0,
            gin_counter_count: 0,
            gin_context_count: 0,
            gin_queue_depth: 0,
            rail_gin_barrier_count: 0,
            world_gin_barrier_count: 0,
            id: NEXT_REQ_ID.fetch_add(1, Ordering::Relaxed),
            resources: Vec::new(),
            teams: Vec::new(),
            windows: Vec::new(),
        }
    }

    /// Asks for a resource buffer of `size` bytes aligned to `align` in the
    /// resource window (validated by `create_dev_comm`: `size > 0`, `align`
    /// a power of two up to [`MAX_RESOURCE_ALIGN`]). Resource buffers start zeroed.
    pub fn add_resource(&mut self, size: u64, align: u64) -> ResourceHandle {
        self.resources.push((size, align));
        ResourceHandle { req_id: self.id, index: self.resources.len() - 1 }
    }

    /// Asks for a team the kernels will use; `multimem` asks for NVLink
    /// multicast over it (not supported: `create_dev_comm` refuses it).
    pub fn require_team(&mut self, kind: TeamKind, multimem: bool) -> &mut Self {
        self.teams.push((kind, multimem));
        self
    }

    /// Declares that the device communicator's kernels use `window`: it stays
    /// registered while the device communicator lives (deregistering it
    /// meanwhile is [`Error::InvalidUsage`]), and its descriptor comes from
    /// [`DevCommHandle::window`](super::DevCommHandle::window).
    ///
    /// **GIN needs it**: `create_dev_comm` hands the GIN backend (the
    /// proxy's transports: copy engine, TCP, verbs) only the declared
    /// windows, on every rank (every rank declares the same windows, in the
    /// same order). Forgetting it for a window that kernels `put` into
    /// through GIN is seen as follows:
    ///
    /// * on the host, `DevCommHandle::window(&w)` is an
    ///   [`Error::InvalidArgument`] ("window N was not declared with
    ///   use_window for this device communicator");
    /// * a kernel handed the window's descriptor another way (e.g.
    ///   [`Window::desc`]) fails its GIN operation on that window: the proxy
    ///   refuses the request ("window N of rank P is not mapped here (declare
    ///   it with use_window)"), the ring fails, and the kernel sees only
    ///   `GinError::Queue(QueueError::RingFailed)` (device error code 3);
    ///   the words are in
    ///   [`DevCommHandle::gin_error`](super::DevCommHandle::gin_error), and
    ///   [`DevCommHandle::destroy`](super::DevCommHandle::destroy) returns
    ///   the same error.
    ///
    /// LSA loads and stores reach every registered window without it (the
    /// mapping is made by `register_window`), but then nothing keeps the
    /// window registered while kernels run.
    pub fn use_window(&mut self, window: &Window<'_>) -> &mut Self {
        self.windows.push(Arc::downgrade(&window.shared));
        self
    }

    /// The declared windows, or [`Error::InvalidArgument`] if one was released.
    pub(crate) fn live_windows(&self) -> Result<Vec<Arc<WindowShared>>> {
        self.windows
            .iter()
            .map(|w| {
                w.upgrade().ok_or_else(|| {
                    Error::invalid_argument("a window declared with use_window was deregistered or dropped")
                })
            })
            .collect()
    }

    /// Checks every field against this communicator's shape.
    pub(crate) fn validate(&self, nranks: usize, lsa_size: usize, comm_key: usize) -> Result<()> {
        for (what, n) in [("lsa_barrier_count", self.lsa_barrier_count), ("barrier_count", self.barrier_count)] {
            if n > MAX_BARRIERS {
                return Err(Error::invalid_argument(format!("{what} = {n}: at most {MAX_BARRIERS}")));
            }
        }
        self.validate_gin()?;
        let gin = self.gin_connection_type != crate::gin::GinConnectionType::None;
        if self.barrier_count > 0 && lsa_size < nranks {
            return Err(Error::invalid_usage(format!(
                "{} world barriers requested (barrier_count), but the LSA team ({lsa_size}) is not the world \
                 ({nranks}): these are LSA barriers; across nodes ask for world_gin_barrier_count instead (GIN \
                 barriers, with gin_connection_type Full)",
                self.barrier_count
            )));
        }
        if self.resources.len() > MAX_RESOURCES {
            return Err(Error::invalid_argument(format!(
                "{} resource buffers: at most {MAX_RESOURCES}",
                self.resources.len()
            )));
        }
        for (i, &(size, align)) in self.resources.iter().enumerate() {
            if size == 0 {
                return Err(Error::invalid_argument(format!("resource buffer {i} has size 0")));
            }
            if !align.is_power_of_two() || align > MAX_RESOURCE_ALIGN {
                return Err(Error::invalid_argument(format!(
                    "resource buffer {i}: alignment {align} is not a power of two up to {MAX_RESOURCE_ALIGN}"
                )));
            }
        }
        for &(kind, multimem) in &self.teams {
            if multimem {
                return Err(Error::invalid_usage(format!(
                    "{kind:?} team with multimem: NVLink multicast is not supported"
                )));
            }
            let beyond_lsa = match kind {
                TeamKind::Lsa => false,
                TeamKind::World => lsa_size < nranks && self.gin_connection_type != crate::gin::GinConnectionType::Full,
                TeamKind::Rail => nranks / lsa_size.max(1) > 1 && !gin,
            };
            if beyond_lsa {
                return Err(Error::invalid_usage(format!(
                    "the {kind:?} team reaches beyond the LSA team ({lsa_size} of {nranks} ranks): that needs GIN \
                     (gin_connection_type {})",
                    if kind == TeamKind::World { "Full" } else { "Rail or Full" }
                )));
            }
        }
        for w in self.live_windows()? {
            if w.comm_key != comm_key {
                return Err(Error::invalid_argument(format!(
                    "window {} is registered on another communicator",
                    w.desc.id()
                )));
            }
        }
        Ok(())
    }

    /// Checks the GIN fields on their own.
    pub(crate) fn validate_gin(&self) -> Result<()> {
        use crate::gin::GinConnectionType;
        let asks = [
            ("gin_signal_count", self.gin_signal_count),
            ("gin_counter_count", self.gin_counter_count),
            ("rail_gin_barrier_count", self.rail_gin_barrier_count),
            ("world_gin_barrier_count", self.world_gin_barrier_count),
        ];
        if self.gin_connection_type == GinConnectionType::None {
            if let Some((what, n)) = asks.iter().find(|(_, n)| *n > 0) {
                return Err(Error::invalid_argument(format!(
                    "{what} = {n} but gin_connection_type is None: GIN resources need a GIN connection (Full or Rail)"
                )));
            }
            return Ok(());
        }
        for (what, n) in asks {
            let max = if what.ends_with("barrier_count") { MAX_BARRIERS } else { MAX_GIN_IDS };
            if n > max {
                return Err(Error::invalid_argument(format!("{what} = {n}: at most {max}")));
            }
        }
        if self.gin_context_count > MAX_GIN_CONTEXTS {
            return Err(Error::invalid_argument(format!(
                "gin_context_count = {}: at most {MAX_GIN_CONTEXTS}",
                self.gin_context_count
            )));
        }
        let d = self.gin_queue_depth;
        if d != 0 && (!d.is_power_of_two() || !(2..=MAX_GIN_QUEUE_DEPTH).contains(&d)) {
            return Err(Error::invalid_argument(format!(
                "gin_queue_depth = {d}: a power of two from 2 to {MAX_GIN_QUEUE_DEPTH} (0 for {DEFAULT_GIN_QUEUE_DEPTH})"
            )));
        }
        if self.gin_connection_type == GinConnectionType::Rail && self.world_gin_barrier_count > 0 {
            return Err(Error::invalid_argument(
                "world GIN barriers need gin_connection_type Full (a rail connection reaches the rail team only)",
            ));
        }
        Ok(())
    }

    /// Contexts and ring depth after defaults.
    pub(crate) fn gin_shape(&self) -> (u32, u32) {
        let contexts = self.gin_context_count.max(1);
        let depth = if self.gin_queue_depth == 0 { DEFAULT_GIN_QUEUE_DEPTH } else { self.gin_queue_depth };
        (contexts, depth)
    }

    /// A digest of everything that must match between ranks.
    pub(crate) fn digest(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.lsa_barrier_count.to_le_bytes());
        b.extend_from_slice(&self.barrier_count.to_le_bytes());
        for v in [
            self.gin_connection_type.code(),
            self.gin_signal_count,
            self.gin_counter_count,
            self.gin_context_count,
            self.gin_queue_depth,
            self.rail_gin_barrier_count,
            self.world_gin_barrier_count,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.resources.len() as u64).to_le_bytes());
        for &(s, a) in &self.resources {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&a.to_le_bytes());
        }
        let mut teams: Vec<(u8, bool)> = self
            .teams
            .iter()
            .map(|&(k, m)| {
                let k = match k {
                    TeamKind::World => 0,
                    TeamKind::Lsa => 1,
                    TeamKind::Rail => 2,
                };
                (k, m)
            })
            .collect();
        teams.sort_unstable();
        teams.dedup();
        for (k, m) in teams {
            b.push(k);
            b.push(m as u8);
        }
        let mut ids: Vec<u32> = self.windows.iter().map(|w| w.upgrade().map_or(u32::MAX, |w| w.desc.id())).collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }
}
