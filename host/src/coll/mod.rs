//! Host collectives, NCCL's set with Rust names: all-reduce, reduce,
//! reduce-scatter, all-gather, broadcast, gather, scatter, all-to-all.
//!
//! They are launches of the device-callable collectives of
//! [`devcomm_device::coll`] (one implementation for both): a
//! [`Collectives`] holds what they need (a device communicator with one LSA
//! barrier per CTA, and scratch: LL slots and staging areas), made once per
//! communicator, collectively:
//!
//! ```
//! use devcomm::coll::Op;
//! use devcomm::prelude::*;
//!
//! let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
//! std::thread::scope(|s| {
//!     for comm in &comms {
//!         s.spawn(move || -> devcomm::Result<()> {
//!             let coll = comm.collectives()?;
//!             let stream = comm.device().stream();
//!             let x = comm.device().alloc_from(&[comm.rank() as f32 + 1.0; 5])?;
//!             let y = comm.device().alloc::<f32>(5)?;
//!             coll.all_reduce(&x, &y, Op::Sum, stream)?;
//!             assert_eq!(stream.read_vec(&y)?, vec![3.0; 5]);
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok::<(), devcomm::Error>(())
//! ```
//!
//! Operands ([`Operand`]) are device buffers, or ranges of registered
//! windows: a window the peers read in place (zero copy); a buffer is
//! copied through the scratch's staging area, in chunks. The input must be
//! of the same kind on every rank (all windows or all buffers; checked in
//! checking mode); broadcast and scatter stage the root's input always
//! (the other ranks cannot know where it lies). Every call is
//! stream-ordered and returns once queued; a failure on the device
//! (a timeout, an abort) is kept and returned by the next call and by
//! [`Collectives::synchronize`].
//!
//! ## CUDA graphs
//!
//! The collectives within one LSA team (all of them but `send`, `recv`,
//! groups and `all_to_all_v`) can be captured into a graph
//! ([`Stream::capture`](crate::runtime::Stream::capture)) and the graph
//! launched again and again ([`Graph::launch`](crate::runtime::Graph::launch)):
//! they keep no host-side state between calls (the LL all-reduce numbers
//! its calls on the device, the barriers count their epochs there). Every
//! rank captures the same calls and launches its graph as often. Sends,
//! receives and collectives across LSA teams number their channels' chunks
//! on the host and refuse a capturing stream with
//! [`Error::InvalidUsage`]. Capture after a first, uncaptured call of each
//! kind and size: that call builds what it needs (loads kernels, grows
//! buffers), which a capture does not allow.
//!
//! ```
//! use devcomm::coll::Op;
//! use devcomm::prelude::*;
//!
//! let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
//! std::thread::scope(|s| {
//!     let ranks: Vec<_> = comms.iter().map(|comm| {
//!         s.spawn(move || -> devcomm::Result<()> {
//!             let coll = comm.collectives()?;
//!             let stream = comm.device().new_stream()?;
//!             let mut x = comm.device().alloc::<f32>(4)?;
//!             let y = comm.device().alloc::<f32>(4)?;
//!             coll.all_reduce(&x, &y, Op::Sum, &stream)?; // the first call, uncaptured
//!             let graph = stream.capture(|s| coll.all_reduce(&x, &y, Op::Sum, s))?;
//!             for step in 1..=3 {
//!                 stream.write(&mut x, &[(comm.rank() + step) as f32; 4])?;
//!                 // SAFETY: x and y are alive until the read below waits.
//!                 unsafe { graph.launch(&stream)? };
//!                 assert_eq!(stream.read_vec(&y)?, vec![(1 + 2 * step) as f32; 4]);
//!             }
//!             Ok(())
//!         })
//!     }).collect();
//!     ranks.into_iter().try_for_each(|r| r.join().expect("a rank panicked"))
//! })?;
//! # Ok::<(), devcomm::Error>(())
//! ```
//!
//! ## Several LSA teams
//!
//! In a world of several LSA teams (several nodes, or `DEVCOMM_LSA_SIZE`
//! below the rank count), channels to ranks of other teams go over GIN
//! (the `Collectives` then creates its device communicator with GIN,
//! connection `Full`). When the teams have more than one rank
//! ([`MultiTeam::Auto`], the default; [`MultiTeam::Hierarchical`] forces it
//! for one-rank teams too) all-reduce, reduce-scatter, all-gather, broadcast
//! and reduce run **hierarchically**: LSA inside each team (the same
//! kernels as above, over the team), GIN only between the ranks of a rail
//! (same LSA rank, other teams), so about `1/L` of the bytes a flat
//! exchange moves cross the network (`L` ranks per team). The steps, and
//! the bytes each sends over GIN:
//!
//! | collective | steps | GIN bytes per rank (flat) |
//! |---|---|---|
//! | all-reduce, ≥ [`CollConfig::hier_split_min_bytes`] (64 KiB) and ≥ `L` elements | reduce-scatter in the team → all-reduce of the shard along the rail → all-gather in the team; the last `count % L` elements as below | `(T-1)·count/L`, more than 2 teams `2(T-1)/T·count/L` (`(T-1)·L·count`) |
//! | all-reduce, smaller | all-reduce in the team (LL / one-shot / two-shot by size) → all-reduce of the result along the rail | `(T-1)·count` (`(T-1)·L·count`) |
//! | reduce-scatter | blocks regrouped by rail (a local copy) → reduce-scatter in the team → along the rail | `(T-1)·c` (`(T-1)·L·c`) |
//! | all-gather | along the rail → in the team → blocks into world order (a local copy) | `(T-1)·c` (`(T-1)·L·c`) |
//! | broadcast | root → its rail → each team | root: `(T-1)·count` (`(T-1)·L·count`) |
//! | reduce | in each team → along the root's rail to the root | root receives `(T-1)·count` (`(T-1)·L·count`) |
//!
//! The rail steps are groups of sends and receives to the other `T-1`
//! ranks of the rail (direct, one launch) and a local reduction of the `T`
//! partial results in team order (the rail all-reduce of a large shard
//! over more than two teams: a direct reduce-scatter, then all-gather,
//! along the rail); reductions are split in two levels
//! (`PreMulSum` scales in the team, `Avg` divides exactly, see
//! `coll/hier.rs`); narrow floats round once per level. Gather, scatter
//! and all-to-all run **flat**: a group of sends and receives, every rank
//! with every rank (GIN to the other teams), the reductions reducing the
//! received blocks locally; so do all collectives when the teams have one
//! rank each (nothing to share in a team). [`CollConfig::multi_team`] (or
//! `DEVCOMM_COLL_MULTI_TEAM=auto|flat|hier`, [`MULTI_TEAM_ENV`]) forces
//! either ([`MultiTeam`]); [`Collectives::gin_bytes_sent`] counts the
//! bytes a rank queued to other teams. LSA teams always have equal sizes
//! (consecutive blocks of ranks, see [`crate::team`]), so the hierarchical
//! path applies to every multi-team world (up to 32 teams: a rail's group
//! holds at most 64 sends and receives). Host-launched only: the device
//! collectives of [`devcomm_device::coll`] run over one LSA team.
//!
//! Operations of one `Collectives` must run in the same order on every
//! rank and one at a time: issue them on one stream (or synchronise between
//! streams); two at once on different streams share the scratch and give
//! wrong results or a device timeout.

