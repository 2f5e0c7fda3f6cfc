//! Element-wise reduction of the LSA peers' copies, 16 bytes at a time.

use super::element::Element;
use super::op::{Reducer, ReducerKind, Reduction, SumOf};
use crate::arch::{load16, store16};
use crate::lsa::ops::UNROLL;
use core::mem::size_of;

/// Runs `$body` with `$l` bound to each constant `0..16` below `$n` (the
/// lanes of a 16-byte vector): unrolled, so every lane index is a constant
/// and lane arrays stay in registers. Loops over the lanes kept them in
/// local memory — slow, and for f64 miscompiled by the sm_90 toolchain
/// (results with their low 32 bits lost: issue 14's hierarchical f64
/// all-reduce, `benches/results/2026-11-23-h200x2-gin-frees-moe-hier.md`).
/// `$body` must not `break` or `continue` an enclosing loop.
#[cfg(target_arch = "nvptx64")]
macro_rules! each_lane {
    ($n:expr, |$l:ident| $body:block) => {
        $crate::coll::pack::each_lane!(@ $n, $l, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $n:expr, $l:ident, $body:block, $($i:literal)*) => {
        $(
            {
                const LANE: usize = $i;
                if LANE < $n {
                    let $l = LANE;
                    $body
                }
            }
        )*
    };
}
/// On the host (the emulated runtime) a plain loop: the unrolled form's
/// nested copies gave unoptimised builds stack frames larger than an
/// emulated GPU thread's stack (the reduce loop's `UNROLL × 16` lanes).
#[cfg(not(target_arch = "nvptx64"))]
macro_rules! each_lane {
    ($n:expr, |$l:ident| $body:block) => {
        #[allow(clippy::needless_range_loop)]
        for $l in 0..($n as usize).min(16) $body
    };
}
pub(crate) use each_lane;

/// Lane `l` of a 16-byte vector as `T`, by shifts (no byte access to a
/// local array: on sm_90 the current toolchain miscompiled such stores,
/// see `F16::to_f32`).
#[inline(always)]
fn lane<T: Element>(v: &[u32; 4], l: usize) -> T {
    let size = size_of::<T>();
    let bit = l * size * 8;
    let bits =
        if size == 8 { v[2 * l] as u64 | (v[2 * l + 1] as u64) << 32 } else { (v[bit / 32] >> (bit % 32)) as u64 };
    T::from_bits64(bits)
}

/// Sets lane `l` of a 16-byte vector, by shifts.
#[inline(always)]
fn set_lane<T: Element>(v: &mut [u32; 4], l: usize, x: T) {
    let size = size_of::<T>();
    let bits = x.to_bits64();
    if size == 8 {
        v[2 * l] = bits as u32;
        v[2 * l + 1] = (bits >> 32) as u32;
    } else {
        let bit = l * size * 8;
        let mask = if size == 4 { u32::MAX } else { (1u32 << (size * 8)) - 1 };
        let w = &mut v[bit / 32];
        *w = (*w & !(mask << (bit % 32))) | ((bits as u32 & mask) << (bit % 32));
    }
}

/// For elements `i` in `[begin, end)`: `out(q)[i] = red over p in 0..n of
/// src(p)[i]` for every `q < nout`, by thread `t` of `nt`. 16-byte vectors
/// when every address is 16-byte aligned at `begin` (the same choice on
/// every thread), elements otherwise and for the tail.
///
/// # Safety
/// `src(p)` for `p < n` are valid for reads and `out(q)` for `q < nout` for
/// writes of elements `begin..end`, written before (and made visible) /
/// read after by barriers; `n >= 1`; every thread `t < nt` calls with the
/// same arguments.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn reduce_into<T: Element>(
    t: usize,
    nt: usize,
    n: u32,
    src: &impl Fn(u32) -> *const T,
    nout: u32,
    out: &impl Fn(u32) -> *mut T,
    begin: usize,
    end: usize,
    red: &Reduction<T>,
) {
    let lanes = 16 / size_of::<T>();
    let mut aligned = true;
    for p in 0..n {
        aligned &= (src(p) as usize + begin * size_of::<T>()) % 16 == 0;
    }
    for q in 0..nout {
        aligned &= (out(q) as usize + begin * size_of::<T>()) % 16 == 0;
    }
    let packs = if aligned { (end - begin) / lanes } else { 0 };
    // Whole groups: each thread reduces `UNROLL` packs per step, with the
    // loads of two sources in flight at once (those of source `p + 1` are
    // issued before source `p`'s are reduced). A load used straight away
    // costs a full round trip per pack and source: over NVLink, one CTA
    // then moved about 2 GB/s (issue 14's 30 µs plateau of mid-size
    // all-reduces, `benches/results/2026-11-23-h200x2-collectives.md`).
    // This loop, where the time goes, is compiled once per reducer kind.
    let step = nt * UNROLL;
    let groups = packs / step;
    match red.kind() {
        // SAFETY: this function's contract; `groups * step <= packs`
        // 16-byte packs from `begin`, every address 16-byte aligned.
        ReducerKind::Sum => unsafe { reduce_groups(t, nt, n, src, nout, out, begin, groups, &SumOf::<T>::new()) },
        // SAFETY: as above.
        ReducerKind::Any => unsafe { reduce_groups(t, nt, n, src, nout, out, begin, groups, red) },
    }
    let mut k = groups * step + t;
    while k < packs {
        let at = begin + k * lanes;
        // SAFETY: `at + lanes <= end`: the pack lies in every source `p <
        // n` (valid, 16-byte aligned: checked above).
        let load = |p: u32| unsafe { load16(src(p).add(at) as *const u8) };
        // As in `reduce_groups`: source `p + 1`'s load is issued before
        // source `p`'s pack is reduced, and nothing waits for a load
        // before the next one is issued.
        let mut next = load(0);
        let mut acc = [red.first(T::from_bits64(0)); 16];
        for p in 0..n {
            let cur = next;
            if p + 1 < n {
                next = load(p + 1);
            }
            each_lane!(lanes, |l| {
                let x = lane::<T>(&cur, l);
                acc[l] = if p == 0 { red.first(x) } else { red.step(acc[l], x) };
            });
        }
        let mut r = [0u32; 4];
        each_lane!(lanes, |l| {
            set_lane::<T>(&mut r, l, red.finish(acc[l]));
        });
        for q in 0..nout {
            // SAFETY: the pack lies in every output (valid, aligned).
            unsafe { store16(out(q).add(at) as *mut u8, r) };
        }
        k += nt;
    }
    let mut i = begin + packs * lanes + t;
    while i < end {
        // SAFETY: `i < end`: inside every source and output.
        let mut acc = red.first(unsafe { src(0).add(i).read_volatile() });
        for p in 1..n {
            // SAFETY: as above, peer `p < n`.
            acc = red.step(acc, unsafe { src(p).add(i).read_volatile() });
        }
        let r = red.finish(acc);
        for q in 0..nout {
            // SAFETY: as above; element `i` is this thread's alone.
            unsafe { out(q).add(i).write_volatile(r) };
        }
        i += nt;
    }
}

