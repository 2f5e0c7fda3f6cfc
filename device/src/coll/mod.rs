//! Collectives callable from a kernel, over the LSA team: all-reduce,
//! reduce-scatter, all-gather, broadcast, reduce, all-to-all, gather,
//! scatter; and over a world of several LSA teams, hierarchically (LSA in
//! each team, GIN along the rails): [`hier::all_reduce`],
//! [`hier::reduce_scatter`], [`hier::all_gather`], [`hier::broadcast`],
//! [`hier::reduce`].
//!
//! NCCL's device API gives building blocks only; these are what a kernel
//! that fuses compute with communication calls between its own steps, and
//! what `devcomm`'s host collectives (`devcomm::coll::Collectives`) launch.
//! One implementation serves both.
//!
//! ## Who works
//!
//! Every rank of the LSA team calls the same collective with the same
//! arguments (counts, root, algorithm, `seq`). On each rank a collective
//! is done by one or more **parts**: a coop (usually a CTA, [`Cta`](crate::coop::Cta)) that
//! takes [`Part`] `index` of `count`. One CTA can do all of it
//! ([`Part::WHOLE`]); a grid can share it ([`Part::block`]: CTA `b` of
//! `grid_dim`). Part `b` synchronises with part `b` of the other ranks
//! only, through LSA barrier `barrier_base + b` of the [`CollContext`]; so
//! every part of every rank must be running at once (launch a grid that
//! shares a collective co-resident: a cooperative launch, `LaunchConfig::
//! co_resident` in `devcomm`), or part `b` of one rank can wait for a part
//! another rank has not started.
//!
//! ## Where data lives
//!
//! The input is an [`Input`]: a local pointer (the collective copies it
//! through the context's staging area, in chunks) or a [`SymPtr`] into a
//! registered window, which peers read in place (zero copy). The output is
//! a local pointer (a window's [`SymPtr::local`] works too). Input and
//! output may be the same memory (in place) where the collective says so.
//!
//! ## Ordering
//!
//! Before the call, the input a part reads must be complete on every rank:
//! written by an earlier kernel, or by the same part (coop) before the call.
//! After the call, the part's share of the output is complete on the
//! caller, and every peer is done reading the caller's input (the caller
//! may overwrite it). Across parts there is no ordering: a kernel that
//! reads output another CTA produced syncs the grid first.
//!
//! ## Algorithms
//!
//! | [`Algorithm`] | how | barriers per chunk | for |
//! |---|---|---|---|
//! | `Ll` (all-reduce) | each rank stores its input with a flag in every 8 bytes into every peer's LL slot; arrival is the signal | none | ≤ [`CollContext::ll_bytes`] |
//! | `Ll` (broadcast, reduce) | the root stores its input with flags into every peer's channel slot, or every rank into the root's; the receiver acknowledges each message so the slot is reused only once free | none | ≤ [`CollContext::ll_bytes`] |
//! | `OneShot` | every rank stores its input into every peer's staging slot (a window input: every rank reads the peers' windows) and reduces all of it | 1 (window: 2) | medium (2 ranks: up to 2 MiB) |
//! | `TwoShot` | every rank stores shard `p` of its input into rank `p`'s staging slot; rank `r` reduces shard `r` and stores it into every peer's result slot; each copies the results out (only stores cross NVLink) | 2 | large |
//!
//! [`Algorithm::Auto`] picks by size ([`Algorithm::choose`]).
//!
//! [`broadcast`] and [`reduce`] take an algorithm too: `Ll` as above,
//! `OneShot` sends
//! directly (the root stores the message into every peer's slot, or every
//! rank into the root's: 1 barrier per chunk), `TwoShot` relays it through
//! the other ranks on a team of three or more (a scatter then an
//! all-gather, or a reduce-scatter then a gather, overlapped: every link
//! carries one message instead of the root's `n - 1`; see `relay.rs`).
//! [`Algorithm::choose_rooted`] picks.
//!
//! ## Building blocks for fusing
//!
//! An all-reduce is a [`reduce_scatter`] then an [`all_gather`]: a kernel
//! can run its own computation on its shard in between (all-reduce, then
//! RMSNorm, computed once per shard instead of once per rank).

pub mod element;
pub mod hier;
mod ll;
pub mod ll_a2a;
mod ll_rooted;
mod movement;
pub mod op;
pub mod p2p;
pub(crate) mod pack;
mod reduce;
mod relay;
mod staging;

pub use crate::abi::coll::{
    CollArgs, CollBuffer, CollContext, CollStage, P2pArgs, P2pKind, P2pOp, COLL_STAGES, MAX_GROUP_OPS,
};
pub use element::{Accumulator, Bf16, DataType, Element, Fp8E4M3, Fp8E5M2, F16};
pub use ll_a2a::LlA2aSession;
pub use movement::{all_gather, all_to_all, broadcast, gather, scatter};
pub use op::{RedOp, Reduction};
pub use p2p::{p2p_chunks, recv, send};
pub use pack::reduce_blocks;
pub use reduce::{all_reduce, all_reduce_pushed, all_reduce_pushed_by, reduce, reduce_scatter};