mod datatype;
mod hier;
mod p2p;
mod stages;

pub use datatype::{CollType, DataType, Fp8E4M3, Fp8E5M2};
pub use devcomm_device::coll::{
    Algorithm, CollStage, P2pKind, RedOp, COLL_STAGES, CONTEXT_SHARED_BYTES, LL_MAX_BYTES, LL_MAX_BYTES_MANY_RANKS,
    LL_SLOT_BYTES, ONE_SHOT_MAX_BYTES, ONE_SHOT_MAX_BYTES_2_RANKS, RELAY_MIN_BYTES,
};
pub use hier::{MultiTeam, HIER_SPLIT_MIN_BYTES, MULTI_TEAM_ENV};
pub use p2p::Group;
pub use stages::PartStages;

use crate::comm::Communicator;
use crate::dev_comm::{DevCommHandle, DevCommRequirements};
use crate::error::{Error, Result};
use crate::runtime::HostMappedWord;
use crate::runtime::{DeviceBuffer, LaunchConfig, RuntimeKind, Stream};
use crate::window::{Window, WindowFlags};
use devcomm_device::coll::{CollArgs, CollBuffer, CollContext};
use devcomm_device::comm::WindowDesc;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Env: `1` turns on [`CollConfig::check_arguments`] for every
/// [`Collectives`] of the process.
pub const CHECK_ENV: &str = "DEVCOMM_COLL_CHECK";

/// How a [`Collectives`] is built.
#[derive(Clone, Debug)]
pub struct CollConfig {
    /// Most CTAs one collective uses (each has its own LSA barrier), at
    /// most 128; on CUDA also at most the GPU's multiprocessors (so a
    /// cooperative launch always fits). The default, 128: on 2 × H200 every
    /// collective of 16 and 128 MiB ran faster than with 64 (all-reduce
    /// 128 MiB 345 against 330–336 GB/s, reduce-scatter 1.24× NCCL against
    /// 1.08×: `benches/results/2026-11-26-h200x2-hier-floors.md`).
    pub max_ctas: u32,
    /// Threads per CTA (0: 256 on GPUs, 64 on the emulated runtime). The
    /// reducing kernels use many registers: 512 threads per CTA exceed the
    /// register file for some datatypes (a launch error).
    pub threads: u32,
    /// A collective gets one CTA per this many bytes (per rank), up to
    /// `max_ctas`. The default, 16 KiB, is one step of a 256-thread CTA
    /// (four 16-byte vectors per thread in flight): below that many bytes a
    /// CTA's remote loads are a round trip each; fewer, fuller CTAs paid one
    /// round trip per step (measured on 2 × H200, `benches/results/`).
    pub bytes_per_cta: usize,
    /// Payload bytes of each LL slot: the largest LL all-reduce, broadcast
    /// or reduce (default [`LL_SLOT_BYTES`]; [`Algorithm::Auto`] takes LL
    /// only up to [`LL_MAX_BYTES`] on two ranks, [`LL_MAX_BYTES_MANY_RANKS`]
    /// on more).
    pub ll_bytes: usize,
    /// Bytes of each of the two staging areas through which device buffers
    /// are pushed, in chunks of `stage_bytes / max_ctas` per CTA. The
    /// default, 32 MiB (64 MiB of device memory per [`Collectives`]): with
    /// 8 MiB, 128 MiB collectives paid a barrier per 128 KiB chunk and
    /// ran 10–20 % slower on 2 × H200.
    pub stage_bytes: usize,
    /// Payload bytes of each point-to-point slot (send/recv move messages
    /// in chunks of this size; a multiple of 16).
    pub p2p_chunk_bytes: usize,
    /// Slots of each point-to-point channel (one per ordered pair of
    /// ranks): a send of up to `p2p_slots * p2p_chunk_bytes` bytes
    /// completes before its receive starts.
    pub p2p_slots: u32,
    /// Payload bytes of each slot of the point-to-point channels to ranks
    /// of other LSA teams, over GIN (several LSA teams only; a multiple of
    /// 16). Larger than [`CollConfig::p2p_chunk_bytes`]: each chunk costs
    /// the GIN proxy about 20 µs on 2 × H200, so a 32 MiB send between two
    /// one-rank LSA teams moved 3.7 GB/s in 64 KiB chunks and 34–52 GB/s
    /// in 1 MiB chunks (`benches/results/2026-11-26-h200x2-ll-rooted-rma-p2p.md`).
    pub p2p_gin_chunk_bytes: usize,
    /// Slots of each GIN point-to-point channel. The GIN window holds `2 *
    /// ranks * p2p_gin_slots * p2p_gin_chunk_bytes` bytes (32 MiB per rank
    /// of the world by default); with 1 MiB chunks a 64 MiB send moved
    /// 15.7 / 33.7 / 45.6 GB/s with 8 / 16 / 32 slots (same file).
    pub p2p_gin_slots: u32,
    /// Slots (of 8 bytes of payload each) per parity of every block's LL
    /// all-to-all inbox (`devcomm_device::coll::LlA2aSession`), one block
    /// per CTA of `max_ctas`.
    pub ll_a2a_slots: u32,
    /// Most CTAs one send or receive uses (a group's launch has at most
    /// 256 CTAs: its tasks share them).
    pub p2p_max_ctas: u32,
    /// Before each collective, compare its operation, datatype, counts and
    /// root across ranks (through the bootstrap: slow) and return
    /// [`Error::InvalidArgument`] naming the rank that differs, instead of
    /// running a mismatched collective. Also on with `DEVCOMM_COLL_CHECK=1`.
    pub check_arguments: bool,
    /// How collectives run when the world spans several LSA teams:
    /// hierarchically where that applies, or flat (see the [module
    /// docs](self#several-lsa-teams)). The default is [`MultiTeam::Auto`],
    /// or what [`MULTI_TEAM_ENV`] (`DEVCOMM_COLL_MULTI_TEAM=auto|flat|hier`)
    /// says.
    pub multi_team: MultiTeam,
    /// Hierarchical all-reduce: messages of at least this many bytes (and
    /// at least one element per LSA rank) take the three-step algorithm
    /// (reduce-scatter in the team, all-reduce of the shard along the rail,
    /// all-gather in the team); smaller ones the two-step one (all-reduce
    /// in the team, then of the whole message along the rail).
    pub hier_split_min_bytes: usize,
    /// Bytes of each slot of the rail exchange that the device-callable
    /// hierarchical all-reduce (`devcomm_device::coll::hier::all_reduce`,
    /// from kernels of your own with [`Collectives::context`]) moves its
    /// shard along the rail with: per CTA of `max_ctas` one slot per LSA
    /// team and one more, in the GIN window (several LSA teams only). A
    /// multiple of 16.
    pub rail_chunk_bytes: usize,
    /// Launch the collectives' kernels cooperatively on CUDA
    /// (`cuLaunchCooperativeKernel`: the driver guarantees every CTA is
    /// resident at once, which the CTAs' pairwise barriers need). `false`
    /// launches them as NCCL does, plainly, relying on a grid of at most
    /// `max_ctas` CTAs fitting the GPU once the work ahead of it on other
    /// streams is done. Default: `true`, or what [`COOPERATIVE_ENV`]
    /// (`DEVCOMM_COLL_COOPERATIVE=0|1`) says. The emulated runtime always
    /// runs them co-resident.
    pub cooperative: bool,
    /// Record each all-reduce kernel's stages per CTA (`%globaltimer` at
    /// its start, after its barrier setup, pushes and first barrier, and at
    /// its end: [`CollStage`]), read with [`Collectives::stage_times`].
    /// Costs a few stores per CTA and call. Default: off.
    pub stage_stamps: bool,
}