/// The whole groups of [`reduce_into`]: `groups` steps of `UNROLL` packs
/// per thread from element `begin`, with the per-element work of `red`.
///
/// # Safety
/// As for [`reduce_into`], with every source and output 16-byte aligned at
/// `begin` and holding `groups * nt * UNROLL` packs from there.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn reduce_groups<T: Element, R: Reducer<T>>(
    t: usize,
    nt: usize,
    n: u32,
    src: &impl Fn(u32) -> *const T,
    nout: u32,
    out: &impl Fn(u32) -> *mut T,
    begin: usize,
    groups: usize,
    red: &R,
) {
    let lanes = 16 / size_of::<T>();
    let step = nt * UNROLL;
    for g in 0..groups {
        let base = g * step + t;
        let at = |u: usize| begin + (base + u * nt) * lanes;
        // SAFETY (both closures' callers): pack `base + u * nt < groups *
        // step <= packs` lies in every source (valid, 16-byte aligned:
        // checked above) and every output.
        let load = |p: u32| {
            let mut v = [[0u32; 4]; UNROLL];
            each_lane!(UNROLL, |u| {
                // SAFETY: see above.
                v[u] = unsafe { load16(src(p).add(at(u)) as *const u8) };
            });
            v
        };
        let mut next = load(0);
        // Every lane is set at `p == 0` below; the initial value must not
        // come from a load (it did: the first vector's value, which made
        // the thread wait for that load before issuing the others — a
        // second memory round trip in every group, in session 20's SASS;
        // the 2 MiB all-reduce's reduce step on 2 × H200 went from 1.69 to
        // 1.47 µs).
        let mut acc = [[red.first(T::from_bits64(0)); 16]; UNROLL];
        for p in 0..n {
            let cur = next;
            if p + 1 < n {
                next = load(p + 1);
            }
            each_lane!(UNROLL, |u| {
                each_lane!(lanes, |l| {
                    let x = lane::<T>(&cur[u], l);
                    acc[u][l] = if p == 0 { red.first(x) } else { red.step(acc[u][l], x) };
                });
            });
        }
        each_lane!(UNROLL, |u| {
            let mut r = [0u32; 4];
            each_lane!(lanes, |l| {
                set_lane::<T>(&mut r, l, red.finish(acc[u][l]));
            });
            for q in 0..nout {
                // SAFETY: see above: the pack lies in every output.
                unsafe { store16(out(q).add(at(u)) as *mut u8, r) };
            }
        });
    }
}

