//! MoE expert-parallel dispatch and combine (DeepEP's low-latency mode,
//! NCCL EP's API shape): an [`EpGroup`] made once from a communicator and
//! an [`EpConfig`] sends each rank's tokens to the experts its router
//! picked and brings the experts' outputs back, gate-weighted and summed,
//! with one kernel each way and no host synchronisation.
//!
//! ```
//! use devcomm::moe::{EpConfig, EpGroup};
//! use devcomm::prelude::*;
//!
//! let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
//! std::thread::scope(|s| {
//!     for comm in &comms {
//!         s.spawn(move || -> devcomm::Result<()> {
//!             // 4 experts (2 per rank), tokens of 8 f32, top-2, at most 3 tokens per rank.
//!             let ep = EpGroup::new(comm, &EpConfig::new(4, 8, 2, 3))?;
//!             let (dev, stream) = (comm.device(), comm.device().stream());
//!             let x = dev.alloc_from(&[1.0f32; 2 * 8])?; // 2 tokens
//!             let idx = dev.alloc_from(&[0i32, 3, 1, 2])?; // token 0 -> experts 0, 3; token 1 -> 1, 2
//!             let w = dev.alloc_from(&[0.5f32, 0.25, 1.0, 2.0])?;
//!             let d = ep.dispatch(&x, &idx, &w, stream)?;
//!             // ... each local expert's tokens: d.recv_x rows, d.recv_count of them ...
//!             let y = ep.combine(&d.recv_x, &d.handle, stream)?; // identity experts
//!             assert_eq!(stream.read_vec(&y)?, [[0.75f32; 8], [3.0; 8]].concat());
//!             ep.synchronize(stream)
//!         });
//!     }
//! });
//! # Ok::<(), devcomm::Error>(())
//! ```
//!
//! Shapes, with `N` ranks, `E` experts, `L = E / N` local experts (expert
//! `e` lives on rank `e / L`), `M` the most tokens per rank, `H` hidden,
//! `K` top-k:
//!
//! * `dispatch(x [T; t × H], topk_idx [i32; t × K], topk_weights [f32; t
//!   × K])`, `t <= M` tokens (every rank calls it, with its own `t`, maybe
//!   0); a negative expert id is "no expert" (DeepEP's -1);
//! * it returns [`Dispatched`]: `recv_x [T; L × N·M × H]`, local expert
//!   `l`'s tokens in rows `l·N·M ..` (`recv_count[l]` of them, from source
//!   rank 0's first token to the last rank's last, each source's in token
//!   order), and the [`Handle`] combine needs;
//! * `combine(expert_out [T; L × N·M × H], &handle)` returns `y [T; t × H]`
//!   on each rank: `y[i] = Σ_j w[i][j] · out_{e_ij}(token i)` over the
//!   token's top-k experts, in f32, rounded once to `T` at the end; each
//!   LSA peer (and this rank) sends one partial sum per token over its
//!   own experts (f32, rounded to `T`), which the token's rank adds in
//!   top-k order at the first entry on that rank; outputs from ranks over
//!   GIN come per expert ([`devcomm_device::moe::CombineForm::PerRank`];
//!   with [`LlCombine::PerExpert`] every output comes per expert and is
//!   added in top-k order).
//!
//! Tokens travel by NVLink stores to LSA peers (once per peer, however
//! many of its experts a token names) and by GIN puts to the others
//! (ranks in other LSA teams; `DEVCOMM_LSA_SIZE=1` makes every peer one).
//! Every dispatch must be followed by its combine before the
//! next dispatch (the slots are reused); calls are stream-ordered and
//! return once queued; a failure on the device (a timeout, a bad expert
//! id) is kept and returned by the next call and [`EpGroup::synchronize`].
//! The device side ([`devcomm_device::moe`]) is callable from a user's
//! kernel with [`EpGroup::context`], to fuse dispatch, the experts and
//! combine, and to start each expert as soon as its tokens are in.
//!
//! Fp8 dispatch ([`EpConfig::fp8_dispatch`], [`EpGroup::dispatch_fp8`]):
//! bf16 tokens travel as fp8 e4m3 with one f32 scale per 128 elements
//! (DeepEP's low-latency fp8 format); combine stays bf16.
//!
//! High-throughput mode ([`EpMode::HighThroughput`], DeepEP's "normal"
//! kernels): the same calls and the same outputs, but each token crosses
//! to a rank once (not once per expert there), in bulk streams per
//! (destination rank, channel): NVLink stores within the LSA team, GIN
//! puts in pieces across. The layout (how many tokens each rank sends
//! each rank, per channel) travels as count words written by the GPUs
//! after the tokens: no host round trip, fixed output shapes. The
//! receiver packs per local expert; combine sends back one partial sum
//! (the rank's local experts' gate-weighted outputs, summed in f32 and
//! rounded once) per (token, rank), and the token's rank adds the
//! partials in f32 in rank order. Bf16, f16 and f32 (no fp8). Device side:
//! [`devcomm_device::moe::ht`]; the handle's [`Handle::rank_positions`]
//! and [`Handle::recv_rows`] are its tables.
//!
//! With [`HtLayout::PerSource`] (DeepEP's high-throughput output) the
//! receiver does not pack: `recv_x [T; N·M × H]` holds each received token
//! once, row `s·M + p` the `p`-th token source `s` sent here
//! ([`Handle::recv_source_counts`] of them), with its top-k entries as
//! local expert indices ([`Handle::recv_topk_idx`], -1 for another rank's
//! expert) and weights ([`Handle::recv_topk_weights`]); `recv_count` still
//! counts tokens per local expert. `combine(rows [T; N·M × H])` then takes
//! one row per received token (this rank's experts' outputs for it,
//! already weighted and summed by the caller) and returns, for each
//! token, the rows of the ranks it went to added in f32 in rank order.
//!
//! With [`HtLayout::PerSourceInWindow`] the same tokens stay where they
//! landed, in the group's window ([`EpGroup::recv_rows`], a
//! [`WindowRows`] valid until the next dispatch; `recv_x` is empty): no
//! copy out, the dispatch ends when the last channel is in. The experts
//! may then write their output rows over them in place, and
//! [`EpGroup::combine_in_window`] adds them with no input buffer: ranks of
//! one LSA team read each other's rows where they are (NVLink loads after
//! a ready word per rank, nothing staged), ranks outside it get theirs by
//! GIN. [`EpGroup::combine`] takes rows from a buffer as with
//! [`HtLayout::PerSource`].

