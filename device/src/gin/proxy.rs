//! The producer side of a GIN proxy ring (see [`crate::abi::gin`] for the protocol).

use crate::abi::gin::{slot_tag, GinDescriptor, GinSlot, GinState, QueueTail, TAIL_STRIDE};
use crate::arch;
use crate::atomic::{self, Order, Scope};
use crate::comm::AbortInfo;
use crate::wait::{Deadline, WaitError};

/// Why posting to or flushing a ring failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueError {
    /// The proxy marked the ring failed (dead peer, transport error).
    RingFailed,
    /// Waiting for credit or completion gave up.
    Wait(WaitError),
}

impl From<WaitError> for QueueError {
    fn from(e: WaitError) -> Self {
        QueueError::Wait(e)
    }
}

#[inline(always)]
fn tail_of(g: &GinState, ring: u64) -> *const QueueTail {
    (g.tails + ring * TAIL_STRIDE as u64) as *const QueueTail
}

/// Whether the proxy marked ring `ring` failed (dead peer, transport error).
///
/// # Safety
/// As for [`completed`].
#[inline(always)]
pub unsafe fn ring_failed(g: &GinState, ring: u64) -> bool {
    let tail = tail_of(g, ring);
    // SAFETY: as in `completed`: ring `ring`'s live, aligned `QueueTail`,
    // whose `error` word the proxy writes only atomically.
    unsafe { atomic::load_relaxed(core::ptr::addr_of!((*tail).error), Scope::Sys) != 0 }
}

/// Tickets completed by the proxy on `ring`, or the ring's failure.
///
/// # Safety
/// `g` describes live GIN memory and `ring < contexts * nranks`.
#[inline(always)]
pub unsafe fn completed(g: &GinState, ring: u64) -> Result<u64, QueueError> {
    let tail = tail_of(g, ring);
    // SAFETY: the caller's contract: `g` is live GIN memory
    // ([`GinState::from_parts`]) and `ring < contexts * nranks`, so `tail`
    // is ring `ring`'s `QueueTail`, aligned at `TAIL_STRIDE`; the proxy
    // writes its words only atomically. `addr_of!` takes the field's address
    // without making a reference.
    let done = unsafe { atomic::load_acquire(core::ptr::addr_of!((*tail).completed), Scope::Sys) };
    // SAFETY: as above, for the tail's `error` word.
    if unsafe { atomic::load_relaxed(core::ptr::addr_of!((*tail).error), Scope::Sys) } != 0 {
        return Err(QueueError::RingFailed);
    }
    Ok(done)
}

impl QueueError {
    /// A non-zero word for passing the error between lanes ([`Self::from_code`] undoes it).
    #[inline(always)]
    const fn code(self) -> u64 {
        match self {
            QueueError::RingFailed => 3,
            QueueError::Wait(w) => w.code() as u64,
        }
    }

    #[inline(always)]
    const fn from_code(code: u64) -> Self {
        match code {
            1 => QueueError::Wait(WaitError::Timeout),
            2 => QueueError::Wait(WaitError::Aborted),
            _ => QueueError::RingFailed,
        }
    }
}

