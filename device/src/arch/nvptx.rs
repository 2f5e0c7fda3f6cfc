//! PTX implementations of [`super`]'s intrinsics.
//!
//! Safety of the `unsafe` blocks: reading special registers and executing
//! `bar.sync 0`/`nanosleep`/`trap` have no memory-safety preconditions; the
//! stdarch functions are only `unsafe` because they are intrinsics.

use super::Dim3;
use core::arch::asm;
use core::arch::nvptx::*;

// Dynamic shared memory: one extern `.shared` array, sized at launch time.
core::arch::global_asm!(".extern .shared .align 16 .b8 __devcomm_dynamic_smem[];");

#[inline(always)]
pub fn thread_idx() -> Dim3 {
    // SAFETY: the stdarch special-register reads are `unsafe` only as
    // intrinsics: they read a read-only register and touch no memory.
    unsafe { Dim3::new(_thread_idx_x() as u32, _thread_idx_y() as u32, _thread_idx_z() as u32) }
}

#[inline(always)]
pub fn block_idx() -> Dim3 {
    // SAFETY: the stdarch special-register reads are `unsafe` only as
    // intrinsics: they read a read-only register and touch no memory.
    unsafe { Dim3::new(_block_idx_x() as u32, _block_idx_y() as u32, _block_idx_z() as u32) }
}

#[inline(always)]
pub fn block_dim() -> Dim3 {
    // SAFETY: the stdarch special-register reads are `unsafe` only as
    // intrinsics: they read a read-only register and touch no memory.
    unsafe { Dim3::new(_block_dim_x() as u32, _block_dim_y() as u32, _block_dim_z() as u32) }
}

#[inline(always)]
pub fn grid_dim() -> Dim3 {
    // SAFETY: the stdarch special-register reads are `unsafe` only as
    // intrinsics: they read a read-only register and touch no memory.
    unsafe { Dim3::new(_grid_dim_x() as u32, _grid_dim_y() as u32, _grid_dim_z() as u32) }
}

#[inline(always)]
pub fn sync_threads() {
    // SAFETY: `bar.sync 0` touches no memory the compiler tracks; every
    // thread of the block reaching it is [`super::sync_threads`]'s contract
    // (a liveness, not a memory-safety, condition).
    unsafe { _syncthreads() }
}

#[inline(always)]
pub fn lane_id() -> u32 {
    let l: u32;
    // SAFETY: reads the read-only `%laneid` register into a register output; no memory.
    unsafe {
        asm!("mov.u32 {l}, %laneid;", l = out(reg32) l, options(pure, nomem, nostack));
    }
    l
}

#[inline(always)]
pub fn sync_warp(mask: u32) {
    // SAFETY: `bar.warp.sync` has a register operand and touches no memory;
    // every lane of `mask` calling it is the caller's contract (liveness only).
    unsafe {
        asm!("bar.warp.sync {m};", m = in(reg32) mask, options(nostack));
    }
}

#[inline(always)]
pub fn active_mask() -> u32 {
    let m: u32;
    // SAFETY: `activemask` writes a register output and touches no memory.
    unsafe {
        asm!("activemask.b32 {m};", m = out(reg32) m, options(nomem, nostack));
    }
    m
}

#[inline(always)]
pub fn match_any(mask: u32, value: u64) -> u32 {
    let m: u32;
    // SAFETY: `match.any.sync` works on registers only (`nomem`); every lane of
    // `mask` calling it is [`super::match_any`]'s contract (liveness only).
    unsafe {
        asm!("match.any.sync.b64 {m}, {v}, {mask};", m = out(reg32) m, v = in(reg64) value, mask = in(reg32) mask,
             options(nomem, nostack));
    }
    m
}

