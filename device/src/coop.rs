//! Cooperative groups: the set of threads that performs one operation.
//!
//! Device-API calls take a coop (`coop: &impl Coop`): every thread of the
//! coop calls with the same arguments, the work is spread over them, and
//! [`Coop::sync`] joins them. The coops, from smallest to largest:
//!
//! | coop | threads | `sync` |
//! |---|---|---|
//! | [`ThreadCoop`] | the caller alone | nothing |
//! | [`Tile<N>`] | `N` = 2^k ≤ 32 consecutive lanes of a warp | `bar.warp.sync` on the tile's lanes |
//! | [`Warp`] | the caller's warp | `bar.warp.sync 0xffffffff` |
//! | [`Lanes`] | the lanes of a mask in the caller's warp | `bar.warp.sync mask` |
//! | [`WarpSpan`] | `nwarps` consecutive warps from `warp0` | named barrier `id` |
//! | [`Cta`] | the whole block | `bar.sync 0` |
//!
//! ```no_run
//! use devcomm_device::coop::{Coop, Warp};
//! fn copy(dst: &mut [u32], src: &[u32]) {
//!     let warp = Warp::new();
//!     let mut i = warp.thread_rank() as usize;
//!     while i < dst.len().min(src.len()) {
//!         dst[i] = src[i];
//!         i += warp.size() as usize;
//!     }
//!     warp.sync();
//! }
//! ```

use crate::arch::{self, WARP_SIZE};

/// A set of threads acting together.
pub trait Coop {
    /// The caller's index in the coop, `0..size()`.
    fn thread_rank(&self) -> u32;
    /// Number of threads in the coop.
    fn size(&self) -> u32;
    /// Barrier among the coop's threads, ordering their memory accesses
    /// (as `__syncthreads` does for a block).
    fn sync(&self);
    /// [`Coop::sync`] that also returns the largest `value` any thread of
    /// the coop brought, to every thread. The basis of [`Coop::agree`].
    fn sync_max(&self, value: u32) -> u32;
    /// Whether the caller is the coop's first thread.
    #[inline(always)]
    fn is_leader(&self) -> bool {
        self.thread_rank() == 0
    }

    /// Joins the coop and gives every thread the same outcome: the error
    /// with the largest code that any thread had (see
    /// [`crate::error::ErrorCode`]), else each thread's own `Ok` value.
    /// Every coop-wide device-API call ends with this, so that no thread
    /// carries on as if an operation succeeded that failed for another.
    #[inline(always)]
    fn agree<T, E: crate::error::ErrorCode>(&self, r: Result<T, E>) -> Result<T, E> {
        let mine = match &r {
            Ok(_) => 0,
            Err(e) => e.code(),
        };
        match self.sync_max(mine) {
            0 => r,
            code if code == mine => r,
            code => Err(E::from_code(code)),
        }
    }
}

/// The calling thread alone.
#[doc(alias = "ncclCoopThread")]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadCoop;

impl Coop for ThreadCoop {
    #[inline(always)]
    fn thread_rank(&self) -> u32 {
        0
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        1
    }
    #[inline(always)]
    fn sync(&self) {}
    #[inline(always)]
    fn sync_max(&self, value: u32) -> u32 {
        value
    }
}

/// The calling thread's warp (all 32 lanes must take part).
#[doc(alias = "ncclCoopWarp")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Warp;

impl Warp {
    /// The caller's warp.
    #[inline(always)]
    pub fn new() -> Self {
        Warp
    }
}

impl Coop for Warp {
    #[inline(always)]
    fn thread_rank(&self) -> u32 {
        arch::lane_id()
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        WARP_SIZE
    }
    #[inline(always)]
    fn sync(&self) {
        arch::sync_warp(u32::MAX)
    }
    #[inline(always)]
    fn sync_max(&self, value: u32) -> u32 {
        arch::sync_warp_max(u32::MAX, value)
    }
}

/// `N` consecutive lanes of a warp, `N` a power of two from 1 to 32; lane `l`
/// belongs to tile `l / N`.
#[doc(alias = "ncclCoopTile")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tile<const N: u32>;