use crate::arch;
use crate::comm::SymPtr;
use crate::error::{DeviceError, ErrorCode};
use crate::lsa::BarrierError;
use crate::wait::WaitError;

/// Which share of a collective the calling coop does: part `index` of
/// `count` (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// This coop's part.
    pub index: u32,
    /// How many parts share the collective (on every rank alike).
    pub count: u32,
}

impl CollContext {
    /// Records `stage` of `part` (`%globaltimer`, by the coop's leader)
    /// when the context has stage stamps
    /// ([`CollContext::with_stage_stamps`]); otherwise nothing.
    #[inline(always)]
    pub fn stamp<C: crate::coop::Coop>(&self, coop: &C, part: Part, stage: CollStage) {
        if self.stamps != 0 && part.index < self.parts && coop.is_leader() {
            let at = (self.stamps as *mut u64).wrapping_add(part.index as usize * COLL_STAGES + stage as usize);
            // SAFETY: `with_stage_stamps`' contract: `stamps` holds `parts *
            // COLL_STAGES` aligned `u64`s nothing else uses; `part.index <
            // parts` (checked) and `stage < COLL_STAGES`.
            unsafe { at.write_volatile(arch::global_timer_ns()) };
        }
    }
}

impl Part {
    /// One coop does all of it.
    pub const WHOLE: Part = Part { index: 0, count: 1 };

    /// CTA `block_idx.x` of `grid_dim.x`.
    #[inline(always)]
    pub fn block() -> Part {
        Part { index: arch::block_idx().x, count: arch::grid_dim().x }
    }
}

/// A collective's input.
#[derive(Clone, Copy, Debug)]
pub enum Input<T> {
    /// Local device memory: staged through the context's scratch.
    Local(*const T),
    /// A registered window: peers read it in place.
    Window(SymPtr<T>),
}

impl<T> Input<T> {
    /// The caller's own address of element 0.
    #[inline(always)]
    pub fn local(&self) -> *const T {
        match self {
            Input::Local(p) => *p,
            Input::Window(s) => s.local(),
        }
    }

    /// The input from element `n` on (the same kind).
    #[inline(always)]
    pub fn advance(self, n: usize) -> Input<T> {
        match self {
            Input::Local(p) => Input::Local(p.wrapping_add(n)),
            Input::Window(s) => Input::Window(s.add(n as u64)),
        }
    }
}

/// How an all-reduce moves its data (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Algorithm {
    /// [`Algorithm::choose`] decides.
    Auto = 0,
    /// Low-latency: data and flag in each store, no barrier.
    Ll = 1,
    /// Every rank reduces everything.
    OneShot = 2,
    /// Reduce-scatter, then all-gather.
    TwoShot = 3,
}

/// Bytes of dynamic shared memory the host collectives launch their
/// kernels with: room for one [`CollContext`], which the kernels' paths
/// other than LL copy there once per CTA and hand by reference to the
/// collectives (a reference into the kernel's parameter that reaches a
/// function compiled out of line would make every thread copy the whole
/// parameter to local memory at the kernel's entry).
pub const CONTEXT_SHARED_BYTES: u32 = (core::mem::size_of::<CollContext>() as u32).next_multiple_of(16);