#[inline(always)]
pub fn ballot(mask: u32, pred: bool) -> u32 {
    let b: u32;
    // SAFETY: `vote.sync` works on registers only (`nomem`); every lane of
    // `mask` calling it is [`super::ballot`]'s contract (liveness only).
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {v}, 0; vote.sync.ballot.b32 {b}, p, {mask}; }}", b = out(reg32) b,
             v = in(reg32) pred as u32, mask = in(reg32) mask, options(nomem, nostack));
    }
    b
}

#[inline(always)]
pub fn shfl(mask: u32, value: u64, src: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: `shfl.sync` works on registers only (`nomem`); every lane of
    // `mask` calling it is [`super::shfl`]'s contract (liveness only).
    unsafe {
        asm!("shfl.sync.idx.b32 {lo}, {a}, {src}, 31, {mask};", lo = out(reg32) lo, a = in(reg32) value as u32,
             src = in(reg32) src, mask = in(reg32) mask, options(nomem, nostack));
        asm!("shfl.sync.idx.b32 {hi}, {a}, {src}, 31, {mask};", hi = out(reg32) hi, a = in(reg32) (value >> 32) as u32,
             src = in(reg32) src, mask = in(reg32) mask, options(nomem, nostack));
    }
    (lo as u64) | ((hi as u64) << 32)
}

/// `bar.red.or.pred` on barrier `id` of `nthreads` threads (0: the block):
/// a barrier that returns whether `pred` held for any participant.
#[inline(always)]
fn barrier_any(id: u32, nthreads: u32, pred: bool) -> bool {
    let any: u32;
    // SAFETY: a barrier instruction with register operands; every
    // participant executes it (the callers' contract, as for bar.sync).
    unsafe {
        if nthreads == 0 {
            asm!(
                "{{ .reg .pred p, q; setp.ne.u32 p, {v}, 0; bar.red.or.pred q, {id}, p; selp.u32 {any}, 1, 0, q; }}",
                v = in(reg32) pred as u32, id = in(reg32) id, any = out(reg32) any, options(nostack)
            );
        } else {
            asm!(
                "{{ .reg .pred p, q; setp.ne.u32 p, {v}, 0; bar.red.or.pred q, {id}, {n}, p; selp.u32 {any}, 1, 0, q; }}",
                v = in(reg32) pred as u32, id = in(reg32) id, n = in(reg32) nthreads, any = out(reg32) any,
                options(nostack)
            );
        }
    }
    any != 0
}

/// The largest `value` of a barrier's participants: one reducing barrier
/// when every value is 0 (the common case), else a bit-by-bit search from
/// the top bit, one reducing barrier per bit; every participant takes the
/// same branches because every barrier hands all of them the same answer.
#[inline(always)]
fn barrier_max(id: u32, nthreads: u32, value: u32) -> u32 {
    if !barrier_any(id, nthreads, value != 0) {
        return 0;
    }
    let mut max = 0u32;
    let mut bit = 32;
    while bit > 0 {
        bit -= 1;
        // Does anyone have the bits found so far, and this one set?
        let want = (max >> bit) | 1;
        if barrier_any(id, nthreads, value >> bit == want) {
            max |= 1 << bit;
        }
    }
    max
}

#[inline(always)]
pub fn sync_threads_max(value: u32) -> u32 {
    barrier_max(0, 0, value)
}

#[inline(always)]
pub fn named_barrier_max(id: u32, nthreads: u32, _first_thread: u32, value: u32) -> u32 {
    barrier_max(id, nthreads, value)
}

#[inline(always)]
pub fn sync_warp_max(mask: u32, value: u32) -> u32 {
    let max: u32;
    // SAFETY: `redux.sync` (sm_80+) with the caller's lane in `mask`, which
    // every lane of `mask` executes (the callers' contract, as for bar.warp.sync).
    unsafe {
        asm!("redux.sync.max.u32 {d}, {v}, {m};", d = out(reg32) max, v = in(reg32) value, m = in(reg32) mask,
             options(nostack));
    }
    max
}