/// Posts `body` to `ring` and returns its ticket. Waits for credit while
/// the ring is full: a descriptor is never dropped. One thread calls it per
/// descriptor.
///
/// With `release`, it first fences at system scope, so what the caller
/// wrote before (a put's source) is visible before the proxy can see the
/// descriptor and read the source; [`super::Gin`] asks for it for puts
/// whose source the caller has not already released at system scope.
/// Other operations carry everything they need in the descriptor.
///
/// Lanes of a warp that post to the same ring together are served as a
/// group (warp aggregation): the lowest takes one ticket per member with a
/// single atomic, waits for credit for all of them (in pieces of at most
/// the ring's depth) and tells the others, which then write their slots. So
/// a warp is one producer to the credit protocol, and its lanes never wait
/// for credit apart, each holding up the tickets of the others.
///
/// A ring the proxy has failed is noticed when credit runs out (or by
/// [`flush_ring`]); until then a post to it is accepted and will not be
/// carried out — as with NCCL, errors surface at the next flush or wait.
///
/// A wait for credit that fails (timeout, abort, failed ring) leaves the
/// tickets taken for it unwritten; they are recorded as abandoned in the
/// ring's tail (see [`crate::abi::gin::QueueTail::abandoned`]), so the
/// proxy fails the ring when it reaches them and every later flush or
/// credit wait on the ring returns [`QueueError::RingFailed`] instead of
/// stalling behind the hole.
///
/// # Safety
/// `g` describes live GIN memory, `ring < contexts * nranks`, and `abort`
/// belongs to the same device communicator.
#[inline]
pub unsafe fn post(
    g: &GinState,
    abort: &AbortInfo,
    ring: u64,
    body: &GinDescriptor,
    release: bool,
) -> Result<u64, QueueError> {
    if release {
        atomic::fence_acq_rel(Scope::Sys);
    }
    let depth = g.queue_depth as u64;
    // SAFETY: the caller's contract: `ring < contexts * nranks`, the number
    // of heads (one u64 per ring), so the offset stays inside that array.
    let head = unsafe { (g.heads as *mut u64).add(ring as usize) };
    // The head's address names the ring across device communicators.
    let group = arch::match_any(arch::active_mask(), head as u64);
    let lane = arch::lane_id();
    let leader = group.trailing_zeros();
    let rank = (group & ((1u32 << lane) - 1)).count_ones() as u64;
    let count = group.count_ones() as u64;
    // SAFETY: the caller's contract: `ring < contexts * nranks`, the number
    // of tail-cache pairs (two u64s per ring), so the offset stays inside.
    let cache = unsafe { (g.tail_cache as *mut u64).add(2 * ring as usize) };
    let (mut first, mut cached) = (0, 0);
    if lane == leader {
        // SAFETY: `head` is this ring's ticket word (above): device memory
        // that lives while the kernel runs, aligned, and only ever accessed atomically.
        first = unsafe { atomic::fetch_add(head, count, Order::Relaxed, Scope::Gpu) };
        // Issued right behind the (relaxed) ticket atomic and independent
        // of it, so the two trips to L2 overlap. Acquire/release on the
        // cache: credit taken from a value another producer cached must also
        // carry that producer's happens-before with the proxy's completion
        // (it read the tail with acquire). Any value read is a valid lower
        // bound: the cache only grows.
        // SAFETY: `cache` is this ring's tail-cache pair (above), aligned
        // device memory accessed only atomically.
        cached = unsafe { atomic::load_acquire(cache, Scope::Gpu) };
    }
    let first = arch::shfl(group, first, leader);
    let mut start = 0;
    while start < count {
        let end = (start + depth).min(count);
        let mut code = 0;
        if lane == leader {
            // Credit for the piece's last ticket covers the piece (completion is in order).
            let last = first + end - 1;
            if start > 0 {
                // Later pieces: what the previous piece's wait left in the cache.
                // SAFETY: as for the first load of `cache` above.
                cached = unsafe { atomic::load_acquire(cache, Scope::Gpu) };
            }
            if last >= cached + depth {
                // Credit for `last` once ticket `last - depth` has completed.
                // SAFETY: our own contract (live `g`, `ring` in range, `abort`
                // of the same communicator) and `cache` is `ring`'s tail-cache pair.
                if let Err(e) = unsafe { wait_completed(g, abort, ring, last + 1 - depth, cache) } {
                    code = e.code();
                    // Tickets `first + start ..` are ours and will never be
                    // written: say so, or the proxy (serving in ticket
                    // order) and every later post on the ring wait forever.
                    // SAFETY: our own contract (live `g`, `ring` in range)
                    // and `cache` is `ring`'s tail-cache pair.
                    unsafe { abandon(g, ring, first + start, code, cache) };
                }
            }
        }
        let code = arch::shfl(group, code, leader);
        if code != 0 {
            return Err(QueueError::from_code(code));
        }
        // Orders the leader's acquire of the credit before the slot stores.
        arch::sync_warp(group);
        if (start..end).contains(&rank) {
            // SAFETY: our own contract for `g` and `ring`; this lane holds
            // ticket `first + rank` (the leader's fetch_add took `count`
            // tickets for the group) and its credit (the leader waited until
            // ticket `first + end - 1 - depth` completed, and the
            // `sync_warp` above orders that acquire before this write).
            unsafe { write_slot(g, ring, first + rank, body) };
        }
        start = end;
    }
    Ok(first + rank)
}