/// Env: `0` launches the collectives' kernels plainly instead of
/// cooperatively ([`CollConfig::cooperative`]).
pub const COOPERATIVE_ENV: &str = "DEVCOMM_COLL_COOPERATIVE";

impl Default for CollConfig {
    fn default() -> Self {
        CollConfig {
            max_ctas: 128,
            threads: 0,
            bytes_per_cta: 16 << 10,
            ll_bytes: LL_SLOT_BYTES as usize,
            stage_bytes: 32 << 20,
            p2p_chunk_bytes: 64 << 10,
            p2p_slots: 32,
            p2p_gin_chunk_bytes: 1 << 20,
            p2p_gin_slots: 16,
            p2p_max_ctas: 16,
            ll_a2a_slots: 2048,
            check_arguments: std::env::var(CHECK_ENV).is_ok_and(|v| v.trim() == "1"),
            multi_team: MultiTeam::from_env().ok().flatten().unwrap_or_default(),
            hier_split_min_bytes: HIER_SPLIT_MIN_BYTES,
            rail_chunk_bytes: 16 << 10,
            cooperative: std::env::var(COOPERATIVE_ENV).map_or(true, |v| v.trim() != "0"),
            stage_stamps: false,
        }
    }
}

/// A reduction (`ncclRedOp_t`), with `PreMulSum`'s scalar.
#[derive(Clone, Copy, Debug)]
pub enum Op<'a, T> {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`.
    Avg,
    /// `sum(scalar * x)` (`ncclRedOpCreatePreMulSum`, scalar on the host).
    PreMulSum(T),
    /// `sum(scalar * x)`, the scalar read from element 0 of a device buffer
    /// when the collective runs (`ncclScalarDevice`).
    PreMulSumDevice(&'a DeviceBuffer<T>),
}

impl<T: CollType> Op<'_, T> {
    fn code(&self) -> RedOp {
        match self {
            Op::Sum => RedOp::Sum,
            Op::Prod => RedOp::Prod,
            Op::Max => RedOp::Max,
            Op::Min => RedOp::Min,
            Op::Avg => RedOp::Avg,
            Op::PreMulSum(_) | Op::PreMulSumDevice(_) => RedOp::PreMulSum,
        }
    }

    /// (scalar bits, scalar address).
    fn scalar(&self) -> Result<(u64, u64)> {
        match self {
            Op::PreMulSum(s) => {
                let mut bits = [0u8; 8];
                bits[..std::mem::size_of::<T>()].copy_from_slice(bytemuck::bytes_of(s));
                Ok((u64::from_le_bytes(bits), 0))
            }
            Op::PreMulSumDevice(b) => {
                if b.is_empty() {
                    return Err(Error::invalid_argument("PreMulSumDevice: the scalar's buffer is empty"));
                }
                Ok((0, b.device_addr()))
            }
            _ => Ok((0, 0)),
        }
    }
}

/// One operand of a collective: a device buffer, a range of a registered
/// window, or nothing ([`Operand::null`], where a rank's operand is unused).
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a, T> {
    ptr: u64,
    len: usize,
    ordinal: usize,
    window: Option<(WindowDesc, u64, usize)>,
    _t: PhantomData<&'a T>,
}

impl<'a, T: CollType> From<&'a DeviceBuffer<T>> for Operand<'a, T> {
    fn from(b: &'a DeviceBuffer<T>) -> Self {
        Operand { ptr: b.device_addr(), len: b.len(), ordinal: b.device().ordinal(), window: None, _t: PhantomData }
    }
}

impl<'a, T: CollType> From<&'a mut DeviceBuffer<T>> for Operand<'a, T> {
    fn from(b: &'a mut DeviceBuffer<T>) -> Self {
        Operand::from(&*b)
    }
}

impl<'a, T: CollType> Operand<'a, T> {
    /// `len` elements at byte `offset` of `window` (peers read it in place).
    ///
    /// Errors: [`Error::InvalidArgument`] for a range past the window's end,
    /// an offset not a multiple of `T`'s size, or a window not registered
    /// with [`WindowFlags::COLL_SYMMETRIC`].
    pub fn window(window: &'a Window<'_>, offset: usize, len: usize) -> Result<Self> {
        let size = std::mem::size_of::<T>();
        let end = len.checked_mul(size).and_then(|b| b.checked_add(offset));
        if end.is_none_or(|e| e > window.size()) {
            return Err(Error::invalid_argument(format!(
                "operand of {len} elements of {size} bytes at offset {offset}: past the window's {} bytes",
                window.size()
            )));
        }
        if offset % size != 0 {
            return Err(Error::invalid_argument(format!("window offset {offset} is not a multiple of {size} bytes")));
        }
        if window.desc().flags() & WindowFlags::COLL_SYMMETRIC.bits() == 0 {
            return Err(Error::invalid_argument(
                "collectives read windows in place on every rank: register the window with WindowFlags::COLL_SYMMETRIC",
            ));
        }
        // The window's own LSA mapping (not `user_ptr`, another mapping of
        // the same memory): the device compares addresses to detect in-place
        // operands, so every window operand uses the same one.
        Ok(Operand {
            ptr: {
                let d = window.desc();
                d.lsa_base() + d.lsa_rank() as u64 * d.stride() + offset as u64
            },
            len,
            ordinal: window.comm().device().ordinal(),
            window: Some((window.desc(), offset as u64, crate::window::comm_key(window.comm()))),
            _t: PhantomData,
        })
    }

    /// Elements `start..start + len` of `buffer` (NCCL's pointer + count).
    ///
    /// Errors: [`Error::InvalidArgument`] for a range past the buffer's end.
    pub fn range(buffer: &'a DeviceBuffer<T>, start: usize, len: usize) -> Result<Self> {
        Operand::from(buffer).sub(start, len)
    }