use crate::coll::{CollType, DataType, Fp8E4M3};
use crate::comm::Communicator;
use crate::dev_comm::{DevCommHandle, DevCommRequirements};
use crate::error::{Error, Result};
use crate::gin::GinConnectionType;
use crate::memory::SymmetricMemory;
use crate::runtime::{DeviceBuffer, HostMappedWord, LaunchConfig, RuntimeKind, Stream};
use crate::window::{Window, WindowFlags};
use devcomm_device::moe::{MoeArgs, MoeContext, CONTEXT_SHARED_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use devcomm_device::moe::NO_POS;

mod ht;
mod stages;

pub use ht::WindowRows;
pub use stages::{KernelStages, StageTimes};

mod sealed {
    pub trait Sealed {}
}

/// A token element type of an expert-parallel group: `f32`, `half::bf16`,
/// `half::f16`.
pub trait MoeType: CollType + sealed::Sealed {}
impl sealed::Sealed for f32 {}
impl MoeType for f32 {}
impl sealed::Sealed for half::bf16 {}
impl MoeType for half::bf16 {}
impl sealed::Sealed for half::f16 {}
impl MoeType for half::f16 {}

/// How tokens travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EpMode {
    /// DeepEP's low-latency mode: one kernel each way, fixed shapes; a
    /// token goes once to each LSA rank whose experts it names (into a
    /// token slot, with its expert ids; the receiver packs per local
    /// expert), and straight into per-(expert, source rank) slots of the
    /// ranks outside the LSA team.
    #[doc(alias = "low_latency_dispatch")]
    #[default]
    LowLatency,
    /// DeepEP's high-throughput ("normal") mode: each token crosses to a
    /// rank once however many of its experts live there, in bulk streams
    /// per (destination rank, channel) with a count word per channel
    /// exchanged by the GPUs; the receiver packs per local expert (the
    /// same output as [`EpMode::LowLatency`]); combine sends back one
    /// partial sum per (token, rank). See [`devcomm_device::moe::ht`].
    #[doc(alias = "intranode_dispatch")]
    #[doc(alias = "internode_dispatch")]
    HighThroughput,
}

/// How an [`EpGroup`] is built.
#[doc(alias = "ncclEpGroupConfig")]
#[derive(Clone, Debug)]
pub struct EpConfig {
    /// Experts in all (a multiple of the rank count).
    pub num_experts: usize,
    /// Elements per token.
    pub hidden: usize,
    /// Experts per token (1 to 32).
    pub top_k: usize,
    /// Most tokens one rank dispatches at once (DeepEP's
    /// `num_max_dispatch_tokens_per_rank`).
    #[doc(alias = "num_max_dispatch_tokens_per_rank")]
    pub max_tokens_per_rank: usize,
    /// Token element type: `F32`, `Bf16` or `F16`.
    pub dtype: DataType,
    /// The mode.
    pub mode: EpMode,
    /// Dispatch bf16 tokens as fp8 e4m3 with one f32 scale per 128
    /// elements (DeepEP's `use_fp8`; [`EpGroup::dispatch_fp8`]); needs
    /// `dtype` `Bf16` and `hidden` a multiple of 128. Combine stays bf16.
    #[doc(alias = "use_fp8")]
    pub fp8_dispatch: bool,
    /// CTAs per kernel (0: low-latency, one per expert — each sends whole
    /// tokens and experts and receives whole local experts —; high-throughput, one
    /// per SM, each item taken by a span of warps; both up to one per SM
    /// and 128 on GPUs; 2 on the emulated runtime). All must fit on the GPU
    /// at once (with the default 256 threads; the kernels' registers do not
    /// fit 384 or more threads per CTA on H200).
    pub ctas: u32,
    /// Threads per CTA, a multiple of 32 (0: 256 on GPUs, 64 on the emulated runtime).
    pub threads: u32,
    /// High-throughput mode: channels per destination rank, each a
    /// contiguous range of the tokens streamed by one span of warps (0: `512 /
    /// ranks` clamped to 1..=256 on GPUs, 2 on the emulated runtime; the
    /// same on every rank). Ignored in low-latency mode.
    #[doc(alias = "num_channels")]
    pub channels: u32,
    /// Record each kernel's stage times on the GPU ([`EpGroup::stage_times`]);
    /// off by default (each CTA then syncs at every stage).
    pub stage_stamps: bool,
    /// Low-latency mode: how the receiver packs its tokens (the same on
    /// every rank); [`LlPack::PerExpert`] by default, the faster of the two
    /// measured on 2 × H200.
    pub ll_pack: LlPack,
    /// Low-latency mode: what the combine sends back (the same on every
    /// rank); [`LlCombine::PerRank`] by default, the faster.
    pub ll_combine: LlCombine,
    /// High-throughput mode: how the dispatch leaves what it received (the
    /// same on every rank); [`HtLayout::PerExpert`] by default. Ignored in
    /// low-latency mode.
    pub ht_layout: HtLayout,
}

/// How a high-throughput dispatch lays out the tokens it received
/// ([`EpConfig::ht_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HtLayout {
    /// Packed per local expert, `recv_x [L × N·M × H]`, as in low-latency
    /// mode: a token is copied into every local expert it names;
    /// combine takes each expert's outputs and weighs them itself.
    #[default]
    PerExpert,
    /// DeepEP's high-throughput output: each received token once, `recv_x
    /// [N·M × H]` by (source rank, position), with its top-k entries as
    /// local expert indices and weights in the handle; combine takes one
    /// row per received token (the caller's experts already weighted and
    /// summed). No pack: each (source, channel) is copied out as soon as
    /// it is in, while the other channels still travel.
    #[doc(alias = "recv_topk_idx")]
    PerSource,
    /// As [`HtLayout::PerSource`], but the tokens stay where they landed,
    /// in the group's window: [`EpGroup::recv_rows`] is the `[N·M × H]`
    /// output, valid until the next dispatch (DeepEP's low-latency
    /// receive buffers work the same way), and [`Dispatched::recv_x`] is
    /// empty. No copy out of the window: the dispatch ends when the last
    /// channel has landed. Needs `hidden × element size` a multiple of 16
    /// bytes (a token a whole number of window slots).
    #[doc(alias = "zero_copy")]
    PerSourceInWindow,
}

/// How a low-latency dispatch packs the tokens it received from the LSA
/// team into per-expert rows ([`EpConfig::ll_pack`]).
///
/// Measured on 2 × H200 at 128 tokens × 7168 bf16, top-8 of 256
/// (`benches/results/2026-11-27-h200x2-moe-variants.md`): per expert 35.5
/// µs a dispatch, token-major 42.7.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LlPack {
    /// A CTA per local expert scans the token headers and copies each of
    /// its tokens into its rows (`devcomm_device::moe::dispatch_pack_expert`):
    /// no grid barrier, a token read once per expert it names.
    #[default]
    PerExpert,
    /// Every expert's rows counted first (`dispatch_count_expert`), a grid
    /// barrier, then each token read once and stored to all its rows
    /// (`dispatch_pack_token`).
    TokenMajor,
}

/// What a low-latency combine sends back to an LSA source
/// ([`EpConfig::ll_combine`]).
///
/// Measured as for [`LlPack`]: per rank 30.4 µs a combine, per expert
/// 50.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LlCombine {
    /// One partial sum per (token, LSA rank), over that rank's experts
    /// ([`CombineForm::PerRank`](devcomm_device::moe::CombineForm)): a
    /// quarter of the bytes at top-8 of 2 ranks; the result is rounded per
    /// rank (see the [module docs](self)).
    #[default]
    PerRank,
    /// Every (token, expert) output on its own
    /// ([`CombineForm::PerExpert`](devcomm_device::moe::CombineForm)),
    /// summed by the source in top-k order.
    PerExpert,
}

impl EpConfig {
    /// `num_experts` experts, tokens of `hidden` f32 elements, `top_k`
    /// experts each, at most `max_tokens_per_rank` per rank, low-latency.
    pub fn new(num_experts: usize, hidden: usize, top_k: usize, max_tokens_per_rank: usize) -> Self {
        EpConfig {
            num_experts,
            hidden,
            top_k,
            max_tokens_per_rank,
            dtype: DataType::F32,
            mode: EpMode::LowLatency,
            fp8_dispatch: false,
            ctas: 0,
            threads: 0,
            channels: 0,
            stage_stamps: false,
            ll_pack: LlPack::PerExpert,
            ll_combine: LlCombine::PerRank,
            ht_layout: HtLayout::PerExpert,
        }
    }