/// For the 16-byte packs `0..packs`: pack `k` of `out` = `red` over `p <
/// n` (in that order) of pack `k` of `src(p)`, by thread `t` of `nt`:
/// [`UNROLL`] packs per thread and step, the loads of source `p + 1` issued
/// before source `p`'s are reduced, the last step's packs guarded (no
/// separate tail loop, no division). What the pushed one-shot all-reduce
/// runs after its barrier (`reduce::pushed_packs`), where every address is
/// known before the barrier and nothing but loads, the reduction and
/// stores should stand between the barrier and the kernel's end.
///
/// # Safety
/// `src(p)` for `p < n` are valid for reads and `out` for writes of
/// `packs * 16` bytes, all 16-byte aligned, written before (and made
/// visible) / read after by barriers; `out` may be one of the sources (each
/// pack is read before it is written, by the same thread); `n >= 1`; every
/// thread `t < nt` calls with the same arguments.
#[inline(always)]
pub(crate) unsafe fn reduce_packs<T: Element, R: Reducer<T>>(
    t: usize,
    nt: usize,
    n: u32,
    src: &impl Fn(u32) -> *const u8,
    out: *mut u8,
    packs: usize,
    red: &R,
) {
    let lanes = 16 / size_of::<T>();
    let step = nt * UNROLL;
    let mut base = t;
    while base < packs {
        // SAFETY (the closure's callers): pack `base + u * nt < packs` lies
        // in every source (the contract: valid, 16-byte aligned).
        let load = |p: u32| {
            let s = src(p);
            let mut v = [[0u32; 4]; UNROLL];
            each_lane!(UNROLL, |u| {
                let i = base + u * nt;
                if i < packs {
                    // SAFETY: see above.
                    v[u] = unsafe { load16(s.add(i * 16)) };
                }
            });
            v
        };
        let mut next = load(0);
        // The accumulator's initial value must not come from a load (see
        // `reduce_groups`).
        let mut acc = [[red.first(T::from_bits64(0)); 16]; UNROLL];
        for p in 0..n {
            let cur = next;
            if p + 1 < n {
                next = load(p + 1);
            }
            each_lane!(UNROLL, |u| {
                each_lane!(lanes, |l| {
                    let x = lane::<T>(&cur[u], l);
                    acc[u][l] = if p == 0 { red.first(x) } else { red.step(acc[u][l], x) };
                });
            });
        }
        each_lane!(UNROLL, |u| {
            let i = base + u * nt;
            if i < packs {
                let mut r = [0u32; 4];
                each_lane!(lanes, |l| {
                    set_lane::<T>(&mut r, l, red.finish(acc[u][l]));
                });
                // SAFETY: pack `i < packs` lies in `out` (the contract),
                // and is this thread's alone.
                unsafe { store16(out.add(i * 16), r) };
            }
        });
        base += step;
    }
}

/// `dst[i] = red over b < blocks of src[b * stride + i]` for `i < count`,
/// by thread `t` of `nt` (any set of threads: a coop, or a whole grid with
/// `t` the global thread index): reduces blocks that already sit in local
/// memory (received copies of the ranks' inputs, say), 16 bytes at a time
/// where the addresses allow. `dst` may be block 0 itself.
///
/// # Safety
/// `src` holds `blocks` blocks of `count` elements `stride` apart, `dst`
/// `count` elements, no other block overlapping `dst`; `blocks >= 1`;
/// every thread `t < nt` calls with the same arguments.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_blocks<T: Element>(
    t: usize,
    nt: usize,
    src: *const T,
    blocks: u32,
    stride: usize,
    dst: *mut T,
    count: usize,
    red: &Reduction<T>,
) {
    // SAFETY: the contract: every block and `dst` hold elements `0..count`;
    // each element (or pack) of `dst` is written by one thread only, after
    // it read the same element of every block.
    unsafe { reduce_into(t, nt, blocks.max(1), &|b| src.wrapping_add(b as usize * stride), 1, &|_| dst, 0, count, red) }
}