    /// Elements `start..start + len` of this operand (a window operand's
    /// window offset moves with it).
    pub(super) fn sub(&self, start: usize, len: usize) -> Result<Self> {
        if start.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Error::invalid_argument(format!(
                "operand range {start}..{start}+{len} past the operand's {} elements",
                self.len
            )));
        }
        let skip = (start * std::mem::size_of::<T>()) as u64;
        let mut op = *self;
        op.ptr += skip;
        op.len = len;
        if let Some((w, off, key)) = op.window {
            op.window = Some((w, off + skip, key));
        }
        Ok(op)
    }

    /// No operand: for the operands a rank does not use (the output of
    /// `reduce` and `gather` on ranks other than the root, the input of
    /// `broadcast` and `scatter` there).
    pub fn null() -> Self {
        Operand { ptr: 0, len: 0, ordinal: usize::MAX, window: None, _t: PhantomData }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn is_null(&self) -> bool {
        self.ptr == 0
    }

    /// What a kernel is handed for this operand (`CollArgs::src`/`dst`).
    pub fn kernel_buffer(&self) -> CollBuffer {
        match self.window {
            Some((window, offset, _)) => CollBuffer { ptr: self.ptr, window, offset, in_window: 1, reserved: 0 },
            None => CollBuffer { ptr: self.ptr, window: WindowDesc::NONE, offset: 0, in_window: 0, reserved: 0 },
        }
    }
}

/// Which collective (and which kernel family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Kind {
    AllReduce = 1,
    Reduce = 2,
    ReduceScatter = 3,
    AllGather = 4,
    Broadcast = 5,
    Gather = 6,
    Scatter = 7,
    AllToAll = 8,
}

/// What runs the host collectives of one communicator (see the [module docs](self)).
pub struct Collectives<'c> {
    comm: &'c Communicator,
    handle: DevCommHandle<'c>,
    /// The GIN channels' window and memory (several LSA teams), dropped
    /// after the device communicator that uses them.
    gin_window: Option<Window<'c>>,
    _gin_mem: Option<crate::memory::SymmetricMemory>,
    ctx: CollContext,
    config: CollConfig,
    threads: u32,
    seq: AtomicU32,
    error: HostMappedWord,
    /// Per peer: chunks sent to it and received from it so far (the
    /// point-to-point channels' sequence numbers).
    p2p_seq: Mutex<Vec<[u64; 2]>>,
    /// A failure of a group ended by its drop (returned by the next call).
    pending: Mutex<Option<Error>>,
    /// Scratch buffers of the collectives over several LSA teams (where
    /// they receive the blocks they reduce, shards, permuted copies; grown
    /// on demand; stream-ordered reuse), by slot.
    temps: Mutex<[Option<DeviceBuffer<u8>>; hier::TEMP_SLOTS]>,
    /// LSA team size.
    lsa: usize,
    /// Payload bytes of sends queued to ranks of other LSA teams (GIN).
    gin_bytes: AtomicU64,
    /// The stage stamps ([`CollConfig::stage_stamps`]), the context's.
    stamps: Option<DeviceBuffer<u64>>,
    /// CTAs of the latest all-reduce launched (its stamps' rows).
    stamped_ctas: AtomicU32,
}

impl Drop for Collectives<'_> {
    /// With several LSA teams, dropping is collective: the last GIN
    /// operations of this rank's kernels (credits, puts still in the
    /// proxy) may be addressed to peers that have finished; every rank
    /// waits for its device, then for every other rank, before its GIN
    /// proxy drains and stops (errors are ignored here: a dead peer).
    fn drop(&mut self) {
        if self.gin_window.is_some() {
            let _ = self.comm.device().synchronize();
            let _ = self.comm.bootstrap_barrier();
        }
    }
}

impl std::fmt::Debug for Collectives<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives").field("rank", &self.comm.rank()).field("config", &self.config).finish()
    }
}