    /// The same in mode `mode`.
    pub fn with_mode(mut self, mode: EpMode) -> Self {
        self.mode = mode;
        self
    }

    /// The same with element type `dtype`.
    pub fn with_dtype(mut self, dtype: DataType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The same with fp8 dispatch of bf16 tokens (sets `dtype` to `Bf16`).
    pub fn with_fp8_dispatch(mut self) -> Self {
        self.dtype = DataType::Bf16;
        self.fp8_dispatch = true;
        self
    }
}

/// What [`EpGroup::combine`] needs from its dispatch: where each token's
/// top-k entries went, and the routing (copied by the dispatch kernel).
#[doc(alias = "ncclEpHandle")]
pub struct Handle {
    group: u64,
    seq: u32,
    num_tokens: usize,
    pos: DeviceBuffer<u32>,
    idx: DeviceBuffer<i32>,
    weights: DeviceBuffer<f32>,
    /// High-throughput mode: its tables (see `MoeHtArgs`).
    ht: Option<ht::HtTables>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("seq", &self.seq).field("num_tokens", &self.num_tokens).finish()
    }
}

impl Handle {
    /// Tokens of the dispatch on this rank.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// The dispatch's sequence number (the `seq` the device functions take).
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// `u32 [max_tokens][top_k]`: the position of each top-k entry in its
    /// expert's combine slots ([`NO_POS`] for none), for device code.
    pub fn positions(&self) -> &DeviceBuffer<u32> {
        &self.pos
    }

    /// The dispatch's `topk_idx`, copied.
    pub fn topk_idx(&self) -> &DeviceBuffer<i32> {
        &self.idx
    }

    /// The dispatch's `topk_weights`, copied.
    pub fn topk_weights(&self) -> &DeviceBuffer<f32> {
        &self.weights
    }
}

/// What a dispatch returns (see the [module docs](self) for shapes).
#[derive(Debug)]
pub struct Dispatched<T: MoeType> {
    /// The received tokens, packed per local expert: `[L][N·M][hidden]`;
    /// per source (`HtLayout::PerSource`): `[N·M][hidden]`; empty with
    /// [`HtLayout::PerSourceInWindow`] (the tokens are in [`EpGroup::recv_rows`]).
    #[doc(alias = "packed_recv_x")]
    pub recv_x: DeviceBuffer<T>,
    /// Tokens received per local expert: `[L]`.
    #[doc(alias = "packed_recv_count")]
    pub recv_count: DeviceBuffer<u32>,
    /// For [`EpGroup::combine`].
    pub handle: Handle,
}

/// What an fp8 dispatch returns ([`EpGroup::dispatch_fp8`]): as
/// [`Dispatched`], the tokens as fp8 e4m3 with their scales
/// (`x ≈ recv_x[r][i] * recv_scales[r][i / 128]`).
#[derive(Debug)]
pub struct DispatchedFp8 {
    /// The received tokens, fp8 e4m3, packed per local expert: `[L][N·M][hidden]`.
    #[doc(alias = "packed_recv_x")]
    pub recv_x: DeviceBuffer<Fp8E4M3>,
    /// Each received token's scales, one per 128 elements: `[L][N·M][hidden / 128]`.
    pub recv_scales: DeviceBuffer<f32>,
    /// Tokens received per local expert: `[L]`.
    #[doc(alias = "packed_recv_count")]
    pub recv_count: DeviceBuffer<u32>,
    /// For [`EpGroup::combine`] (bf16 expert outputs).
    pub handle: Handle,
}

static NEXT_GROUP: AtomicU64 = AtomicU64::new(1);

struct State {
    /// Dispatches so far.
    seq: u32,
    /// The dispatch whose combine has not been queued yet.
    pending: Option<u32>,
}

/// An expert-parallel group (see the [module docs](self)).
#[doc(alias = "ncclEpGroup")]
#[doc(alias = "Buffer")]
pub struct EpGroup<'c> {
    comm: &'c Communicator,
    // Dropped in this order: the device communicator, the window, its memory.
    handle: DevCommHandle<'c>,
    window: Window<'c>,
    mem: SymmetricMemory,
    ctx: MoeContext,
    config: EpConfig,
    ctas: u32,
    threads: u32,
    id: u64,
    state: Mutex<State>,
    error: HostMappedWord,
    stamps: Option<DeviceBuffer<u64>>,
    /// `u32 [ctas]`: the kernels' sequence words (`MoeArgs::seq_words`).
    seq_words: DeviceBuffer<u32>,
}

impl std::fmt::Debug for EpGroup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpGroup").field("rank", &self.comm.rank()).field("config", &self.config).finish()
    }
}

impl<'c> EpGroup<'c> {
    /// How the MoE kernels are launched: co-resident (their CTAs wait for
    /// other ranks' CTAs), each CTA with [`CONTEXT_SHARED_BYTES`] of dynamic
    /// shared memory, where its leader keeps the context for the others.
    fn launch_config(&self) -> LaunchConfig {
        LaunchConfig::new(self.ctas, self.threads).with_shared_mem(CONTEXT_SHARED_BYTES).co_resident()
    }