/// All-reduce messages up to this many bytes take [`Algorithm::Ll`] on a
/// team of two (when the context's LL slots hold them), broadcasts and
/// reduces too. On 2 × H200, graphed, the LL all-reduce took 3.35 / 4.28 /
/// 6.66 / 11.38 µs at 2 / 4 / 8 / 16 KiB, the pushed one-shot 5.42 / 5.55 /
/// 6.40 / 6.03 (in kernel LL 2.04 / 2.83 / 4.80 / 8.85, one-shot 4.58 /
/// 4.80 / 5.53 / 5.29); the LL broadcast 2.95 / 3.52 / 4.21 / 5.90, the
/// direct one 4.29 / 4.34 / 4.59 / 4.57
/// (`benches/results/2026-11-27-h200x2-ll-limit.md`).
pub const LL_MAX_BYTES: u64 = 8 << 10;
/// Payload bytes of the LL slots a host `Collectives` makes by default
/// (`CollConfig::ll_bytes`): LL can be asked for up to this size.
pub const LL_SLOT_BYTES: u64 = 16 << 10;
/// [`LL_MAX_BYTES`] on teams of three or more, where each word goes to
/// every peer from one CTA: on 4 × H200 the LL all-reduce took 5.8 µs at 4
/// KiB but 10.3 at 8 KiB and 19.1 at 16 KiB in kernel, one-shot 6.9, 8.7
/// and 7.6 (`benches/results/2026-11-26-h200x4-scale.md`).
pub const LL_MAX_BYTES_MANY_RANKS: u64 = 4 << 10;
/// Above this many bytes all-reduce takes [`Algorithm::TwoShot`] on more
/// than two ranks: one-shot stores `n - 1` copies of the message per rank
/// across NVLink, two-shot `2 (n - 1) / n` (on 2 × H200 the pushed
/// two-shot took 19.6 µs at 2 MiB and 525 µs at 128 MiB against the pulled
/// one-shot's 22.8 and 843: `benches/results/2026-11-24-h200x2-push.md`).
pub const ONE_SHOT_MAX_BYTES: u64 = 512 << 10;
/// Broadcasts and reduces of at least this many bytes take
/// [`Algorithm::TwoShot`] (relayed) on teams of three or more. Below it the
/// two extra barrier epochs cost more than the root's link saves: on 4 ×
/// H200 the relayed broadcast took 17.2 µs at 1 MiB and 22.2 at 2 MiB, the
/// direct one 16.4 and 24.6; the reduce 24.1 and 30.4 against 18.2 and 35.7
/// (`benches/results/2026-11-26-h200x4-scale.md`).
pub const RELAY_MIN_BYTES: u64 = 2 << 20;
/// [`ONE_SHOT_MAX_BYTES`] on two ranks, where both algorithms store one
/// copy of the message per rank and the pushed one-shot needs one barrier
/// per chunk instead of two: on 2 × H200 it took 17.0–17.7 µs at 2 MiB
/// against two-shot's 19.2–20.4, and lost from 8 MiB on (49.8 against 38.5
/// µs; `benches/results/2026-11-26-h200x2-hier-floors.md`).
pub const ONE_SHOT_MAX_BYTES_2_RANKS: u64 = 2 << 20;

impl Algorithm {
    /// The algorithm with this code, if any.
    pub const fn from_code(code: u32) -> Option<Algorithm> {
        match code {
            0 => Some(Algorithm::Auto),
            1 => Some(Algorithm::Ll),
            2 => Some(Algorithm::OneShot),
            3 => Some(Algorithm::TwoShot),
            _ => None,
        }
    }

    /// The broadcast or reduce algorithm for `bytes` on `ctx`, for a call
    /// split over `parts` parts: [`Algorithm::Ll`] for a single-part call
    /// up to the all-reduce's LL limit ([`LL_MAX_BYTES`],
    /// [`LL_MAX_BYTES_MANY_RANKS`] on teams of three or more, and the LL
    /// slots' size; LL moves the whole message in one part and numbers its
    /// calls per rank, so each part of a split call, which moves its own
    /// piece, takes a barrier-based algorithm), [`Algorithm::TwoShot`]
    /// (relayed by the ranks other than the root) from [`RELAY_MIN_BYTES`]
    /// on teams of three or more, else [`Algorithm::OneShot`] (direct).
    /// Graphed on 2 × H200, 8 bytes: LL broadcast 2.7 µs against the direct
    /// one's 4.3, LL reduce 5.3 against 6.9
    /// (`benches/results/2026-11-26-h200x2-one-barrier.md`).
    #[inline(always)]
    pub const fn choose_rooted(bytes: u64, ctx: &CollContext, parts: u32) -> Algorithm {
        let n = ctx.scratch().lsa_size();
        let ll_max = if n <= 2 { LL_MAX_BYTES } else { LL_MAX_BYTES_MANY_RANKS };
        if parts <= 1 && bytes <= ll_max && bytes <= ctx.ll_bytes() {
            Algorithm::Ll
        } else if n >= 3 && bytes >= RELAY_MIN_BYTES {
            Algorithm::TwoShot
        } else {
            Algorithm::OneShot
        }
    }

    /// `self`, or for [`Algorithm::Auto`] the all-reduce algorithm
    /// [`choose`](Self::choose) picks for `bytes` per rank on `ctx`.
    #[inline(always)]
    pub const fn resolve(self, bytes: u64, ctx: &CollContext) -> Algorithm {
        match self {
            Algorithm::Auto => Algorithm::choose(bytes, ctx),
            a => a,
        }
    }

    /// `self`, or for [`Algorithm::Auto`] the broadcast and reduce
    /// algorithm [`choose_rooted`](Self::choose_rooted) picks for a call
    /// split over `parts` parts.
    #[inline(always)]
    pub const fn resolve_rooted(self, bytes: u64, ctx: &CollContext, parts: u32) -> Algorithm {
        match self {
            Algorithm::Auto => Algorithm::choose_rooted(bytes, ctx, parts),
            a => a,
        }
    }