impl Communicator {
    /// The host collectives of this communicator, with the default
    /// [`CollConfig`]. Collective: every rank calls it.
    ///
    /// Errors: those of [`Communicator::create_dev_comm`] (with several LSA
    /// teams: with GIN, connection `Full`), of
    /// [`Communicator::register_window`] (several LSA teams: the GIN
    /// channels' window).
    #[doc(alias = "ncclAllReduce")]
    #[doc(alias = "ncclBroadcast")]
    #[doc(alias = "ncclReduce")]
    #[doc(alias = "ncclAllGather")]
    #[doc(alias = "ncclReduceScatter")]
    #[doc(alias = "ncclAlltoAll")]
    pub fn collectives(&self) -> Result<Collectives<'_>> {
        self.collectives_with(&CollConfig::default())
    }

    /// [`Communicator::collectives`] with `config`.
    ///
    /// Errors as [`Communicator::collectives`], and
    /// [`Error::InvalidArgument`] for a config out of range.
    pub fn collectives_with(&self, config: &CollConfig) -> Result<Collectives<'_>> {
        let n = self.count();
        let lsa = self.lsa_size()?;
        // Several LSA teams: sends and receives reach the other teams over
        // GIN; the collectives run hierarchically or flat (see `run`).
        let several_teams = lsa != n;
        // A bad `DEVCOMM_COLL_MULTI_TEAM` is an error, not ignored.
        MultiTeam::from_env()?;
        if config.max_ctas == 0 || config.max_ctas > 128 {
            return Err(Error::invalid_argument(format!("max_ctas {} not in 1..=128", config.max_ctas)));
        }
        // Every CTA of a collective must be resident at once: on CUDA at
        // most one per multiprocessor, so a GPU with fewer than `max_ctas`
        // still launches the default.
        let mut config = config.clone();
        if self.device().kind() == RuntimeKind::Cuda {
            config.max_ctas = config.max_ctas.min(self.device().multiprocessor_count().max(1));
        }
        let config = &config;
        if config.threads > 1024 || (config.threads != 0 && config.threads % 32 != 0) {
            return Err(Error::invalid_argument(format!("threads {} not a multiple of 32 up to 1024", config.threads)));
        }
        if config.ll_bytes % 16 != 0 || config.ll_bytes > (1 << 20) {
            return Err(Error::invalid_argument(format!(
                "ll_bytes {} not a multiple of 16 up to 1 MiB",
                config.ll_bytes
            )));
        }
        if config.stage_bytes % 16 != 0
            || config.stage_bytes < 16 * n * config.max_ctas as usize
            || config.stage_bytes > (1 << 30)
        {
            return Err(Error::invalid_argument(format!(
                "stage_bytes {} not a multiple of 16 between 16 * ranks * max_ctas and 1 GiB",
                config.stage_bytes
            )));
        }
        if config.bytes_per_cta == 0 {
            return Err(Error::invalid_argument("bytes_per_cta is 0"));
        }
        if config.p2p_chunk_bytes == 0 || config.p2p_chunk_bytes % 16 != 0 || config.p2p_chunk_bytes > (64 << 20) {
            return Err(Error::invalid_argument(format!(
                "p2p_chunk_bytes {} not a non-zero multiple of 16 up to 64 MiB",
                config.p2p_chunk_bytes
            )));
        }
        if config.p2p_slots == 0 || config.p2p_slots > 1024 {
            return Err(Error::invalid_argument(format!("p2p_slots {} not in 1..=1024", config.p2p_slots)));
        }
        if config.p2p_gin_chunk_bytes == 0
            || config.p2p_gin_chunk_bytes % 16 != 0
            || config.p2p_gin_chunk_bytes > (64 << 20)
        {
            return Err(Error::invalid_argument(format!(
                "p2p_gin_chunk_bytes {} not a non-zero multiple of 16 up to 64 MiB",
                config.p2p_gin_chunk_bytes
            )));
        }
        if config.p2p_gin_slots == 0 || config.p2p_gin_slots > 1024 {
            return Err(Error::invalid_argument(format!("p2p_gin_slots {} not in 1..=1024", config.p2p_gin_slots)));
        }
        if config.rail_chunk_bytes == 0 || config.rail_chunk_bytes % 16 != 0 || config.rail_chunk_bytes > (64 << 20) {
            return Err(Error::invalid_argument(format!(
                "rail_chunk_bytes {} not a non-zero multiple of 16 up to 64 MiB",
                config.rail_chunk_bytes
            )));
        }
        if config.p2p_max_ctas == 0 || config.p2p_max_ctas > 32 {
            return Err(Error::invalid_argument(format!("p2p_max_ctas {} not in 1..=32", config.p2p_max_ctas)));
        }
        if config.ll_a2a_slots > (1 << 20) {
            return Err(Error::invalid_argument(format!("ll_a2a_slots {} above 2^20", config.ll_a2a_slots)));
        }
        let ll_area = CollContext::ll_area_bytes(lsa as u32, config.ll_bytes as u64) as usize;
        let a2a_area = CollContext::ll_a2a_bytes(config.max_ctas, config.ll_a2a_slots) as usize;
        let p2p_area = CollContext::p2p_bytes(lsa as u32, config.p2p_chunk_bytes as u64, config.p2p_slots) as usize;
        let p2p_words = 3 * lsa * config.p2p_slots as usize * 8;
        let mut req = DevCommRequirements::new();
        req.lsa_barrier_count = config.max_ctas;
        // The GIN channels' window (several LSA teams only).
        let gin = if several_teams {
            // The point-to-point channels, then the rail exchange.
            let p2p_bytes =
                CollContext::p2p_gin_bytes(n as u32, config.p2p_gin_chunk_bytes as u64, config.p2p_gin_slots);
            let rail_offset = p2p_bytes.next_multiple_of(16);
            let teams = (n / lsa) as u32;
            let bytes = rail_offset + CollContext::rail_bytes(config.max_ctas, teams, config.rail_chunk_bytes as u64);
            let mem = self.mem_alloc(bytes as usize)?;
            let window = self.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
            req.use_window(&window);
            req.gin_connection_type = crate::gin::GinConnectionType::Full;
            req.gin_signal_count = CollContext::p2p_gin_signals(n as u32, config.p2p_gin_slots)
                + CollContext::rail_signals(config.max_ctas);
            req.gin_context_count = 1;
            Some((window, mem, rail_offset))
        } else {
            None
        };
        let scratch =
            req.add_resource((ll_area + 2 * config.stage_bytes + p2p_area.next_multiple_of(16) + a2a_area) as u64, 256);
        let handle = self.create_dev_comm(&req)?;
        let offset = handle.resource_offset(scratch)?;
        let window = handle.resource_window();
        // LL slots start zeroed (a flag from garbage could match), on every
        // rank before any rank writes into a peer's slots.
        let stream = self.device().stream();
        stream.write_raw(window.local_ptr::<u8>(offset) as u64, &vec![0u8; ll_area])?;
        // So do the point-to-point flags, lengths and credits.
        let p2p_offset = offset + (ll_area + 2 * config.stage_bytes) as u64;
        let p2p_words_offset = p2p_offset + (p2p_area - p2p_words) as u64;
        stream.write_raw(window.local_ptr::<u8>(p2p_words_offset) as u64, &vec![0u8; p2p_words])?;
        // And the LL all-to-all inboxes and epochs.
        let a2a_offset = p2p_offset + p2p_area.next_multiple_of(16) as u64;
        stream.write_raw(window.local_ptr::<u8>(a2a_offset) as u64, &vec![0u8; a2a_area])?;
        stream.synchronize()?;
        self.bootstrap_barrier()?;
        // SAFETY: the device communicator has `max_ctas` LSA barriers that
        // nothing else uses (it is this object's own); its resource window
        // holds, on every rank, the LL area (zeroed above, on every rank
        // before the barrier), the two staging areas and the point-to-point
        // area (its words zeroed above) and the LL all-to-all area (zeroed
        // above) at `offset`, 256-byte aligned, sizes
        // multiples of 16 (checked above).
        let ctx = unsafe {
            CollContext::from_raw_parts(
                handle.dev_comm(),
                window,
                offset,
                config.ll_bytes as u64,
                offset + ll_area as u64,
                config.stage_bytes as u64,
                0,
                config.max_ctas,
            )
            .with_p2p(p2p_offset, config.p2p_chunk_bytes as u64, config.p2p_slots)
            .with_ll_a2a(a2a_offset, config.ll_a2a_slots)
        };
        let ctx = match &gin {
            // SAFETY: the device communicator has GIN (Full) with
            // `p2p_gin_signals` signals from 0, then `rail_signals` more
            // (zero when made, with their shadows) and context 0, nothing
            // else uses them; the window was registered on every rank with
            // `p2p_gin_bytes` bytes, then the rail area at `rail_offset`
            // (16-byte aligned, `rail_chunk_bytes` a multiple of 16,
            // checked above), and declared with use_window.
            Some((window, _, rail_offset)) => unsafe {
                ctx.with_p2p_gin(window.desc(), 0, 0, config.p2p_gin_chunk_bytes as u64, config.p2p_gin_slots)
                    .with_rail(
                        *rail_offset,
                        config.rail_chunk_bytes as u64,
                        CollContext::p2p_gin_signals(n as u32, config.p2p_gin_slots),
                    )
            },
            None => ctx,
        };
        let stamps = stages::alloc(config, self.device())?;
        // SAFETY: `max_ctas` (the context's parts) `u64`s of device memory
        // that only this object's context uses, kept alive with it.
        let ctx = unsafe { ctx.with_stage_stamps(stamps.as_ref().map_or(0, |b| b.device_addr())) };
        let threads = match (config.threads, self.device().kind()) {
            (0, RuntimeKind::Cuda) => 256,
            (0, RuntimeKind::Emulated) => 64,
            (t, _) => t,
        };
        let error = HostMappedWord::new(self.device())?;
        let (gin_window, gin_mem) = gin.map_or((None, None), |(w, m, _)| (Some(w), Some(m)));
        Ok(Collectives {
            comm: self,
            handle,
            gin_window,
            _gin_mem: gin_mem,
            ctx,
            config: config.clone(),
            threads,
            seq: AtomicU32::new(0),
            error,
            p2p_seq: Mutex::new(vec![[0; 2]; n]),
            pending: Mutex::new(None),
            temps: Mutex::new(Default::default()),
            lsa,
            gin_bytes: AtomicU64::new(0),
            stamps,
            stamped_ctas: AtomicU32::new(0),
        })
    }
}

impl<'c> Collectives<'c> {
    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The context kernels of your own pass to [`devcomm_device::coll`]'s
    /// collectives (fusing them with compute). It shares the scratch and
    /// barriers with this object's host collectives: do not run both at once.
    pub fn context(&self) -> CollContext {
        self.ctx
    }