    /// Makes the group: a window for the slots and counts (allocated once)
    /// and a device communicator (with GIN when some ranks are outside
    /// this rank's LSA team). Collective: every rank calls it with the
    /// same config.
    ///
    /// Errors: [`Error::InvalidArgument`] for a config out of range (zero
    /// sizes, experts not a multiple of the rank count, top-k above 32, a
    /// datatype other than f32/bf16/f16, a window too large, fp8 dispatch
    /// in high-throughput mode, more than 256 channels); those of
    /// [`Communicator::create_dev_comm`] and
    /// [`Communicator::register_window`].
    #[doc(alias = "ncclEpCreateGroup")]
    pub fn new(comm: &'c Communicator, config: &EpConfig) -> Result<EpGroup<'c>> {
        let n = comm.count();
        let c = config;
        if c.num_experts == 0 || c.hidden == 0 || c.top_k == 0 || c.max_tokens_per_rank == 0 {
            return Err(Error::invalid_argument(format!(
                "EpConfig: num_experts {}, hidden {}, top_k {} and max_tokens_per_rank {} must all be non-zero",
                c.num_experts, c.hidden, c.top_k, c.max_tokens_per_rank
            )));
        }
        if c.num_experts % n != 0 {
            return Err(Error::invalid_argument(format!(
                "EpConfig: {} experts do not spread evenly over {n} ranks (use a multiple of {n})",
                c.num_experts
            )));
        }
        if c.top_k > 32 {
            return Err(Error::invalid_argument(format!("EpConfig: top_k {} above 32", c.top_k)));
        }
        if !matches!(c.dtype, DataType::F32 | DataType::Bf16 | DataType::F16) {
            return Err(Error::invalid_argument(format!(
                "EpConfig: dtype {:?}; MoE groups take F32, Bf16 or F16 tokens",
                c.dtype
            )));
        }
        if c.fp8_dispatch && c.mode == EpMode::HighThroughput {
            return Err(Error::invalid_argument(
                "EpConfig: fp8 dispatch is a low-latency feature (mode HighThroughput sends the tokens' own type)",
            ));
        }
        if c.channels > 256 {
            return Err(Error::invalid_argument(format!("EpConfig: channels {} above 256", c.channels)));
        }
        if c.fp8_dispatch && (c.dtype != DataType::Bf16 || c.hidden % 128 != 0) {
            return Err(Error::invalid_argument(format!(
                "EpConfig: fp8 dispatch takes bf16 tokens of a multiple of 128 elements (here {:?}, hidden {})",
                c.dtype, c.hidden
            )));
        }
        if c.mode == EpMode::HighThroughput
            && c.ht_layout == HtLayout::PerSourceInWindow
            && (c.hidden * c.dtype.size()) % 16 != 0
        {
            return Err(Error::invalid_argument(format!(
                "EpConfig: HtLayout::PerSourceInWindow needs tokens of a multiple of 16 bytes (hidden {} × {} bytes)",
                c.hidden,
                c.dtype.size()
            )));
        }
        let to_u32 = |v: usize, what: &str| {
            u32::try_from(v).map_err(|_| Error::invalid_argument(format!("EpConfig: {what} {v} above u32::MAX")))
        };
        let (e, h, k, m) = (
            to_u32(c.num_experts, "num_experts")?,
            to_u32(c.hidden, "hidden")?,
            to_u32(c.top_k, "top_k")?,
            to_u32(c.max_tokens_per_rank, "max_tokens_per_rank")?,
        );
        if c.threads > 1024 || c.threads % 32 != 0 {
            return Err(Error::invalid_argument(format!(
                "EpConfig: threads {} not a multiple of 32 up to 1024",
                c.threads
            )));
        }
        if c.ctas > 1024 {
            return Err(Error::invalid_argument(format!("EpConfig: ctas {} above 1024", c.ctas)));
        }
        let esize = c.dtype.size() as u64;
        let slot = (h as u64 * esize).div_ceil(16) * 16;
        let channels = ht::channels(c, comm.device().kind(), n);
        let bytes = match c.mode {
            EpMode::LowLatency => MoeContext::window_bytes(n as u32, e, k, m, slot),
            EpMode::HighThroughput => MoeContext::window_bytes_ht(n as u32, k, m, slot, channels),
        };
        let bytes = bytes
            .filter(|&b| b <= (1u64 << 40))
            .ok_or_else(|| Error::invalid_argument("EpConfig: the group's window would exceed 1 TiB"))?;
        let mem = comm.mem_alloc(bytes as usize)?;
        let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
        let lsa = comm.lsa_size()?;
        let mut req = DevCommRequirements::new();
        if lsa < n {
            req.gin_connection_type = GinConnectionType::Full;
            req.gin_signal_count = e / n as u32 + 1;
            req.use_window(&window);
        }
        let handle = comm.create_dev_comm(&req)?;
        // SAFETY: the device communicator is this group's own (GIN with
        // `L + 1` signals, the window in its table, when some rank is
        // outside the LSA team); the window was registered over `bytes` =
        // `window_bytes` bytes on every rank, used by nothing else, and its
        // words are zeroed below on every rank before the barrier that
        // precedes any use; `num_experts` a non-zero multiple of the rank
        // count, `top_k <= 32`, element size 2 or 4 (all checked above).
        let ctx = match c.mode {
            // SAFETY: as said.
            // SAFETY: as said.
            EpMode::LowLatency => unsafe {
                MoeContext::new(handle.dev_comm(), window.desc(), e, h, k, m, esize as u32)
            },
            // SAFETY: as above (2 signals at least: `L + 1 >= 2`), the
            // window of `window_bytes_ht` bytes, `channels` non-zero and
            // the same on every rank (from the config and the runtime kind).
            EpMode::HighThroughput => unsafe {
                MoeContext::new_high_throughput(handle.dev_comm(), window.desc(), e, h, k, m, esize as u32, channels)
            },
        };
        // SAFETY: bf16 tokens of a multiple of 128 elements (checked above),
        // the same config on every rank (the collective contract).
        let ctx = if c.fp8_dispatch { unsafe { ctx.with_fp8_dispatch() } } else { ctx };
        let ctx = if c.mode == EpMode::HighThroughput {
            if matches!(c.ht_layout, HtLayout::PerSource | HtLayout::PerSourceInWindow) {
                ctx.with_ht_per_source()
            } else {
                ctx
            }
        } else {
            let pack = if c.ll_pack == LlPack::PerExpert { MoeContext::PACK_PER_EXPERT } else { 0 };
            let comb = if c.ll_combine == LlCombine::PerExpert { MoeContext::COMBINE_PER_EXPERT } else { 0 };
            ctx.with_ll_variants(pack | comb)
        };
        // The slots need no zeroing; the count and flag words do (a stale
        // word could carry the next sequence number).
        let words = match c.mode {
            EpMode::LowLatency => ctx.recv_count_offset(0, 0) as usize,
            EpMode::HighThroughput => ctx.ht_dispatch_word_offset(0, 0) as usize,
        };
        let stream = comm.device().stream();
        window.write(stream, words, &vec![0u8; bytes as usize - words])?;
        stream.synchronize()?;
        comm.bootstrap_barrier()?;
        let (ctas, threads) = match comm.device().kind() {
            // Low-latency: a CTA per expert (up to one per SM: the launch
            // is co-resident); high-throughput: a warp per send item.
            RuntimeKind::Cuda => {
                let threads = if c.threads == 0 { 256 } else { c.threads };
                let ctas = if c.ctas != 0 {
                    c.ctas
                } else if c.mode == EpMode::HighThroughput {
                    ht::default_ctas(comm.device().multiprocessor_count())
                } else {
                    e.min(comm.device().multiprocessor_count()).clamp(1, 128)
                };
                (ctas, threads)
            }
            RuntimeKind::Emulated => {
                (if c.ctas == 0 { 2 } else { c.ctas }, if c.threads == 0 { 64 } else { c.threads })
            }
        };
        let error = HostMappedWord::new(comm.device())?;
        let stamps = stages::alloc(c, comm.device(), ctas)?;
        // Each CTA's last combined sequence number (`MoeArgs::seq_words`).
        let seq_words = comm.device().alloc_from(&vec![0u32; ctas as usize])?;
        Ok(EpGroup {
            comm,
            handle,
            window,
            mem,
            ctx,
            config: c.clone(),
            ctas,
            threads,
            id: NEXT_GROUP.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State { seq: 0, pending: None }),
            error,
            stamps,
            seq_words,
        })
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The config.
    pub fn config(&self) -> &EpConfig {
        &self.config
    }

    /// Experts on each rank (`L`).
    pub fn local_experts(&self) -> usize {
        self.config.num_experts / self.comm.count()
    }

    /// The context kernels of your own pass to [`devcomm_device::moe`]'s
    /// functions. It shares the window with this group's host calls: do
    /// not run both at once, and number your dispatches with
    /// [`EpGroup::reserve_seq`]. A high-throughput group's context is for
    /// [`devcomm_device::moe::ht`]'s functions only (its window has the
    /// high-throughput layout).
    pub fn context(&self) -> MoeContext {
        self.ctx
    }

    /// The device communicator behind the context.
    pub fn dev_comm(&self) -> &DevCommHandle<'c> {
        &self.handle
    }