    /// The all-reduce algorithm for `bytes` per rank on `ctx`: LL up to
    /// [`LL_MAX_BYTES`] ([`LL_MAX_BYTES_MANY_RANKS`] on teams of three or
    /// more; and the LL slots' size), one-shot up to
    /// [`ONE_SHOT_MAX_BYTES`] ([`ONE_SHOT_MAX_BYTES_2_RANKS`] on a team of
    /// two), two-shot beyond.
    #[inline(always)]
    pub const fn choose(bytes: u64, ctx: &CollContext) -> Algorithm {
        let two = ctx.scratch().lsa_size() <= 2;
        let one_shot_max = if two { ONE_SHOT_MAX_BYTES_2_RANKS } else { ONE_SHOT_MAX_BYTES };
        let ll_max = if two { LL_MAX_BYTES } else { LL_MAX_BYTES_MANY_RANKS };
        if bytes <= ll_max && bytes <= ctx.ll_bytes() {
            Algorithm::Ll
        } else if bytes <= one_shot_max {
            Algorithm::OneShot
        } else {
            Algorithm::TwoShot
        }
    }
}

/// Why a collective failed (the same on every thread of the coop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollError {
    /// `part` is not within the context's parts.
    PartOutOfRange,
    /// The message is larger than the algorithm's scratch (LL slots).
    TooLarge,
    /// A root, datatype, operator or algorithm is invalid.
    BadArgument,
    /// A barrier failed (timeout, abort).
    Barrier(BarrierError),
    /// A wait failed (timeout, abort).
    Wait(WaitError),
    /// A receive's byte count differs from the matching send's.
    CountMismatch,
    /// A GIN operation of a channel to a rank outside the LSA team failed.
    Gin(crate::gin::GinError),
}

impl From<crate::gin::GinError> for CollError {
    fn from(e: crate::gin::GinError) -> Self {
        CollError::Gin(e)
    }
}

impl From<BarrierError> for CollError {
    fn from(e: BarrierError) -> Self {
        CollError::Barrier(e)
    }
}

impl From<WaitError> for CollError {
    fn from(e: WaitError) -> Self {
        CollError::Wait(e)
    }
}

impl ErrorCode for CollError {
    fn code(self) -> u32 {
        match self {
            CollError::PartOutOfRange => DeviceError::CollPartOutOfRange as u32,
            CollError::TooLarge => DeviceError::CollTooLarge as u32,
            CollError::BadArgument => DeviceError::CollBadArgument as u32,
            CollError::CountMismatch => DeviceError::CollCountMismatch as u32,
            CollError::Gin(g) => ErrorCode::code(g),
            CollError::Barrier(b) => b.code(),
            CollError::Wait(w) => w.code(),
        }
    }
    fn from_code(code: u32) -> Self {
        match DeviceError::from_code(code) {
            Some(DeviceError::CollPartOutOfRange) => CollError::PartOutOfRange,
            Some(DeviceError::CollTooLarge) => CollError::TooLarge,
            Some(DeviceError::CollBadArgument) => CollError::BadArgument,
            Some(DeviceError::CollCountMismatch) => CollError::CountMismatch,
            Some(DeviceError::LsaBarrierOutOfRange) => CollError::Barrier(BarrierError::IndexOutOfRange),
            Some(
                DeviceError::RingFailed
                | DeviceError::NoGin
                | DeviceError::ContextOutOfRange
                | DeviceError::PeerNotInTeam
                | DeviceError::PeerNotConnected
                | DeviceError::SignalOutOfRange
                | DeviceError::CounterOutOfRange
                | DeviceError::OutOfWindow
                | DeviceError::ValueTooWide
                | DeviceError::GinBarrierOutOfRange,
            ) => CollError::Gin(<crate::gin::GinError as ErrorCode>::from_code(code)),
            _ => CollError::Wait(WaitError::from_code(code)),
        }
    }
}

impl CollError {
    /// The non-zero code kernels report.
    pub fn code(self) -> u32 {
        ErrorCode::code(self)
    }
}

/// Checks `part` against `ctx` (the same answer on every thread).
#[inline(always)]
pub(crate) fn check_part(ctx: &CollContext, part: Part) -> Result<(), CollError> {
    if part.count == 0 || part.index >= part.count || part.count > ctx.parts() {
        Err(CollError::PartOutOfRange)
    } else {
        Ok(())
    }
}

/// Elements of `T` per chunk of staged input when `blocks` blocks of the
/// chunk share the part's staging slice: whole 16-byte units, at least one.
#[inline(always)]
pub(crate) fn chunk_elems<T>(ctx: &CollContext, part: Part, blocks: u32) -> usize {
    let size = core::mem::size_of::<T>();
    let per_block = (staging::slice(ctx, part).1 / blocks.max(1) as usize) / 16 * 16;
    (per_block / size).max(16 / size)
}