    /// How this object was built.
    pub fn config(&self) -> &CollConfig {
        &self.config
    }

    /// Threads per CTA of this object's launches ([`CollConfig::threads`],
    /// its 0 resolved for the runtime): what a kernel of your own that calls
    /// the device collectives with [`Collectives::context`] can use too.
    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// The device communicator behind the context.
    pub fn dev_comm(&self) -> &DevCommHandle<'c> {
        &self.handle
    }

    /// A fresh sequence number for a device-side collective of
    /// [`Collectives::context`] (the LL flag): non-zero, one more per call;
    /// every rank gets the same numbers when it makes the same calls. For
    /// kernels of your own: this object's host collectives number their LL
    /// calls on the device (`seq` 0, which a kernel of yours may pass too,
    /// from a single-part call), in slots apart from those these numbers use.
    pub fn next_seq(&self) -> u32 {
        loop {
            let s = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if s != 0 {
                return s;
            }
        }
    }

    /// `k` consecutive fresh sequence numbers (none of them 0), for a
    /// kernel that runs `k` device-side collectives of
    /// [`Collectives::context`]: returns the first.
    pub fn reserve_seq(&self, k: u32) -> u32 {
        loop {
            let first = self.seq.fetch_add(k, Ordering::Relaxed).wrapping_add(1);
            // A run that crosses 0 is skipped (every rank skips alike).
            if first != 0 && first.checked_add(k - 1).is_some() {
                return first;
            }
        }
    }

    /// The failure a collective's kernel reported, if any (kept until this
    /// object is dropped: the scratch's state is unknown after it).
    pub fn error(&self) -> Option<Error> {
        if let Some(e) = self.pending.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            return Some(e.clone());
        }
        Error::from_device_code(self.error.get(), "a collective")
    }

    /// Waits for `stream`, then returns the first failure a collective
    /// reported ([`Collectives::error`]).
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        stream.synchronize()?;
        self.error().map_or(Ok(()), Err)
    }

    /// `recv[i] = op over ranks of send[i]` on every rank (`ncclAllReduce`);
    /// `send` and `recv` of the same length; in place when they are the
    /// same memory. The algorithm is chosen by size
    /// ([`Algorithm::choose`]).
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        op: Op<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        self.all_reduce_with(send, recv, op, Algorithm::Auto, stream)
    }

    /// [`Collectives::all_reduce`] with a given algorithm.
    pub fn all_reduce_with<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        op: Op<'_, T>,
        algorithm: Algorithm,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_operand("all_reduce send", &send)?;
        self.check_operand("all_reduce recv", &recv)?;
        same_len("all_reduce", send.len, recv.len)?;
        let count = send.len;
        let bytes = (count * std::mem::size_of::<T>()) as u64;
        check_ll("all_reduce", algorithm, bytes, self.ctx.ll_bytes())?;
        let resolved = algorithm.resolve(bytes, &self.ctx);
        self.run::<T>(Kind::AllReduce, &send, &recv, count, &op, 0, resolved, bytes as usize, stream)
    }

    /// `recv[i] = op over ranks of send[i]` on `root` only (`ncclReduce`);
    /// `recv` may be [`Operand::null`] elsewhere. LL (one CTA, no barrier)
    /// up to [`LL_MAX_BYTES`], relayed through the other ranks from
    /// [`RELAY_MIN_BYTES`] on teams of three or more
    /// ([`Algorithm::choose_rooted`]).
    #[doc(alias = "ncclReduce")]
    pub fn reduce<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        op: Op<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.reduce_with(send, recv, op, root, Algorithm::Auto, stream)
    }

    /// [`Collectives::reduce`] with a given algorithm: `Ll` data and flags
    /// in the same stores, no barrier (up to [`CollConfig::ll_bytes`]),
    /// `OneShot` every rank's input straight to the root, `TwoShot` relayed
    /// (see the device [`reduce`](devcomm_device::coll::reduce)).
    pub fn reduce_with<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        op: Op<'_, T>,
        root: usize,
        algorithm: Algorithm,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_root("reduce", root)?;
        self.check_operand("reduce send", &send)?;
        if self.comm.rank() == root {
            self.check_operand("reduce recv (on the root)", &recv)?;
            same_len("reduce", send.len, recv.len)?;
        }
        let bytes = send.len * std::mem::size_of::<T>();
        check_ll("reduce", algorithm, bytes as u64, self.ctx.ll_bytes())?;
        let algorithm = algorithm.resolve_rooted(bytes as u64, &self.ctx, 1);
        self.run::<T>(Kind::Reduce, &send, &recv, send.len, &op, root, algorithm, bytes, stream)
    }

    /// `recv[i] = op over ranks r of send_r[rank * recv.len() + i]`
    /// (`ncclReduceScatter`): `send` holds `ranks * recv.len()` elements.
    #[doc(alias = "ncclReduceScatter")]
    pub fn reduce_scatter<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        op: Op<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_operand("reduce_scatter send", &send)?;
        self.check_operand("reduce_scatter recv", &recv)?;
        self.check_ranks_times("reduce_scatter", ("send", send.len), ("recv", recv.len))?;
        let bytes = send.len * std::mem::size_of::<T>();
        self.run::<T>(Kind::ReduceScatter, &send, &recv, recv.len, &op, 0, Algorithm::OneShot, bytes, stream)
    }

    /// `recv[r * send.len() + i] = send_r[i]` on every rank
    /// (`ncclAllGather`): `recv` holds `ranks * send.len()` elements.
    #[doc(alias = "ncclAllGather")]
    pub fn all_gather<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_operand("all_gather send", &send)?;
        self.check_operand("all_gather recv", &recv)?;
        self.check_ranks_times("all_gather", ("recv", recv.len), ("send", send.len))?;
        let bytes = recv.len * std::mem::size_of::<T>();
        self.run::<T>(Kind::AllGather, &send, &recv, send.len, &Op::Sum, 0, Algorithm::OneShot, bytes, stream)
    }

    /// `recv = send_root` on every rank (`ncclBroadcast`); `send` is read
    /// on the root only ([`Operand::null`] elsewhere); in place when the
    /// root's `send` and `recv` are the same memory. LL (one CTA, no
    /// barrier) up to [`LL_MAX_BYTES`], relayed through the other ranks
    /// from [`RELAY_MIN_BYTES`] on teams of three or more
    /// ([`Algorithm::choose_rooted`]).
    #[doc(alias = "ncclBroadcast")]
    pub fn broadcast<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.broadcast_with(send, recv, root, Algorithm::Auto, stream)
    }

    /// [`Collectives::broadcast`] with a given algorithm: `Ll` data and
    /// flags in the same stores, no barrier (up to [`CollConfig::ll_bytes`]),
    /// `OneShot` from the root to every rank, `TwoShot` relayed (see the
    /// device [`broadcast`](devcomm_device::coll::broadcast)).
    pub fn broadcast_with<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        root: usize,
        algorithm: Algorithm,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_root("broadcast", root)?;
        self.check_operand("broadcast recv", &recv)?;
        if self.comm.rank() == root {
            self.check_operand("broadcast send (on the root)", &send)?;
            same_len("broadcast", send.len, recv.len)?;
        }
        let bytes = recv.len * std::mem::size_of::<T>();
        check_ll("broadcast", algorithm, bytes as u64, self.ctx.ll_bytes())?;
        let algorithm = algorithm.resolve_rooted(bytes as u64, &self.ctx, 1);
        self.run::<T>(Kind::Broadcast, &send, &recv, recv.len, &Op::Sum, root, algorithm, bytes, stream)
    }

    /// `recv[r * send.len() + i] = send_r[i]` on `root` (`ncclGather`):
    /// the root's `recv` holds `ranks * send.len()` elements
    /// ([`Operand::null`] elsewhere).
    #[doc(alias = "ncclGather")]
    pub fn gather<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_root("gather", root)?;
        self.check_operand("gather send", &send)?;
        let n = self.comm.count();
        if self.comm.rank() == root {
            self.check_operand("gather recv (on the root)", &recv)?;
            self.check_ranks_times("gather", ("the root's recv", recv.len), ("send", send.len))?;
        }
        let bytes = send.len * n * std::mem::size_of::<T>();
        self.run::<T>(Kind::Gather, &send, &recv, send.len, &Op::Sum, root, Algorithm::OneShot, bytes, stream)
    }

    /// `recv = send_root[rank * recv.len() ..][.. recv.len()]` (`ncclScatter`):
    /// the root's `send` holds `ranks * recv.len()` elements ([`Operand::null`] elsewhere).
    #[doc(alias = "ncclScatter")]
    pub fn scatter<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_root("scatter", root)?;
        self.check_operand("scatter recv", &recv)?;
        let n = self.comm.count();
        if self.comm.rank() == root {
            self.check_operand("scatter send (on the root)", &send)?;
            self.check_ranks_times("scatter", ("the root's send", send.len), ("recv", recv.len))?;
        }
        let bytes = recv.len * n * std::mem::size_of::<T>();
        self.run::<T>(Kind::Scatter, &send, &recv, recv.len, &Op::Sum, root, Algorithm::OneShot, bytes, stream)
    }

    /// `recv[r * c + i] = send_r[rank * c + i]` for `c = send.len() / ranks`
    /// (`ncclAlltoAll`): `send` and `recv` of the same length, a multiple
    /// of the rank count, not overlapping.
    #[doc(alias = "ncclAlltoAll")]
    pub fn all_to_all<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        recv: impl Into<Operand<'a, T>>,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.check_operand("all_to_all send", &send)?;
        self.check_operand("all_to_all recv", &recv)?;
        same_len("all_to_all", send.len, recv.len)?;
        let n = self.comm.count();
        if send.len % n != 0 {
            return Err(Error::invalid_argument(format!(
                "all_to_all: {} elements is not a multiple of the rank count {n}",
                send.len
            )));
        }
        let bytes = send.len * std::mem::size_of::<T>();
        if overlap(&send, &recv, bytes) {
            return Err(Error::invalid_argument("all_to_all: send and recv overlap (no in-place all-to-all)"));
        }
        self.run::<T>(Kind::AllToAll, &send, &recv, send.len / n, &Op::Sum, 0, Algorithm::OneShot, bytes, stream)
    }

    /// `big.1` must be the rank count times `small.1` (names for the message).
    fn check_ranks_times(&self, what: &str, big: (&str, usize), small: (&str, usize)) -> Result<()> {
        let n = self.comm.count();
        if Some(big.1) != small.1.checked_mul(n) {
            return Err(Error::invalid_argument(format!(
                "{what}: {} holds {} elements, it must hold ranks ({n}) × {} ({}) elements",
                big.0, big.1, small.0, small.1
            )));
        }
        Ok(())
    }

    fn check_root(&self, what: &str, root: usize) -> Result<()> {
        if root >= self.comm.count() {
            return Err(Error::invalid_argument(format!(
                "{what}: root {root} is not below the rank count {}",
                self.comm.count()
            )));
        }
        Ok(())
    }

    fn check_operand<T: CollType>(&self, what: &str, op: &Operand<'_, T>) -> Result<()> {
        if op.is_null() {
            return Err(Error::invalid_argument(format!("{what}: Operand::null() where this rank needs a buffer")));
        }
        if op.ordinal != self.comm.device().ordinal() {
            return Err(Error::invalid_argument(format!(
                "{what}: the buffer is on device {}, the communicator on device {}",
                op.ordinal,
                self.comm.device().ordinal()
            )));
        }
        if let Some((_, _, key)) = op.window {
            if key != crate::window::comm_key(self.comm) {
                return Err(Error::invalid_argument(format!("{what}: the window belongs to another communicator")));
            }
        }
        Ok(())
    }

    /// Queues one collective.
    #[allow(clippy::too_many_arguments)]
    fn run<T: CollType>(
        &self,
        kind: Kind,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        op: &Op<'_, T>,
        root: usize,
        algorithm: Algorithm,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        // The scalar's operand is checked before anything runs.
        op.scalar()?;
        if self.config.check_arguments {
            self.check_across_ranks(kind, T::DTYPE, count, root, op.code(), send.window.is_some())?;
        }
        if self.gin_window.is_some() {
            refuse_capture(stream, "a collective across LSA teams")?;
            // Several LSA teams: hierarchical where it applies, else flat
            // (sends and receives, GIN between teams).
            if self.hierarchical(kind) {
                return self.run_hier(kind, send, recv, count, op, root, algorithm, stream);
            }
            return self.run_flat(kind, send, recv, count, op, root, stream);
        }
        self.launch_lsa(kind, send, recv, count, op, root, algorithm, bytes, stream)
    }

    /// Queues one collective over this rank's LSA team (the device
    /// collectives' kernel for `kind`); `root` is an LSA rank.
    #[allow(clippy::too_many_arguments)]
    fn launch_lsa<T: CollType>(
        &self,
        kind: Kind,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        op: &Op<'_, T>,
        root: usize,
        algorithm: Algorithm,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let (scalar, scalar_ptr) = op.scalar()?;
        if bytes == 0 {
            return Ok(());
        }
        // An LL all-reduce numbers its calls on the device (`seq` 0), so a
        // launch captured into a CUDA graph stays right when replayed; the
        // device counts them per single-part call, hence one CTA.
        let ll = match (kind, algorithm) {
            (Kind::AllReduce, Algorithm::Auto) => Algorithm::choose(bytes as u64, &self.ctx) == Algorithm::Ll,
            (_, a) => a == Algorithm::Ll,
        };
        let ctas = if ll {
            1
        } else {
            bytes.div_ceil(self.config.bytes_per_cta).clamp(1, self.config.max_ctas as usize) as u32
        };
        let size = std::mem::size_of::<T>() as u64;
        let unit = match kind {
            Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter => 1,
            _ => size,
        };
        // Where the peers read the input must be the same kind on every
        // rank. Broadcast and scatter read the root's alone, and the other
        // ranks cannot know whether it lies in a window: the root stages it.
        let mut src = send.kernel_buffer();
        if matches!(kind, Kind::Broadcast | Kind::Scatter) {
            src.in_window = 0;
        }
        let args = CollArgs {
            ctx: self.ctx,
            src,
            dst: recv.kernel_buffer(),
            count: count as u64 * unit,
            scalar,
            scalar_ptr,
            errors: self.error.device_addr(),
            op: op.code() as u32,
            root: root as u32,
            algorithm: algorithm as u32,
            seq: 0,
        };
        // Part `b` waits for part `b` of every other rank: if a rank ran
        // its CTAs in waves, rank 0's first wave could wait for a CTA that
        // rank 1 runs only after its own first wave, which waits for rank 0.
        // Every CTA must be resident at once (a cooperative launch on CUDA).
        let cfg = self.launch_config(ctas);
        if kind == Kind::AllReduce && self.stamps.is_some() {
            self.stamped_ctas.store(ctas, Ordering::Relaxed);
        }
        // SAFETY: `args` describes this object's live context and scratch,
        // operands checked above for device, communicator and length (and
        // kept alive by the caller's borrows for the call; freeing device
        // memory waits for the device), the same collective on every rank
        // (the caller's contract, checked in checking mode); the error
        // word is this object's host-mapped word.
        unsafe { launch(stream, kind, T::DTYPE, cfg, args) }
    }

    /// How a collective kernel of `ctas` CTAs is launched: co-resident
    /// (cooperative on CUDA) unless [`CollConfig::cooperative`] is off on
    /// CUDA.
    /// Every CTA gets [`CONTEXT_SHARED_BYTES`] of dynamic shared memory:
    /// the kernels' paths other than LL keep the context there.
    pub(crate) fn launch_config(&self, ctas: u32) -> LaunchConfig {
        let cfg = LaunchConfig::new(ctas, self.threads).with_shared_mem(CONTEXT_SHARED_BYTES);
        if self.config.cooperative || self.comm.device().kind() != RuntimeKind::Cuda {
            cfg.co_resident()
        } else {
            cfg
        }
    }

    /// Compares a collective's signature across ranks (checking mode).
    fn check_across_ranks(
        &self,
        kind: Kind,
        dtype: DataType,
        count: usize,
        root: usize,
        op: RedOp,
        in_window: bool,
    ) -> Result<()> {
        let in_window = in_window && !matches!(kind, Kind::Broadcast | Kind::Scatter);
        let mine = [kind as u64, dtype as u64, count as u64, root as u64, op as u64, in_window as u64];
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.comm.bootstrap_allgather(&bytes)?;
        const FIELDS: [&str; 6] =
            ["collective", "datatype", "count", "root", "reduction", "input in a window (or not)"];
        for (rank, theirs) in all.iter().enumerate() {
            if theirs != &bytes {
                let field =
                    (0..5).find(|&i| theirs.get(i * 8..i * 8 + 8) != Some(&bytes[i * 8..i * 8 + 8])).unwrap_or(0);
                return Err(Error::invalid_argument(format!(
                    "collective arguments differ between ranks: rank {rank}'s {} differs from rank {}'s ({:?} {:?} count {count} root {root} {:?})",
                    FIELDS[field],
                    self.comm.rank(),
                    kind,
                    dtype,
                    op
                )));
            }
        }
        Ok(())
    }
}