    /// The group's window (slots and count words, see [`MoeContext`]).
    pub fn window(&self) -> &Window<'c> {
        &self.window
    }

    /// A sequence number for a dispatch (and its combine) that a kernel of
    /// your own runs with [`EpGroup::context`]: every rank gets the same
    /// numbers when it makes the same calls. The library's own kernels
    /// also count on the device (`MoeArgs::seq_words`), so CUDA-graph
    /// replays of a captured dispatch and combine number themselves; after
    /// such replays this host count is behind the device's, so do not mix
    /// graph replays with kernels of your own on one group.
    ///
    /// Errors: [`Error::InvalidUsage`] when a host dispatch's combine is
    /// still to come, or after `u32::MAX` dispatches.
    pub fn reserve_seq(&self) -> Result<u32> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        Self::no_pending(&st)?;
        st.seq = st
            .seq
            .checked_add(1)
            .ok_or_else(|| Error::invalid_usage("u32::MAX dispatches on one EpGroup: make a new group"))?;
        Ok(st.seq)
    }

    /// `InvalidUsage` while a host dispatch's combine is still to come.
    fn no_pending(st: &State) -> Result<()> {
        match st.pending {
            Some(s) => Err(Error::invalid_usage(format!(
                "dispatch {s}'s combine has not been queued: each dispatch needs its combine before the next"
            ))),
            None => Ok(()),
        }
    }

    /// What a dispatch checks before it allocates its outputs (a refused
    /// call allocates and frees nothing).
    fn check_dispatch_usage(&self) -> Result<()> {
        Self::no_pending(&self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The failure a kernel of this group reported, if any (kept until the
    /// group is dropped: the slots' state is unknown after it).
    pub fn error(&self) -> Option<Error> {
        Error::from_device_code(self.error.get(), "an MoE dispatch/combine")
    }

    /// Waits for `stream`, then returns the first failure a kernel reported.
    /// A timeout's message says which of this rank's waits fell short (see
    /// [`EpGroup::wait_state`]).
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        stream.synchronize()?;
        self.reported(stream)
    }

    /// [`EpGroup::error`] as a result; a timeout or an abort with
    /// [`EpGroup::wait_state`] in its message (read on `stream`).
    fn reported(&self, stream: &Stream) -> Result<()> {
        match self.error() {
            None => Ok(()),
            Some(Error::Timeout(m)) => Err(Error::Timeout(self.with_wait_state(m, stream))),
            Some(Error::RemoteError(m)) => Err(Error::RemoteError(self.with_wait_state(m, stream))),
            Some(e) => Err(e),
        }
    }

    fn with_wait_state(&self, m: String, stream: &Stream) -> String {
        match self.wait_state(stream) {
            Ok(state) => format!("{m}; {state}"),
            Err(e) => format!("{m} (its wait state could not be read: {e})"),
        }
    }

    /// What this rank's dispatch and combine waits see now, for the last
    /// dispatch `seq`. High-throughput mode: each rank's per-channel
    /// dispatch and combine words (`seq:count`) and, over GIN, the two
    /// counting signals against `seq × outside ranks × channels`.
    /// Low-latency mode: per local expert, each source's count word (`seq:count`,
    /// written by the source's dispatch) and, over GIN, the expert's signal
    /// against the `seq × (ranks outside the LSA team)` its wait needs; per
    /// expert, its combine flag word, and over GIN the combine signal
    /// against `seq × outside ranks × local experts`; and where the GIN
    /// rings stand (tickets posted and completed). Reads device memory on
    /// `stream` (after the kernels queued on it): meant for a stalled or
    /// timed-out group.
    pub fn wait_state(&self, stream: &Stream) -> Result<String> {
        use std::fmt::Write;
        let seq = self.state.lock().unwrap_or_else(|p| p.into_inner()).seq as u64;
        let (n, l) = (self.comm.count(), self.local_experts());
        let outside = (n - self.comm.lsa_size()?) as u64;
        let word = |w: &u64| format!("{}:{}", w >> 32, *w as u32);
        let signal = |id: usize, want: u64| -> Result<String> {
            Ok(if outside > 0 {
                format!(" signal {}/{want}", self.handle.read_gin_signal(id as u32)?)
            } else {
                String::new()
            })
        };
        let mut s = format!("rank {} at dispatch {seq}:", self.comm.rank());
        if self.config.mode == EpMode::HighThroughput {
            // Per source rank (dispatch) and destination rank (combine), one
            // word per channel; one counting signal each way (see `moe::ht`).
            let g = self.ctx.channels() as usize;
            let mut words = vec![0u64; n * g];
            let mut part = |what: &str, off: u64, id: usize| -> Result<()> {
                self.window.read(stream, off as usize, &mut words)?;
                let per_rank: Vec<String> =
                    words.chunks(g).map(|c| c.iter().map(word).collect::<Vec<_>>().join(",")).collect();
                let _ = write!(s, " {what} words [{}]{};", per_rank.join(" "), signal(id, seq * outside * g as u64)?);
                Ok(())
            };
            part(
                "dispatch",
                self.ctx.ht_dispatch_word_offset(0, 0),
                devcomm_device::moe::ht::DISPATCH_SIGNAL as usize,
            )?;
            part("combine", self.ctx.ht_combine_word_offset(0, 0), devcomm_device::moe::ht::COMBINE_SIGNAL as usize)?;
        } else {
            let mut words = vec![0u64; l * n + self.config.num_experts];
            self.window.read(stream, self.ctx.recv_count_offset(0, 0) as usize, &mut words)?;
            for x in 0..l {
                let counts: Vec<String> = words[x * n..(x + 1) * n].iter().map(word).collect();
                let _ = write!(s, " expert {x} counts [{}]{};", counts.join(" "), signal(x, seq * outside)?);
            }
            let flags: Vec<String> = words[l * n..].iter().map(word).collect();
            let _ = write!(s, " combine flags [{}]{}", flags.join(" "), signal(l, seq * outside * l as u64)?);
        }
        if let Some(p) = self.handle.gin_progress() {
            let _ = write!(s, "; GIN {}", p?);
        }
        Ok(s)
    }

    /// Buffers for [`EpGroup::dispatch_into`], reusable across dispatches.
    pub fn alloc_output<T: MoeType>(&self) -> Result<Dispatched<T>> {
        self.check_type::<T>()?;
        let dev = self.comm.device();
        let l = self.local_experts();
        Ok(Dispatched {
            recv_x: dev.alloc::<T>(self.recv_x_len())?,
            recv_count: dev.alloc::<u32>(l)?,
            handle: self.alloc_handle()?,
        })
    }

    /// Buffers for [`EpGroup::dispatch_fp8_into`], reusable across dispatches.
    pub fn alloc_output_fp8(&self) -> Result<DispatchedFp8> {
        let dev = self.comm.device();
        let rows = self.local_experts() * self.comm.count() * self.config.max_tokens_per_rank;
        Ok(DispatchedFp8 {
            recv_x: dev.alloc::<Fp8E4M3>(rows * self.config.hidden)?,
            recv_scales: dev.alloc::<f32>(rows * (self.config.hidden / 128))?,
            recv_count: dev.alloc::<u32>(self.local_experts())?,
            handle: self.alloc_handle()?,
        })
    }

    fn alloc_handle(&self) -> Result<Handle> {
        let dev = self.comm.device();
        let mk = self.config.max_tokens_per_rank * self.config.top_k;
        Ok(Handle {
            group: self.id,
            seq: 0,
            num_tokens: 0,
            pos: dev.alloc::<u32>(mk)?,
            idx: dev.alloc::<i32>(mk)?,
            weights: dev.alloc::<f32>(mk)?,
            ht: self.alloc_ht_handle()?,
        })
    }

    /// Sends each token of `x` to its top-k experts (see the [module
    /// docs](self)); returns the received tokens packed per local expert,
    /// their counts, and the handle for [`EpGroup::combine`]. Collective:
    /// every rank calls it (with its own token count, maybe 0).
    ///
    /// Errors ([`Error::InvalidArgument`], before anything is sent): more
    /// tokens than `max_tokens_per_rank`, `x` not a whole number of
    /// tokens, `topk_idx`/`topk_weights` not `tokens × top_k`, a type
    /// other than the config's, buffers on another device;
    /// [`Error::InvalidUsage`] when the previous dispatch's combine has
    /// not been queued; a failure an earlier kernel reported. An expert id
    /// not below `num_experts` is reported by the kernel (that entry is
    /// not sent) and returned by the next call.
    #[doc(alias = "low_latency_dispatch")]
    #[doc(alias = "ncclEpDispatch")]
    pub fn dispatch<T: MoeType>(
        &self,
        x: &DeviceBuffer<T>,
        topk_idx: &DeviceBuffer<i32>,
        topk_weights: &DeviceBuffer<f32>,
        stream: &Stream,
    ) -> Result<Dispatched<T>> {
        self.check_dispatch(x, topk_idx, topk_weights)?;
        self.check_dispatch_usage()?;
        let mut out = self.alloc_output::<T>()?;
        self.dispatch_into(x, topk_idx, topk_weights, &mut out, stream)?;
        Ok(out)
    }

    /// [`EpGroup::dispatch`] into buffers of [`EpGroup::alloc_output`]
    /// (no allocation: the fixed-shape path for benchmarks and layers run again and again).
    ///
    /// Errors as [`EpGroup::dispatch`], and [`Error::InvalidArgument`] for
    /// outputs of another group or shape.
    pub fn dispatch_into<T: MoeType>(
        &self,
        x: &DeviceBuffer<T>,
        topk_idx: &DeviceBuffer<i32>,
        topk_weights: &DeviceBuffer<f32>,
        out: &mut Dispatched<T>,
        stream: &Stream,
    ) -> Result<()> {
        if self.config.fp8_dispatch {
            return Err(Error::invalid_usage("this group dispatches fp8 (EpConfig::fp8_dispatch): use dispatch_fp8"));
        }
        let tokens = self.check_dispatch(x, topk_idx, topk_weights)?;
        if out.recv_x.len() != self.recv_x_len() || out.recv_count.len() != self.local_experts() {
            return Err(Error::invalid_argument("dispatch_into: the output was not made by this group's alloc_output"));
        }
        self.check_device("dispatch_into recv_x", out.recv_x.device().ordinal())?;
        self.check_device("dispatch_into recv_count", out.recv_count.device().ordinal())?;
        if self.per_source() {
            // The per-source receive adds to the counts (atomically).
            stream.memset(&mut out.recv_count, 0)?;
        }
        let o = if self.in_window() { self.window_rows_addr() } else { out.recv_x.device_addr() };
        let c = out.recv_count.device_addr();
        self.launch_dispatch(x.device_addr(), tokens, topk_idx, topk_weights, o, 0, c, &mut out.handle, stream)
    }

    /// Sends each bf16 token of `x` to its top-k experts as fp8 e4m3 with
    /// one f32 scale per 128 elements (`scale = max(amax, 1e-4) / 448`,
    /// `q = fp8(x / scale)`), on a group made with
    /// [`EpConfig::fp8_dispatch`]; otherwise as [`EpGroup::dispatch`].
    /// Combine takes bf16 outputs, as without fp8.
    ///
    /// Errors as [`EpGroup::dispatch`]; [`Error::InvalidUsage`] on a group
    /// without fp8 dispatch.
    #[doc(alias = "low_latency_dispatch")]
    pub fn dispatch_fp8(
        &self,
        x: &DeviceBuffer<half::bf16>,
        topk_idx: &DeviceBuffer<i32>,
        topk_weights: &DeviceBuffer<f32>,
        stream: &Stream,
    ) -> Result<DispatchedFp8> {
        if !self.config.fp8_dispatch {
            return Err(Error::invalid_usage("dispatch_fp8 on a group made without EpConfig::fp8_dispatch"));
        }
        self.check_dispatch(x, topk_idx, topk_weights)?;
        self.check_dispatch_usage()?;
        let mut out = self.alloc_output_fp8()?;
        self.dispatch_fp8_into(x, topk_idx, topk_weights, &mut out, stream)?;
        Ok(out)
    }

    /// [`EpGroup::dispatch_fp8`] into buffers of [`EpGroup::alloc_output_fp8`].
    ///
    /// Errors as [`EpGroup::dispatch_fp8`], and [`Error::InvalidArgument`]
    /// for outputs of another group or shape.
    pub fn dispatch_fp8_into(
        &self,
        x: &DeviceBuffer<half::bf16>,
        topk_idx: &DeviceBuffer<i32>,
        topk_weights: &DeviceBuffer<f32>,
        out: &mut DispatchedFp8,
        stream: &Stream,
    ) -> Result<()> {
        if !self.config.fp8_dispatch {
            return Err(Error::invalid_usage("dispatch_fp8 on a group made without EpConfig::fp8_dispatch"));
        }
        let tokens = self.check_dispatch(x, topk_idx, topk_weights)?;
        let rows = self.local_experts() * self.comm.count() * self.config.max_tokens_per_rank;
        if out.recv_x.len() != rows * self.config.hidden
            || out.recv_scales.len() != rows * (self.config.hidden / 128)
            || out.recv_count.len() != self.local_experts()
        {
            return Err(Error::invalid_argument(
                "dispatch_fp8_into: the output was not made by this group's alloc_output_fp8",
            ));
        }
        self.check_device("dispatch_fp8_into recv_x", out.recv_x.device().ordinal())?;
        self.check_device("dispatch_fp8_into recv_scales", out.recv_scales.device().ordinal())?;
        self.check_device("dispatch_fp8_into recv_count", out.recv_count.device().ordinal())?;
        let (o, sc, c) = (out.recv_x.device_addr(), out.recv_scales.device_addr(), out.recv_count.device_addr());
        self.launch_dispatch(x.device_addr(), tokens, topk_idx, topk_weights, o, sc, c, &mut out.handle, stream)
    }

    /// Queues the dispatch kernel (inputs checked by the callers).
    #[allow(clippy::too_many_arguments)]
    fn launch_dispatch(
        &self,
        x: u64,
        tokens: usize,
        topk_idx: &DeviceBuffer<i32>,
        topk_weights: &DeviceBuffer<f32>,
        out: u64,
        scales: u64,
        counts: u64,
        handle: &mut Handle,
        stream: &Stream,
    ) -> Result<()> {
        let mk = self.config.max_tokens_per_rank * self.config.top_k;
        if handle.group != self.id || handle.pos.len() != mk || handle.idx.len() != mk || handle.weights.len() != mk {
            return Err(Error::invalid_argument("dispatch: the output's handle was not made by this group"));
        }
        self.reported(stream)?;
        let seq = self.reserve_seq()?;
        let args = MoeArgs {
            ctx: self.ctx,
            x,
            topk_idx: topk_idx.device_addr(),
            topk_weights: topk_weights.device_addr(),
            out,
            counts,
            scales,
            pos: handle.pos.device_addr(),
            handle_idx: handle.idx.device_addr(),
            handle_weights: handle.weights.device_addr(),
            errors: self.error.device_addr(),
            stamps: self.stamps_addr(stages::Kernel::Dispatch),
            seq_words: self.seq_words.device_addr(),
            num_tokens: tokens as u32,
            seq,
        };
        if self.config.mode == EpMode::HighThroughput {
            self.launch_ht_dispatch(args, handle, stream)?;
            self.dispatched(seq, tokens, handle);
            return Ok(());
        }
        let cfg = self.launch_config();
        // The single-node case (every rank in the LSA team, no fp8, the
        // default pack and combine) takes the kernel compiled for it alone.
        // SAFETY: `args` holds this group's live context and buffers of the
        // sizes the kernel needs (checked by the callers: `x` of `tokens <=
        // M` tokens, routing of `tokens * K`, outputs of the group's shapes,
        // scales with fp8 dispatch, the handle's buffers of `M * K`), kept
        // alive by the callers' borrows while queued (freeing device memory
        // waits for the device); the same dispatch on every rank (the
        // collective contract); co-resident, threads a multiple of 32; the
        // lean kernel only for a group it serves.
        unsafe {
            if devcomm_kernels::moe::lsa_dispatch_serves(&self.ctx) {
                stream.launch::<devcomm_kernels::moe::moe_dispatch_lsa>(cfg, (args,))
            } else {
                stream.launch::<devcomm_kernels::moe::moe_dispatch>(cfg, (args,))
            }
        }?;
        self.dispatched(seq, tokens, handle);
        Ok(())
    }

    /// Records dispatch `seq` of `tokens` tokens as queued (its combine pending).
    fn dispatched(&self, seq: u32, tokens: usize, handle: &mut Handle) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pending = Some(seq);
        drop(st);
        handle.seq = seq;
        handle.num_tokens = tokens;
    }

    /// Brings the experts' outputs back: `expert_out` holds, for each local
    /// expert, one output row per received token, laid out as
    /// [`Dispatched::recv_x`]; returns `y [tokens × hidden]` on each rank
    /// (see the [module docs](self)). Collective.
    ///
    /// Errors: [`Error::InvalidArgument`] for `expert_out` of another
    /// shape or type, a handle of another group or not of the latest
    /// dispatch; [`Error::InvalidUsage`] for a dispatch already combined;
    /// a failure an earlier kernel reported.
    #[doc(alias = "low_latency_combine")]
    #[doc(alias = "ncclEpCombine")]
    pub fn combine<T: MoeType>(
        &self,
        expert_out: &DeviceBuffer<T>,
        handle: &Handle,
        stream: &Stream,
    ) -> Result<DeviceBuffer<T>> {
        self.check_combine(expert_out, handle)?;
        let mut y = self.comm.device().alloc::<T>(handle.num_tokens * self.config.hidden)?;
        self.launch_combine(expert_out.device_addr(), handle, &mut y, stream, false)?;
        Ok(y)
    }

    /// [`EpGroup::combine`] into `y` (`tokens × hidden` elements).
    ///
    /// Errors as [`EpGroup::combine`], and [`Error::InvalidArgument`] for
    /// `y` of another length.
    pub fn combine_into<T: MoeType>(
        &self,
        expert_out: &DeviceBuffer<T>,
        handle: &Handle,
        y: &mut DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        self.check_combine(expert_out, handle)?;
        self.launch_combine(expert_out.device_addr(), handle, y, stream, false)
    }

    /// The combine of [`HtLayout::PerSourceInWindow`] with no input
    /// buffer: the caller has overwritten [`EpGroup::recv_rows`] in place,
    /// each received token's row with this rank's output for it (its local
    /// experts' outputs, weighted and summed, as [`EpGroup::combine`]'s
    /// rows); returns `y [tokens × hidden]` as [`EpGroup::combine`] does.
    /// Ranks in one LSA team read each other's rows where they are (NVLink
    /// loads, no copies, no staging); rows for ranks outside it are put by
    /// GIN. Collective: every rank of the group calls it for the dispatch.
    ///
    /// Errors: [`Error::InvalidUsage`] on a group of another layout, and
    /// as [`EpGroup::combine`].
    ///
    /// ```
    /// use devcomm::moe::{EpConfig, EpGroup, EpMode, HtLayout};
    /// use devcomm::prelude::*;
    ///
    /// let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
    /// std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|comm| {
    ///             s.spawn(move || -> devcomm::Result<()> {
    ///                 let mut cfg = EpConfig::new(4, 8, 2, 3).with_mode(EpMode::HighThroughput);
    ///                 cfg.ht_layout = HtLayout::PerSourceInWindow;
    ///                 let ep = EpGroup::new(comm, &cfg)?;
    ///                 let (dev, stream) = (comm.device(), comm.device().stream());
    ///                 let x = dev.alloc_from(&[1.0f32; 2 * 8])?; // 2 tokens
    ///                 let idx = dev.alloc_from(&[0i32, 3, 1, 2])?; // each to both ranks
    ///                 let w = dev.alloc_from(&[0.5f32, 0.25, 1.0, 2.0])?;
    ///                 let d = ep.dispatch(&x, &idx, &w, stream)?;
    ///                 // The experts would overwrite these rows in place; left as
    ///                 // they arrived, each rank gives every token back as it came.
    ///                 let rows = ep.recv_rows::<f32>()?;
    ///                 assert_eq!(rows.read_vec(stream)?[..2 * 8], [1.0f32; 2 * 8]);
    ///                 let y = ep.combine_in_window::<f32>(&d.handle, stream)?;
    ///                 assert_eq!(stream.read_vec(&y)?, [2.0f32; 2 * 8]);
    ///                 ep.synchronize(stream)
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().try_for_each(|r| r.join().expect("a rank panicked"))
    /// })?;
    /// # Ok::<(), devcomm::Error>(())
    /// ```
    #[doc(alias = "combine")]
    pub fn combine_in_window<T: MoeType>(&self, handle: &Handle, stream: &Stream) -> Result<DeviceBuffer<T>> {
        self.check_in_window_combine::<T>(handle)?;
        let mut y = self.comm.device().alloc::<T>(handle.num_tokens * self.config.hidden)?;
        self.launch_combine(self.window_rows_addr(), handle, &mut y, stream, true)?;
        Ok(y)
    }

    /// [`EpGroup::combine_in_window`] into `y` (`tokens × hidden` elements).
    ///
    /// Errors as [`EpGroup::combine_in_window`], and [`Error::InvalidArgument`]
    /// for `y` of another length.
    pub fn combine_in_window_into<T: MoeType>(
        &self,
        handle: &Handle,
        y: &mut DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        self.check_in_window_combine::<T>(handle)?;
        self.launch_combine(self.window_rows_addr(), handle, y, stream, true)
    }

    /// What [`EpGroup::combine_in_window`] checks before anything else: the
    /// layout, the type, the handle's group and that its dispatch awaits its combine.
    fn check_in_window_combine<T: MoeType>(&self, handle: &Handle) -> Result<()> {
        if !self.in_window() {
            return Err(Error::invalid_usage(
                "combine_in_window: the group's layout is not HtLayout::PerSourceInWindow (use combine)",
            ));
        }
        self.check_type::<T>()?;
        self.check_handle("combine_in_window", handle)
    }

    /// [`EpGroup::combine_into`] after [`EpGroup::check_combine`] (and the
    /// in-window combine after its check; `in_window`: `expert_out` is the
    /// window rows): checks `y`, takes the pending dispatch (checked again
    /// under the lock) and queues the kernel.
    fn launch_combine<T: MoeType>(
        &self,
        expert_out: u64,
        handle: &Handle,
        y: &mut DeviceBuffer<T>,
        stream: &Stream,
        in_window: bool,
    ) -> Result<()> {
        let h = self.config.hidden;
        if y.len() != handle.num_tokens * h {
            return Err(Error::invalid_argument(format!(
                "combine: the output holds {} elements, the dispatch's {} tokens × {h} = {}",
                y.len(),
                handle.num_tokens,
                handle.num_tokens * h
            )));
        }
        self.check_device("combine output", y.device().ordinal())?;
        self.reported(stream)?;
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            Self::awaits_combine(&st, handle.seq)?;
            st.pending = None;
        }
        let args = MoeArgs {
            ctx: self.ctx,
            x: expert_out,
            topk_idx: handle.idx.device_addr(),
            topk_weights: handle.weights.device_addr(),
            out: y.device_addr(),
            counts: 0,
            scales: 0,
            pos: handle.pos.device_addr(),
            handle_idx: 0,
            handle_weights: 0,
            errors: self.error.device_addr(),
            stamps: self.stamps_addr(stages::Kernel::Combine),
            seq_words: self.seq_words.device_addr(),
            num_tokens: handle.num_tokens as u32,
            seq: handle.seq,
        };
        if self.config.mode == EpMode::HighThroughput {
            return self.launch_ht_combine::<T>(args, handle, stream, in_window);
        }
        let cfg = self.launch_config();
        use devcomm_kernels::moe as k;
        // The single-node case (every rank in the LSA team, per rank)
        // takes the kernels compiled for it alone.
        let lean = k::lsa_combine_serves(&self.ctx);
        // SAFETY: as in `dispatch_into`: live context, `expert_out` and `y`
        // of the checked shapes, the handle of this group's latest dispatch
        // (its buffers written by that dispatch's kernel, earlier on the
        // stream), the same combine on every rank; `T` matches the kernel;
        // the lean kernels only for a group they serve.
        unsafe {
            match (T::DTYPE, lean) {
                (DataType::F32, false) => stream.launch::<k::moe_combine_f32>(cfg, (args,)),
                (DataType::Bf16, false) => stream.launch::<k::moe_combine_bf16>(cfg, (args,)),
                (_, false) => stream.launch::<k::moe_combine_f16>(cfg, (args,)),
                (DataType::F32, true) => stream.launch::<k::moe_combine_lsa_f32>(cfg, (args,)),
                (DataType::Bf16, true) => stream.launch::<k::moe_combine_lsa_bf16>(cfg, (args,)),
                (_, true) => stream.launch::<k::moe_combine_lsa_f16>(cfg, (args,)),
            }
        }
    }

    /// What a combine checks before it allocates its output or reads the
    /// group's state: the type, `expert_out`'s shape and device, the
    /// handle's group, and that the handle's dispatch awaits its combine.
    fn check_combine<T: MoeType>(&self, expert_out: &DeviceBuffer<T>, handle: &Handle) -> Result<()> {
        self.check_type::<T>()?;
        let (l, n, m, h) =
            (self.local_experts(), self.comm.count(), self.config.max_tokens_per_rank, self.config.hidden);
        if expert_out.len() != self.recv_rows_total() * h {
            let layout = if self.per_source() {
                format!("{n} ranks × {m} tokens × {h}")
            } else {
                format!("{l} local experts × {n} ranks × {m} tokens × {h}")
            };
            return Err(Error::invalid_argument(format!(
                "combine: expert_out holds {} elements, the group's layout {layout} = {}",
                expert_out.len(),
                self.recv_rows_total() * h
            )));
        }
        self.check_device("combine expert_out", expert_out.device().ordinal())?;
        self.check_handle("combine", handle)
    }

    /// That `handle` comes from this group and that its dispatch awaits
    /// its combine (`call`: the entry, for the message).
    fn check_handle(&self, call: &str, handle: &Handle) -> Result<()> {
        if handle.group != self.id {
            return Err(Error::invalid_argument(format!("{call}: the handle comes from another EpGroup")));
        }
        Self::awaits_combine(&self.state.lock().unwrap_or_else(|p| p.into_inner()), handle.seq)
    }

    /// `Ok` when dispatch `seq` is the one whose combine is to come.
    fn awaits_combine(st: &State, seq: u32) -> Result<()> {
        match st.pending {
            Some(s) if s == seq => Ok(()),
            Some(s) => Err(Error::invalid_argument(format!(
                "combine: the handle is of dispatch {seq}, the latest dispatch is {s}"
            ))),
            None => Err(Error::invalid_usage(format!("combine: dispatch {seq} was combined already (or never ran)"))),
        }
    }

    fn check_type<T: MoeType>(&self) -> Result<()> {
        if T::DTYPE != self.config.dtype {
            return Err(Error::invalid_argument(format!(
                "tokens of {:?}, the group was made for {:?}",
                T::DTYPE,
                self.config.dtype
            )));
        }
        Ok(())
    }

    fn check_device(&self, what: &str, ordinal: usize) -> Result<()> {
        if ordinal != self.comm.device().ordinal() {
            return Err(Error::invalid_argument(format!(
                "{what}: the buffer is on device {ordinal}, the group on device {}",
                self.comm.device().ordinal()
            )));
        }
        Ok(())
    }

    /// Checks a dispatch's inputs; returns the token count.
    fn check_dispatch<T: MoeType>(
        &self,
        x: &DeviceBuffer<T>,
        topk_idx: &DeviceBuffer<i32>,
        topk_weights: &DeviceBuffer<f32>,
    ) -> Result<usize> {
        self.check_type::<T>()?;
        let (h, k, m) = (self.config.hidden, self.config.top_k, self.config.max_tokens_per_rank);
        if x.len() % h != 0 {
            return Err(Error::invalid_argument(format!(
                "dispatch: x holds {} elements, not a whole number of tokens of {h}",
                x.len()
            )));
        }
        let tokens = x.len() / h;
        if tokens > m {
            return Err(Error::invalid_argument(format!(
                "dispatch: {tokens} tokens, more than the group's max_tokens_per_rank {m} (nothing was sent)"
            )));
        }
        if topk_idx.len() != tokens * k || topk_weights.len() != tokens * k {
            return Err(Error::invalid_argument(format!(
                "dispatch: topk_idx holds {} and topk_weights {} entries; {tokens} tokens × top_k {k} = {}",
                topk_idx.len(),
                topk_weights.len(),
                tokens * k
            )));
        }
        self.check_device("dispatch x", x.device().ordinal())?;
        self.check_device("dispatch topk_idx", topk_idx.device().ordinal())?;
        self.check_device("dispatch topk_weights", topk_weights.device().ordinal())?;
        Ok(tokens)
    }
}
