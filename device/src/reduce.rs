//! Reductions over a coop: every thread gives a value, every thread gets
//! the combination of all of them.
//!
//! | coop | functions | how | scratch |
//! |---|---|---|---|
//! | [`Warp`] | [`warp_reduce`], [`warp_sum`], [`warp_max`] | butterfly of `shfl.sync` | none |
//! | [`Tile<N>`] | [`tile_reduce`], [`tile_sum`], [`tile_max`] | butterfly over the tile's lanes | none |
//! | [`Cta`] | [`block_reduce`], [`block_sum`], [`block_max`] | per warp, then across warps through shared memory; two `bar.sync 0` | `min(32, warps)` values of shared memory |
//!
//! Every thread of the coop must call, with the same `op` (a function of
//! two values, associative and commutative: `+`, `max`, `min`, `&`, ...).
//! All threads get bit-identical results: they combine the same values in
//! the same order (floating-point sums depend on that order, so they can
//! differ in the last bits from a sequential sum on the host).
//!
//! The block reductions take any block size (partial last warps included)
//! and a `scratch` pointer into shared memory with room for one value per
//! warp (at most 32), e.g. from [`arch::dynamic_shared`]; they end with a
//! barrier, so the same scratch can serve the next reduction at once.
//!
//! Values travel through [`arch::shfl`] as 64 bits: any [`Shuffle`] type
//! (`f32`, `f64`, `u32`, `i32`, `u64`, `i64`).
//!
//! ```ignore
//! use devcomm_device::{arch, coop::Cta, reduce};
//! // Inside a kernel: the block's sum of squares, on every thread.
//! let scratch = arch::dynamic_shared::<f32>(); // launched with >= 128 bytes of it
//! let ss = unsafe { reduce::block_sum(&Cta::new(), x * x, scratch) };
//! ```

use crate::arch::{self, WARP_SIZE};
use crate::coop::{Cta, Tile, Warp};

/// A value that can cross lanes through [`arch::shfl`] (64 bits).
pub trait Shuffle: Copy {
    /// The value as 64 bits.
    fn to_bits64(self) -> u64;
    /// The value back from [`Shuffle::to_bits64`].
    fn from_bits64(bits: u64) -> Self;
}

macro_rules! shuffle_int {
    ($($t:ty => $u:ty),*) => { $(
        impl Shuffle for $t {
            #[inline(always)]
            fn to_bits64(self) -> u64 {
                self as $u as u64
            }
            #[inline(always)]
            fn from_bits64(bits: u64) -> Self {
                bits as $u as $t
            }
        }
    )* };
}
shuffle_int!(u32 => u32, i32 => u32, u64 => u64, i64 => u64);

impl Shuffle for f32 {
    #[inline(always)]
    fn to_bits64(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn from_bits64(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
}

impl Shuffle for f64 {
    #[inline(always)]
    fn to_bits64(self) -> u64 {
        self.to_bits()
    }
    #[inline(always)]
    fn from_bits64(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}

/// A value with a sum and a maximum, for [`warp_sum`], [`block_max`], ...
/// Integers add wrapping; floats take the larger operand, or the other one
/// where one is NaN (as [`crate::math::max`]).
pub trait Reducible: Shuffle {
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// The larger of `a` and `b`.
    fn max(a: Self, b: Self) -> Self;
}

macro_rules! reducible_int {
    ($($t:ty),*) => { $(
        impl Reducible for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if a > b { a } else { b }
            }
        }
    )* };
}
reducible_int!(u32, i32, u64, i64);

impl Reducible for f32 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        crate::math::max(a, b)
    }
}

impl Reducible for f64 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        crate::math::max_f64(a, b)
    }
}

/// Butterfly over the lanes `mask` (a tile of `width` lanes, `width` a power
/// of two): after it every lane holds the combination of all of them.
#[inline(always)]
fn butterfly<T: Shuffle>(mask: u32, width: u32, mut v: T, op: &impl Fn(T, T) -> T) -> T {
    let lane = arch::lane_id();
    let mut off = width / 2;
    while off > 0 {
        let other = T::from_bits64(arch::shfl(mask, v.to_bits64(), lane ^ off));
        // Lower lane's value first, so both partners compute the same bits.
        v = if lane & off == 0 { op(v, other) } else { op(other, v) };
        off /= 2;
    }
    v
}

/// Combines `v` over the caller's whole warp with `op`; every lane gets the
/// result. All 32 lanes must call.
#[inline(always)]
pub fn warp_reduce<T: Shuffle>(_warp: &Warp, v: T, op: impl Fn(T, T) -> T) -> T {
    butterfly(u32::MAX, WARP_SIZE, v, &op)
}

/// The sum of `v` over the caller's warp, on every lane.
#[inline(always)]
pub fn warp_sum<T: Reducible>(warp: &Warp, v: T) -> T {
    warp_reduce(warp, v, T::add)
}