impl<const N: u32> Tile<N> {
    const VALID: () = assert!(N.is_power_of_two() && N <= WARP_SIZE, "tile size must be 2^k <= 32");

    /// The caller's tile.
    #[inline(always)]
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::VALID;
        Tile
    }

    /// Lane mask of the caller's tile.
    #[inline(always)]
    pub fn mask(&self) -> u32 {
        let base = arch::lane_id() / N * N;
        let ones = if N == 32 { u32::MAX } else { (1u32 << N) - 1 };
        ones << base
    }
}

impl<const N: u32> Coop for Tile<N> {
    #[inline(always)]
    fn thread_rank(&self) -> u32 {
        arch::lane_id() % N
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        N
    }
    #[inline(always)]
    fn sync(&self) {
        arch::sync_warp(self.mask())
    }
    #[inline(always)]
    fn sync_max(&self, value: u32) -> u32 {
        arch::sync_warp_max(self.mask(), value)
    }
}

/// The lanes of `mask` in the caller's warp (the caller must be one of them).
#[doc(alias = "ncclCoopLanes")]
#[derive(Clone, Copy, Debug)]
pub struct Lanes {
    mask: u32,
}

impl Lanes {
    /// The lanes set in `mask`.
    #[inline(always)]
    pub fn new(mask: u32) -> Self {
        Lanes { mask }
    }

    /// The mask.
    #[inline(always)]
    pub fn mask(&self) -> u32 {
        self.mask
    }
}

impl Coop for Lanes {
    #[inline(always)]
    fn thread_rank(&self) -> u32 {
        let lane = arch::lane_id();
        let below = if lane == 0 { 0 } else { u32::MAX >> (32 - lane) };
        (self.mask & below).count_ones()
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        self.mask.count_ones()
    }
    #[inline(always)]
    fn sync(&self) {
        arch::sync_warp(self.mask)
    }
    #[inline(always)]
    fn sync_max(&self, value: u32) -> u32 {
        arch::sync_warp_max(self.mask, value)
    }
}

/// `nwarps` consecutive warps of the block starting at warp `warp0`,
/// synchronised with named barrier `id` (1..=15, distinct for spans that
/// run concurrently).
#[doc(alias = "ncclCoopWarpSpan")]
#[derive(Clone, Copy, Debug)]
pub struct WarpSpan {
    warp0: u32,
    nwarps: u32,
    id: u32,
}

impl WarpSpan {
    /// The span of `nwarps` warps from `warp0`, using named barrier `id`.
    #[inline(always)]
    pub fn new(warp0: u32, nwarps: u32, id: u32) -> Self {
        WarpSpan { warp0, nwarps, id }
    }

    /// First warp of the span.
    #[inline(always)]
    pub fn warp0(&self) -> u32 {
        self.warp0
    }

    /// Number of warps.
    #[inline(always)]
    pub fn nwarps(&self) -> u32 {
        self.nwarps
    }

    /// Named barrier id.
    #[inline(always)]
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Coop for WarpSpan {
    #[inline(always)]
    fn thread_rank(&self) -> u32 {
        arch::thread_rank_in_block() - self.warp0 * WARP_SIZE
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        self.nwarps * WARP_SIZE
    }
    #[inline(always)]
    fn sync(&self) {
        arch::named_barrier(self.id, self.nwarps * WARP_SIZE)
    }
    #[inline(always)]
    fn sync_max(&self, value: u32) -> u32 {
        arch::named_barrier_max(self.id, self.nwarps * WARP_SIZE, self.warp0 * WARP_SIZE, value)
    }
}

/// The whole block (CTA).
#[doc(alias = "ncclCoopCta")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Cta;

impl Cta {
    /// The caller's block.
    #[inline(always)]
    pub fn new() -> Self {
        Cta
    }
}

impl Coop for Cta {
    #[inline(always)]
    fn thread_rank(&self) -> u32 {
        arch::thread_rank_in_block()
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        arch::threads_per_block()
    }
    #[inline(always)]
    fn sync(&self) {
        arch::sync_threads()
    }
    #[inline(always)]
    fn sync_max(&self, value: u32) -> u32 {
        arch::sync_threads_max(value)
    }
}