#[inline(always)]
pub fn named_barrier(id: u32, nthreads: u32) {
    // SAFETY: `barrier.sync` with register operands touches no memory;
    // `nthreads` threads arriving is [`super::named_barrier`]'s contract (liveness only).
    unsafe {
        asm!("barrier.sync {id}, {n};", id = in(reg32) id, n = in(reg32) nthreads, options(nostack));
    }
}

#[inline(always)]
pub fn dynamic_shared() -> *mut u8 {
    let p: u64;
    // SAFETY: converts the address of the extern `.shared` array declared above
    // to a generic address in a register; reads no memory.
    unsafe {
        asm!("cvta.shared.u64 {p}, __devcomm_dynamic_smem;", p = out(reg64) p, options(pure, nomem, nostack));
    }
    p as *mut u8
}

#[inline(always)]
pub fn dynamic_shared_size() -> u32 {
    let s: u32;
    // SAFETY: reads the read-only `%dynamic_smem_size` register; no memory.
    unsafe {
        asm!("mov.u32 {s}, %dynamic_smem_size;", s = out(reg32) s, options(pure, nomem, nostack));
    }
    s
}

#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reads the read-only `%globaltimer` register; no memory.
    unsafe {
        asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack));
    }
    t
}

#[inline(always)]
pub fn sm_id() -> u32 {
    let s: u32;
    // SAFETY: reads the read-only `%smid` register; no memory.
    unsafe {
        asm!("mov.u32 {s}, %smid;", s = out(reg32) s, options(nomem, nostack));
    }
    s
}

#[inline(always)]
pub fn spin_backoff(ns: u32) {
    // SAFETY: `nanosleep` only suspends the thread; no memory, no preconditions.
    unsafe {
        asm!("nanosleep.u32 {ns};", ns = in(reg32) ns, options(nomem, nostack));
    }
}

#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` aborts the kernel and never returns (`noreturn` is true);
    // it has no memory-safety preconditions.
    unsafe {
        asm!("trap;", options(noreturn, nostack));
    }
}

/// # Safety
/// As for [`super::load16`]: `p` is valid for reads of 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn load16(p: *const u8) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller's contract makes `[p, p + 16)` valid and 16-byte
    // aligned, as `ld.v4.u32` needs; the asm only reads it (`readonly`).
    unsafe {
        asm!("ld.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, c = out(reg32) c,
             d = out(reg32) d, p = in(reg64) p, options(nostack, readonly));
    }
    [a, b, c, d]
}

/// # Safety
/// As for [`super::store16`]: `p` is valid for writes of 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store16(p: *mut u8, v: [u32; 4]) {
    // SAFETY: the caller's contract makes `[p, p + 16)` valid for writes and
    // 16-byte aligned, as `st.v4.u32` needs; nothing else is written.
    unsafe {
        asm!("st.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};", a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2],
             d = in(reg32) v[3], p = in(reg64) p, options(nostack));
    }
}

/// # Safety
/// As for [`super::load_volatile`]: `p` is valid for reads and aligned.
#[inline(always)]
pub unsafe fn load_volatile<T: Copy>(p: *const T) -> T {
    // SAFETY: the caller's contract: `p` is valid for reads and aligned.
    unsafe { p.read_volatile() }
}

/// # Safety
/// As for [`super::store_volatile`]: `p` is valid for writes and aligned.
#[inline(always)]
pub unsafe fn store_volatile<T: Copy>(p: *mut T, v: T) {
    // SAFETY: the caller's contract: `p` is valid for writes and aligned.
    unsafe { p.write_volatile(v) }
}

/// # Safety
/// As for [`super::load_weak`]: `p` is valid for reads and aligned.
#[inline(always)]
pub unsafe fn load_weak<T: Copy>(p: *const T) -> T {
    // SAFETY: the caller's contract: `p` is valid for reads and aligned.
    unsafe { p.read() }
}