/// The maximum of `v` over the caller's warp, on every lane.
#[inline(always)]
pub fn warp_max<T: Reducible>(warp: &Warp, v: T) -> T {
    warp_reduce(warp, v, T::max)
}

/// Combines `v` over the caller's tile of `N` lanes with `op`; every lane of
/// the tile gets the result. All lanes of the tile must call.
#[inline(always)]
pub fn tile_reduce<const N: u32, T: Shuffle>(tile: &Tile<N>, v: T, op: impl Fn(T, T) -> T) -> T {
    butterfly(tile.mask(), N, v, &op)
}

/// The sum of `v` over the caller's tile, on every lane of it.
#[inline(always)]
pub fn tile_sum<const N: u32, T: Reducible>(tile: &Tile<N>, v: T) -> T {
    tile_reduce(tile, v, T::add)
}

/// The maximum of `v` over the caller's tile, on every lane of it.
#[inline(always)]
pub fn tile_max<const N: u32, T: Reducible>(tile: &Tile<N>, v: T) -> T {
    tile_reduce(tile, v, T::max)
}

/// Combines `v` over the first `lanes` (1..=32) lanes of the caller's warp,
/// all of which call; the result is lane 0's, broadcast.
#[inline(always)]
fn prefix_reduce<T: Shuffle>(lanes: u32, v: T, op: &impl Fn(T, T) -> T) -> T {
    if lanes >= WARP_SIZE {
        return butterfly(u32::MAX, WARP_SIZE, v, op);
    }
    let mask = (1u32 << lanes) - 1;
    let lane = arch::lane_id();
    // Ascending offsets: after the step with offset `off`, each lane that is
    // a multiple of 2·off holds the combination of its aligned group of
    // 2·off lanes (the lanes that exist). A partner beyond `lanes` has
    // nothing to add. Lane 0 ends with everything.
    let mut v = v;
    let mut off = 1;
    while off < WARP_SIZE {
        let src = lane ^ off;
        // Every lane of `mask` takes part in every shuffle; sources outside
        // it are clamped to the caller (and their value ignored).
        let other = T::from_bits64(arch::shfl(mask, v.to_bits64(), if src < lanes { src } else { lane }));
        if lane & off == 0 && src < lanes {
            v = op(v, other);
        }
        off *= 2;
    }
    T::from_bits64(arch::shfl(mask, v.to_bits64(), 0))
}

/// Combines `v` over the caller's whole block with `op`; every thread gets
/// the result. Every thread of the block must call, with the same `scratch`.
///
/// # Safety
///
/// `scratch` points to shared memory (of this block) with room for
/// `min(32, ceil(threads per block / 32))` values of `T`, aligned for `T`,
/// that no other code uses during the call.
#[inline(always)]
pub unsafe fn block_reduce<T: Shuffle>(_cta: &Cta, v: T, op: impl Fn(T, T) -> T, scratch: *mut T) -> T {
    let threads = arch::threads_per_block();
    let rank = arch::thread_rank_in_block();
    let warp = rank / WARP_SIZE;
    let lanes = (threads - warp * WARP_SIZE).min(WARP_SIZE);
    let partial = prefix_reduce(lanes, v, &op);
    let warps = threads.div_ceil(WARP_SIZE);
    if arch::lane_id() == 0 {
        // SAFETY: warp < warps <= 32 (at most 1024 threads per block), inside
        // the caller's scratch; each warp's lane 0 writes its own slot.
        unsafe { arch::store_volatile(scratch.add(warp as usize), partial) };
    }
    arch::sync_threads();
    // Every thread combines the warps' values in the same order.
    // SAFETY: slot 0 was written before the barrier.
    let mut acc = unsafe { arch::load_volatile(scratch) };
    let mut w = 1;
    while w < warps {
        // SAFETY: slot w < warps was written before the barrier.
        acc = op(acc, unsafe { arch::load_volatile(scratch.add(w as usize)) });
        w += 1;
    }
    // Nobody writes the scratch again (a next reduction) before all have read it.
    arch::sync_threads();
    acc
}

/// The sum of `v` over the caller's block, on every thread.
///
/// # Safety
///
/// As for [`block_reduce`].
#[inline(always)]
pub unsafe fn block_sum<T: Reducible>(cta: &Cta, v: T, scratch: *mut T) -> T {
    // SAFETY: forwarded from the caller.
    unsafe { block_reduce(cta, v, T::add, scratch) }
}

/// The maximum of `v` over the caller's block, on every thread.
///
/// # Safety
///
/// As for [`block_reduce`].
#[inline(always)]
pub unsafe fn block_max<T: Reducible>(cta: &Cta, v: T, scratch: *mut T) -> T {
    // SAFETY: forwarded from the caller.
    unsafe { block_reduce(cta, v, T::max, scratch) }
}