/// Records that this producer gave up ticket `ticket` of `ring` (and the
/// tickets after it that it holds) for `cause` (a [`QueueError`] code,
/// which are the `ABANDON_*` causes): the tail's
/// [`abandoned`](crate::abi::gin::QueueTail::abandoned) word, which the proxy
/// reads when it finds the slot empty (it then fails the ring), and the
/// failed stamp of the tail cache, so that every waiter for credit and
/// every flush of this ring on this device ends at once with
/// [`QueueError::RingFailed`] — none of them could succeed past the hole.
///
/// # Safety
/// As for [`post`]; `cache` is `ring`'s tail-cache pair.
#[cold]
#[inline(never)]
unsafe fn abandon(g: &GinState, ring: u64, ticket: u64, cause: u64, cache: *mut u64) {
    // A failed ring was failed by the proxy (which serves it no more) or by
    // an earlier producer's abandon (recorded already): the first record,
    // which names the lowest hole, stays. (A load, then a store: host memory
    // may not take system-scope atomics from the device; two producers
    // timing out together may both write, and either record fails the ring.)
    if cause != QueueError::RingFailed.code() {
        let tail = tail_of(g, ring) as *mut QueueTail;
        // SAFETY: ring `ring`'s live, aligned `QueueTail` (the caller's
        // contract); its `abandoned` word is written only by producers and
        // read by the proxy, all atomically. `addr_of_mut!` makes no reference.
        let word = unsafe { core::ptr::addr_of_mut!((*tail).abandoned) };
        // SAFETY: as above.
        if unsafe { atomic::load_relaxed(word, Scope::Sys) } == 0 {
            // SAFETY: as above.
            unsafe { atomic::store_relaxed(word, crate::abi::gin::abandon_word(ticket, cause), Scope::Sys) };
        }
    }
    // SAFETY: the stamp word of `ring`'s tail-cache pair (the caller's
    // contract), device memory accessed only atomically.
    unsafe { atomic::store_relaxed(cache.add(1), READ_FAILED, Scope::Gpu) };
}

/// Writes `body` as ticket `ticket`'s slot of `ring`: eight tagged words
/// ([`GinSlot`]) as four 16-byte relaxed system-scope stores. No fence: the
/// proxy recognises a complete slot by its tags (each word is single-copy
/// atomic), and the caller's data a put reads was fenced by [`post`].
///
/// # Safety
/// As for [`post`]; the caller holds `ticket` and its credit.
#[inline(always)]
unsafe fn write_slot(g: &GinState, ring: u64, ticket: u64, body: &GinDescriptor) {
    let depth = g.queue_depth as u64;
    // SAFETY: the caller's contract: `ring < contexts * nranks` and
    // `ticket % depth < depth`, so the index is inside the rings' array of
    // `contexts * nranks * depth` slots.
    let slot = unsafe { (g.rings as *mut GinSlot).add((ring * depth + ticket % depth) as usize) };
    let w = GinSlot::encode(body, slot_tag(ticket, g.queue_depth)).words;
    let base = slot as *mut u64;
    for i in 0..4 {
        // SAFETY: words `2i, 2i + 1` (i < 4) of the 64-byte slot above,
        // which the caller's ticket and credit give to this thread alone
        // among producers; slots are 64-byte aligned (`GinSlot`'s
        // alignment), so each pair is 16-byte aligned; the proxy reads them
        // only atomically.
        unsafe { atomic::store_pair_relaxed(base.add(2 * i), [w[2 * i], w[2 * i + 1]], Scope::Sys) };
    }
}

/// Shortest time, in ns, between two reads of a ring's tail by its waiting
/// producers and flushers together: the tail is host memory, each read
/// crosses PCIe, and the waiters' activity competes with the proxy's device
/// work. Measured on 2 × H200: with thousands of threads waiting for
/// credit, a 500 ns interval and naps of at most 1 µs slowed the proxy's
/// stream work (copies and fences) 1000-fold — 8-byte put-values from
/// 64 × 128 threads fell to 0.16 M/s — while 4 µs and naps of up to 8 µs
/// keep 4.5–7.2 M/s on every grid shape
/// (benches/results/2026-11-23-h200x2-gin-landing.md). A credit seen up to
/// 4 µs late costs little: a ring that is full holds `depth` operations of
/// work for the proxy.
pub const TAIL_READ_INTERVAL_NS: u64 = 4000;

/// The read stamp of a failed ring: every waiter gives up.
const READ_FAILED: u64 = u64::MAX;

/// Longest nap, in ns, of a waiter between two looks at the tail cache.
const MAX_NAP_NS: u64 = 8192;

/// A waiter naps this many ns per ticket it still needs (up to
/// [`MAX_NAP_NS`]): one ticket away, it looks again soon.
const NAP_PER_TICKET_NS: u64 = 64;

/// Polls between two calls of the waiter's [`Deadline::poll`] (which reads
/// the clock every `CHECK_EVERY` calls).
const ABORT_CHECK_EVERY: u32 = 16;

