//! Waiting on memory: wrap-safe comparisons, timeouts, and the abort flag.
//!
//! Every device-side spin loop in devcomm goes through [`Deadline::poll`]: it
//! reads the clock every [`CHECK_EVERY`] misses and the host's abort flag
//! every [`ABORT_CHECK_NS`] of waiting, so a dead peer or
//! `Communicator::abort()` ends the wait with a [`WaitError`] instead of
//! hanging the GPU. The checks are amortised so the hot path of a wait is one
//! load and one compare.
//!
//! Counters and epochs roll over: compare them with [`rolling_ge_u32`] /
//! [`rolling_ge_u64`] ("has `a` reached `b`", valid while the two are less
//! than half the range apart), never with `>=`.

use crate::arch;
use crate::atomic::{self, Scope};
use crate::comm::AbortInfo;

/// How many failed polls pass between two reads of the clock.
pub const CHECK_EVERY: u32 = 64;

/// How long a wait runs between two reads of the host's abort flag (the
/// first after this long). The flag lies in host memory: a read crosses
/// PCIe, and on 2 × H200 such reads, made every 64 misses by the waiting
/// threads of 64-CTA collectives, cost some waits about 50 µs each — the
/// random ~100 µs per call of collectives on more than 32 CTAs
/// (`benches/results/2026-11-24-h200x2-push.md`). Aborting is rare; its
/// latency may be this long.
pub const ABORT_CHECK_NS: u64 = 1_000_000;

/// The first this many polls of a wait are acquire loads; later ones are
/// relaxed, with one acquire re-read when the target shows
/// ([`poll_acquire`]). A wait that ends quickly — a signal round trip —
/// then pays no re-read (it cost 2–3 µs per GIN round trip when every wait
/// re-read), and a long wait does not invalidate its SM's L1 at every miss.
pub const ACQUIRE_POLLS: u32 = 16;

/// Why a wait gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WaitError {
    /// The deadline passed.
    Timeout = 1,
    /// The host raised the communicator's abort flag.
    Aborted = 2,
}

impl WaitError {
    /// A code for an error word the host reads (0 means no error).
    #[inline(always)]
    pub const fn code(self) -> u32 {
        self as u32
    }
}

/// `a` has reached `b` in wrapping `u32` arithmetic.
#[inline(always)]
pub const fn rolling_ge_u32(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// `a` has reached `b` in wrapping `u64` arithmetic.
#[inline(always)]
pub const fn rolling_ge_u64(a: u64, b: u64) -> bool {
    (a.wrapping_sub(b) as i64) >= 0
}

/// The end of a wait: an abort flag to watch and an optional time limit.
///
/// The clock is first read at the first check (after [`CHECK_EVERY`]
/// misses), not when the deadline is made: a wait that succeeds quickly —
/// the latency-critical case — never reads `%globaltimer`, nor the abort
/// flag (first read [`ABORT_CHECK_NS`] after that). The time limit
/// therefore runs from a few polls after the wait began.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// Failed polls so far: counted in a register, apart from the clock,
    /// which only the out-of-line check touches.
    misses: u32,
    clock: Clock,
}

/// What a [`Deadline`]'s checks read and update, handed to the
/// out-of-line check and back by value: a reference to it would keep the
/// whole deadline, its miss count too, in local memory, a load and a store
/// on every poll.
#[derive(Clone, Copy, Debug)]
struct Clock {
    flag: *const u32,
    timeout_ns: u64,
    /// 0 until the first check; then the absolute end (`u64::MAX`: none).
    end_ns: u64,
    /// When the abort flag is next read (set at the first check).
    flag_ns: u64,
}

impl Deadline {
    /// A deadline `abort.timeout_ns` from now (none if 0), watching `abort.flag`.
    #[inline(always)]
    pub fn new(abort: &AbortInfo) -> Self {
        Self::with_timeout(abort, abort.timeout_ns)
    }

    /// A deadline `timeout_ns` from now (0: no time limit), watching `abort.flag`.
    #[inline(always)]
    pub fn with_timeout(abort: &AbortInfo, timeout_ns: u64) -> Self {
        Deadline { misses: 0, clock: Clock { flag: abort.flag as *const u32, timeout_ns, end_ns: 0, flag_ns: 0 } }
    }

