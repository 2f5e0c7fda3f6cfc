//! Low-latency (LL) transfers for small messages.
//!
//! A put followed by a release-signal costs a system-scope fence on the
//! sender; for a few bytes that fence *is* the latency. An LL transfer needs
//! none: every 8-byte word of the destination slot carries 4 bytes of payload
//! and a 4-byte flag, written with one relaxed system-scope 64-bit store
//! (single-copy atomic). The receiver polls its own slot; once every word
//! shows the expected flag, the payload is there. Arrival *is* the signal.
//!
//! The price: a slot takes twice the payload's bytes, and the flag must be
//! new on every use of a slot (count rounds from 1; a slot starts zeroed).
//! The same idea underlies NCCL's LL protocol.

use crate::atomic::{self, Scope};
use crate::comm::AbortInfo;
use crate::coop::Coop;
use crate::wait::{Deadline, WaitError};

/// Bytes of LL slot needed to carry `bytes` of payload.
pub const fn slot_bytes(bytes: usize) -> usize {
    bytes.div_ceil(4) * 8
}

/// Payload word `w` of `src`: bytes `4w..min(4w + 4, bytes)`, little-endian.
///
/// # Safety
/// `src` is valid for reads of `bytes` bytes and `4 * w < bytes`.
#[inline(always)]
unsafe fn read_word(src: *const u8, bytes: usize, w: usize) -> u32 {
    let at = w * 4;
    if at + 4 <= bytes && (src as usize) % 4 == 0 {
        // SAFETY: `at + 4 <= bytes`, so the 4 bytes are inside `src` (the
        // caller's contract), and `src` and `at` are multiples of 4, so the
        // `u32` is aligned.
        unsafe { crate::arch::load_volatile(src.add(at) as *const u32) }
    } else {
        let mut v = 0u32;
        for k in 0..(bytes - at).min(4) {
            // SAFETY: `at + k < bytes` (`k < bytes - at`, and `at < bytes` by
            // the caller's contract): inside `src`.
            v |= (unsafe { crate::arch::load_volatile(src.add(at + k)) } as u32) << (8 * k);
        }
        v
    }
}

/// Stores payload word `w` to `dst`: bytes `4w..min(4w + 4, bytes)`.
///
/// # Safety
/// `dst` is valid for writes of `bytes` bytes, `4 * w < bytes`, and no other
/// thread accesses those bytes meanwhile.
#[inline(always)]
unsafe fn write_word(dst: *mut u8, bytes: usize, w: usize, v: u32) {
    let at = w * 4;
    if at + 4 <= bytes && (dst as usize) % 4 == 0 {
        // SAFETY: `at + 4 <= bytes`, so the 4 bytes are inside `dst` (the
        // caller's contract), and `dst` and `at` are multiples of 4, so the
        // `u32` is aligned; the caller owns these bytes.
        unsafe { crate::arch::store_volatile(dst.add(at) as *mut u32, v) }
    } else {
        for k in 0..(bytes - at).min(4) {
            // SAFETY: `at + k < bytes` (`k < bytes - at`, and `at < bytes` by
            // the caller's contract): inside `dst`, owned by the caller.
            unsafe { crate::arch::store_volatile(dst.add(at + k), (v >> (8 * k)) as u8) };
        }
    }
}

/// Sends `bytes` from `src` into the LL slot at `slot` (usually an LSA
/// peer's), tagged with `flag`, spread over `coop`. Returns without waiting:
/// the receiver's [`wait`] completes when the words land.
///
/// # Safety
/// `slot` is 8-byte aligned with [`slot_bytes`]`(bytes)` bytes; `src` valid
/// for `bytes`; `flag != 0` and different from the slot's previous flag;
/// every thread of `coop` calls with the same arguments.
#[inline]
pub unsafe fn put<C: Coop>(coop: &C, slot: *mut u64, src: *const u8, bytes: usize, flag: u32) {
    let words = bytes.div_ceil(4);
    let mut w = coop.thread_rank() as usize;
    while w < words {
        // SAFETY: `w < words = ceil(bytes / 4)`, so `4w < bytes`; `src` is
        // valid for `bytes` (the caller's contract).
        let v = ((flag as u64) << 32) | unsafe { read_word(src, bytes, w) } as u64;
        // SAFETY: `w < words` and the slot holds `slot_bytes(bytes) = 8 *
        // words` bytes, 8-byte aligned (the caller's contract); the sender
        // stores and the receiver loads slot words only atomically.
        unsafe { atomic::store_relaxed(slot.add(w), v, Scope::Sys) };
        w += coop.size() as usize;
    }
}

/// Waits until every word of the caller's LL slot at `slot` carries `flag`,
/// copies the payload to `dst`, and joins the coop. Gives up on the abort
/// flag or timeout of `abort`; every thread of the coop gets the same result
/// (the coop is joined either way).
///
/// # Safety
/// As for [`put`], with `dst` valid for `bytes`.
#[inline]
pub unsafe fn wait<C: Coop>(
    coop: &C,
    slot: *const u64,
    dst: *mut u8,
    bytes: usize,
    flag: u32,
    abort: &AbortInfo,
) -> Result<(), WaitError> {
    let words = bytes.div_ceil(4);
    let mut deadline = Deadline::new(abort);
    let mut result = Ok(());
    let mut w = coop.thread_rank() as usize;
    while w < words && result.is_ok() {
        loop {
            // SAFETY: `w < words`: inside the 8-byte aligned slot of
            // `slot_bytes(bytes)` bytes (the caller's contract); slot words
            // are only accessed atomically (as in `put`).
            let v = unsafe { atomic::load_relaxed(slot.add(w), Scope::Sys) };
            if (v >> 32) as u32 == flag {
                // SAFETY: `4w < bytes`; `dst` is valid for `bytes` (the
                // caller's contract) and word `w` is this thread's alone
                // (threads take `w = thread_rank, + size, ...`).
                unsafe { write_word(dst, bytes, w, v as u32) };
                break;
            }
            if let Err(e) = deadline.poll() {
                result = Err(e);
                break;
            }
        }
        w += coop.size() as usize;
    }
    coop.agree(result)
}