/// The best known completion of `ring`: its tail cache, refreshed from the
/// proxy's tail if no waiter has read that within [`TAIL_READ_INTERVAL_NS`]
/// (one waiter wins the right to read it; the others use the cache).
///
/// # Safety
/// As for [`post`]; `cache` is `ring`'s tail-cache pair.
#[inline(never)]
unsafe fn best_completed(g: &GinState, ring: u64, cache: *mut u64) -> Result<u64, QueueError> {
    // Acquire/release on the cache: credit taken from a value another
    // waiter cached must also carry that waiter's happens-before with the
    // proxy's completion (it read the tail with acquire).
    // SAFETY: the caller's contract: `cache` is `ring`'s tail-cache pair,
    // aligned device memory that every producer accesses only atomically;
    // `stamp` is its second word.
    let cached = unsafe { atomic::load_acquire(cache, Scope::Gpu) };
    // SAFETY: as above: the pair's second word, in bounds.
    let stamp = unsafe { cache.add(1) };
    // SAFETY: as above.
    let last = unsafe { atomic::load_relaxed(stamp, Scope::Gpu) };
    if last == READ_FAILED {
        return Err(QueueError::RingFailed);
    }
    let now = arch::global_timer_ns();
    if now.wrapping_sub(last) < TAIL_READ_INTERVAL_NS
        // SAFETY: as above (the stamp word of `ring`'s pair).
        || unsafe { atomic::compare_exchange(stamp, last, now, Order::Relaxed, Scope::Gpu) } != last
    {
        return Ok(cached);
    }
    // SAFETY: the caller's contract: live `g` and `ring < contexts * nranks`.
    match unsafe { completed(g, ring) } {
        Ok(done) if done > cached => {
            // SAFETY: as above (the cache word of `ring`'s pair).
            unsafe { atomic::fetch_max(cache, done, Order::Release, Scope::Gpu) };
            Ok(done)
        }
        Ok(_) => Ok(cached),
        Err(e) => {
            // SAFETY: as above (the stamp word of `ring`'s pair).
            unsafe { atomic::store_relaxed(stamp, READ_FAILED, Scope::Gpu) };
            Err(e)
        }
    }
}

/// Waits until `ring` has completed `need` tickets: naps in proportion to
/// the distance (at most [`MAX_NAP_NS`]) between looks at the tail cache,
/// which [`best_completed`] refreshes at most every
/// [`TAIL_READ_INTERVAL_NS`] for all waiters together. The clock is read
/// every [`ABORT_CHECK_EVERY`] × `CHECK_EVERY` polls, the abort flag as
/// [`Deadline`] reads it (once per `wait::ABORT_CHECK_NS` of waiting).
///
/// # Safety
/// As for [`post`]; `cache` is `ring`'s tail-cache pair.
#[inline(never)]
unsafe fn wait_completed(
    g: &GinState,
    abort: &AbortInfo,
    ring: u64,
    need: u64,
    cache: *mut u64,
) -> Result<(), QueueError> {
    let mut deadline = Deadline::new(abort);
    let mut polls = 0u32;
    loop {
        // SAFETY: our own contract, passed on unchanged.
        let done = unsafe { best_completed(g, ring, cache) }?;
        if done >= need {
            return Ok(());
        }
        crate::arch::spin_backoff(((need - done) * NAP_PER_TICKET_NS).min(MAX_NAP_NS) as u32);
        polls = polls.wrapping_add(1);
        if polls % ABORT_CHECK_EVERY == 0 {
            deadline.poll()?;
        }
    }
}

/// Waits until the proxy has completed every ticket taken on `ring` so far
/// (sources read, local actions applied).
///
/// # Safety
/// As for [`post`].
#[inline]
pub unsafe fn flush_ring(g: &GinState, abort: &AbortInfo, ring: u64) -> Result<(), QueueError> {
    // SAFETY: the caller's contract: live `g` and `ring < contexts * nranks`,
    // so this is ring `ring`'s ticket word, aligned device memory accessed
    // only atomically.
    let target = unsafe { atomic::load_relaxed((g.heads as *const u64).add(ring as usize), Scope::Gpu) };
    // SAFETY: as above: `ring`'s pair of the tail-cache array.
    let cache = unsafe { (g.tail_cache as *mut u64).add(2 * ring as usize) };
    // A flush must see the tail itself (failures included) at least once.
    // SAFETY: our own contract, passed on.
    if unsafe { completed(g, ring) }? >= target {
        return Ok(());
    }
    // SAFETY: our own contract; `cache` is `ring`'s tail-cache pair.
    unsafe { wait_completed(g, abort, ring, target, cache) }
}