/// Refuses `what` on a capturing stream: its sequence numbers are the
/// host's, so a graph replaying it would reuse them.
pub(super) fn refuse_capture(stream: &Stream, what: &str) -> Result<()> {
    if stream.is_capturing()? {
        return Err(Error::invalid_usage(format!(
            "{what} cannot be captured into a CUDA graph yet (its channels are numbered by the host, and a replay \
             would reuse the numbers); capture collectives within one LSA team only"
        )));
    }
    Ok(())
}

/// A message for [`Algorithm::Ll`] must fit the LL slots.
fn check_ll(what: &str, algorithm: Algorithm, bytes: u64, ll_bytes: u64) -> Result<()> {
    if algorithm == Algorithm::Ll && bytes > ll_bytes {
        return Err(Error::invalid_argument(format!(
            "{what} with Algorithm::Ll: {bytes} bytes exceed the LL slots' {ll_bytes} (CollConfig::ll_bytes)"
        )));
    }
    Ok(())
}

fn same_len(what: &str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::invalid_argument(format!("{what}: send holds {a} elements and recv {b}; they must match")));
    }
    Ok(())
}

fn overlap<T>(a: &Operand<'_, T>, b: &Operand<'_, T>, bytes: usize) -> bool {
    let (a, b, n) = (a.ptr as usize, b.ptr as usize, bytes);
    a < b + n && b < a + n
}