    /// Call after each failed poll: every [`CHECK_EVERY`] calls, backs off
    /// briefly and returns an error if time is up or (read every
    /// [`ABORT_CHECK_NS`]) the host aborted.
    #[inline(always)]
    pub fn poll(&mut self) -> Result<(), WaitError> {
        self.misses = self.misses.wrapping_add(1);
        if self.misses % CHECK_EVERY != 0 {
            return Ok(());
        }
        self.clock = self.clock.check()?;
        Ok(())
    }
}

impl Clock {
    /// The clock after one more check, or why the wait ends.
    #[inline(never)]
    fn check(mut self) -> Result<Clock, WaitError> {
        let now = arch::global_timer_ns();
        if self.end_ns == 0 {
            self.end_ns = if self.timeout_ns == 0 { u64::MAX } else { now.saturating_add(self.timeout_ns) };
            self.flag_ns = now.saturating_add(ABORT_CHECK_NS);
        } else if now > self.end_ns {
            return Err(WaitError::Timeout);
        } else if now >= self.flag_ns {
            self.flag_ns = now.saturating_add(ABORT_CHECK_NS);
            // SAFETY: `flag` is null or the host-mapped abort word of a live
            // communicator (set by the host crate when it builds `AbortInfo`).
            if !self.flag.is_null() && unsafe { atomic::load_relaxed(self.flag, Scope::Sys) } != 0 {
                return Err(WaitError::Aborted);
            }
        }
        arch::spin_backoff(20);
        Ok(self)
    }
}

/// One poll of an acquiring wait: `Some(v)` once the word at `p` has reached
/// `target` (`reached`), with `v` read by an acquire load.
///
/// The poll itself is a relaxed load; only a poll that sees the target
/// re-reads the word with acquire. That re-read returns the value seen or a
/// later one (coherence), so it synchronises with the release that wrote
/// the target — the same guarantee as acquiring every poll — while the
/// misses stay plain loads. (An acquire load on sm_90 also invalidates the
/// SM's L1; done on every miss it slowed the other warps of the SM: with
/// every poll of a wait relaxed the GIN 8-byte `put_value` rate was
/// 1.2–1.5× higher, `benches/results/2026-11-23-h200x2-collectives.md`.) A fence
/// after a relaxed poll would be cheaper still but is also a *release*: it
/// would publish the waiter's own earlier stores and hide a writer's
/// missing release, which the strict emulator must be able to catch.
///
/// # Safety
/// `p` is valid and aligned; its writers use atomic operations.
#[inline(always)]
pub unsafe fn poll_acquire<T: atomic::AtomicWord>(p: *const T, scope: Scope, reached: impl Fn(T) -> bool) -> Option<T> {
    // SAFETY: the caller's contract: `p` is valid and aligned, written
    // only atomically.
    if !reached(unsafe { atomic::load_relaxed(p, scope) }) {
        return None;
    }
    // SAFETY: as above.
    let v = unsafe { atomic::load_acquire(p, scope) };
    reached(v).then_some(v)
}

/// Spins until the `u64` at `p` has reached `target` (rolling), with the
/// acquire semantics of an acquire load that reads it ([`poll_acquire`]).
/// Returns the value seen.
///
/// # Safety
/// `p` is valid and aligned; its writers use atomic operations.
#[inline(always)]
pub unsafe fn wait_ge_u64(p: *const u64, target: u64, scope: Scope, deadline: &mut Deadline) -> Result<u64, WaitError> {
    // SAFETY: the caller's contract, as `wait_until` requires.
    unsafe { wait_until(p, scope, deadline, |v| rolling_ge_u64(v, target)) }
}

/// As [`wait_ge_u64`] for a `u32`.
///
/// # Safety
/// As for [`wait_ge_u64`].
#[inline(always)]
pub unsafe fn wait_ge_u32(p: *const u32, target: u32, scope: Scope, deadline: &mut Deadline) -> Result<u32, WaitError> {
    // SAFETY: the caller's contract, as `wait_until` requires.
    unsafe { wait_until(p, scope, deadline, |v| rolling_ge_u32(v, target)) }
}

/// Spins until the word at `p` is `reached`, with the semantics of an
/// acquire load that reads it ([`poll_after`]). Returns the value seen.
///
/// # Safety
/// As for [`wait_ge_u64`].
#[inline(always)]
pub unsafe fn wait_until<T: atomic::AtomicWord>(
    p: *const T,
    scope: Scope,
    deadline: &mut Deadline,
    reached: impl Fn(T) -> bool,
) -> Result<T, WaitError> {
    let mut misses = 0u32;
    loop {
        // SAFETY: the caller's contract, as `poll_after` requires.
        if let Some(v) = unsafe { poll_after(p, scope, misses, &reached) } {
            return Ok(v);
        }
        misses = misses.saturating_add(1);
        deadline.poll()?;
    }
}

/// One poll of an acquiring wait that has missed `misses` times: an
/// acquire load for the first [`ACQUIRE_POLLS`], then [`poll_acquire`].
///
/// # Safety
/// As for [`poll_acquire`].
#[inline(always)]
pub unsafe fn poll_after<T: atomic::AtomicWord>(
    p: *const T,
    scope: Scope,
    misses: u32,
    reached: impl Fn(T) -> bool,
) -> Option<T> {
    if misses < ACQUIRE_POLLS {
        // SAFETY: the caller's contract: `p` is valid and aligned, written
        // only atomically, as `load_acquire` requires.
        let v = unsafe { atomic::load_acquire(p, scope) };
        reached(v).then_some(v)
    } else {
        // SAFETY: as above, as `poll_acquire` requires.
        unsafe { poll_acquire(p, scope, reached) }
    }
}

/// As [`wait_ge_u32`] with every poll an acquire load: the wait ends with
/// the load that saw the target, no re-read. For waits whose threads'
/// neighbours wait too (a barrier: the rest of the coop waits at its
/// `agree`), where the re-read of [`poll_acquire`] would put one more
/// memory round trip after the last arrival on every wait longer than
/// [`ACQUIRE_POLLS`] polls, and the L1 invalidation of each acquire slows
/// nobody of the coop.
///
/// # Safety
/// As for [`wait_ge_u64`].
#[inline(always)]
pub unsafe fn wait_ge_u32_acquiring(
    p: *const u32,
    target: u32,
    scope: Scope,
    deadline: &mut Deadline,
) -> Result<u32, WaitError> {
    // SAFETY: the caller's contract (as for `wait_ge_u64`): `p` is valid and
    // aligned, written only atomically.
    spin(deadline, || unsafe { atomic::load_acquire(p, scope) }, |v| rolling_ge_u32(v, target))
}

/// Polls `load` until its value is `reached`, with `deadline`'s checks
/// between misses: the loop of the waits whose every poll is the same load
/// (relaxed, or acquiring each time).
#[inline(always)]
fn spin<T: Copy>(deadline: &mut Deadline, load: impl Fn() -> T, reached: impl Fn(T) -> bool) -> Result<T, WaitError> {
    loop {
        let v = load();
        if reached(v) {
            return Ok(v);
        }
        deadline.poll()?;
    }
}

/// As [`wait_ge_u32`] but with a relaxed load (for waits whose data needs no
/// ordering, or that are followed by an explicit fence).
///
/// # Safety
/// As for [`wait_ge_u64`].
#[inline(always)]
pub unsafe fn wait_ge_u32_relaxed(
    p: *const u32,
    target: u32,
    scope: Scope,
    deadline: &mut Deadline,
) -> Result<u32, WaitError> {
    // SAFETY: the caller's contract (as for `wait_ge_u64`): `p` is valid and
    // aligned, written only atomically.
    spin(deadline, || unsafe { atomic::load_relaxed(p, scope) }, |v| rolling_ge_u32(v, target))
}

/// As [`wait_ge_u64`] but with relaxed loads: for a word that is its own
/// data (nothing its writer stored before it needs ordering; the count
/// words of a streamed MoE receive). Returns the value seen.
///
/// # Safety
/// As for [`wait_ge_u64`].
#[inline(always)]
pub unsafe fn wait_ge_u64_relaxed(
    p: *const u64,
    target: u64,
    scope: Scope,
    deadline: &mut Deadline,
) -> Result<u64, WaitError> {
    // SAFETY: the caller's contract (as for `wait_ge_u64`): `p` is valid and
    // aligned, written only atomically.
    spin(deadline, || unsafe { atomic::load_relaxed(p, scope) }, |v| rolling_ge_u64(v, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_comparisons_survive_wrap() {
        assert!(rolling_ge_u32(5, 5));
        assert!(rolling_ge_u32(6, 5));
        assert!(!rolling_ge_u32(4, 5));
        assert!(rolling_ge_u32(2, u32::MAX - 1)); // wrapped past
        assert!(!rolling_ge_u32(u32::MAX - 1, 2));
        assert!(rolling_ge_u64(1, u64::MAX));
        assert!(!rolling_ge_u64(u64::MAX, 1));
    }
}