/// Launches `kind`'s kernel for `dtype`; the pushed one-shot all-reduce
/// (a local input, [`Algorithm::OneShot`]) has kernels of its own. (They
/// keep the other kernels' threads per CTA: the f32 one fits 512, and on
/// 2 × H200 took 14.2 µs per graphed 2 MiB all-reduce with them against
/// 12.9 with 256: `benches/results/2026-11-27-h200x2-coll-stages.md`.)
///
/// # Safety
/// `args` as the kernel's contract asks (see [`Collectives::run`]'s call).
unsafe fn launch(stream: &Stream, kind: Kind, dtype: DataType, cfg: LaunchConfig, args: CollArgs) -> Result<()> {
    use devcomm_kernels::coll as k;
    let pushed = args.src.in_window == 0 && Algorithm::from_code(args.algorithm) == Some(Algorithm::OneShot);
    macro_rules! by_type {
        ($($t:ty, $d:ident => $ar:ident, $arp:ident, $r:ident, $rs:ident;)*) => {
            match (kind, dtype) {
                $(
                    // SAFETY: the caller's contract (`args.src` local).
                    (Kind::AllReduce, DataType::$d) if pushed => unsafe { stream.launch::<k::$arp>(cfg, (args,)) },
                    // SAFETY: the caller's contract.
                    (Kind::AllReduce, DataType::$d) => unsafe { stream.launch::<k::$ar>(cfg, (args,)) },
                    // SAFETY: the caller's contract.
                    (Kind::Reduce, DataType::$d) => unsafe { stream.launch::<k::$r>(cfg, (args,)) },
                    // SAFETY: the caller's contract.
                    (Kind::ReduceScatter, DataType::$d) => unsafe { stream.launch::<k::$rs>(cfg, (args,)) },
                )*
                // SAFETY: the caller's contract.
                (Kind::AllGather, _) => unsafe { stream.launch::<k::all_gather>(cfg, (args,)) },
                // SAFETY: the caller's contract.
                (Kind::Broadcast, _) => unsafe { stream.launch::<k::broadcast>(cfg, (args,)) },
                // SAFETY: the caller's contract.
                (Kind::Gather, _) => unsafe { stream.launch::<k::gather>(cfg, (args,)) },
                // SAFETY: the caller's contract.
                (Kind::Scatter, _) => unsafe { stream.launch::<k::scatter>(cfg, (args,)) },
                // SAFETY: the caller's contract.
                (Kind::AllToAll, _) => unsafe { stream.launch::<k::all_to_all>(cfg, (args,)) },
            }
        };
    }
    devcomm_kernels::with_reducing_types!(by_type)
}
