//! The producer side of a GIN proxy ring (see [`super::abi`] for the protocol).

use super::abi::{GinDescriptor, GinState, QueueTail, TAIL_STRIDE};
use crate::arch::{self, store16};
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

/// Tickets completed by the proxy on `ring`, or the ring's failure.
///
/// # Safety
/// `g` describes live GIN memory and `ring < contexts * nranks`.
#[inline(always)]
pub unsafe fn completed(g: &GinState, ring: u64) -> Result<u64, QueueError> {
    let tail = tail_of(g, ring);
    let done = unsafe { atomic::load_acquire(core::ptr::addr_of!((*tail).completed), Scope::Sys) };
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

/// Posts `body` to `ring` (its `ticket_plus_one` is ignored) and returns its
/// ticket. Waits for credit while the ring is full: a descriptor is never
/// dropped. One thread calls it per descriptor.
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
/// # Safety
/// `g` describes live GIN memory, `ring < contexts * nranks`, and `abort`
/// belongs to the same device communicator.
#[inline]
pub unsafe fn post(g: &GinState, abort: &AbortInfo, ring: u64, body: &GinDescriptor) -> Result<u64, QueueError> {
    let depth = g.queue_depth as u64;
    let head = unsafe { (g.heads as *mut u64).add(ring as usize) };
    // The head's address names the ring across device communicators.
    let group = arch::match_any(arch::active_mask(), head as u64);
    let lane = arch::lane_id();
    let leader = group.trailing_zeros();
    let rank = (group & ((1u32 << lane) - 1)).count_ones() as u64;
    let count = group.count_ones() as u64;
    let mut first = 0;
    if lane == leader {
        first = unsafe { atomic::fetch_add(head, count, Order::Relaxed, Scope::Gpu) };
    }
    let first = arch::shfl(group, first, leader);
    let cache = unsafe { (g.tail_cache as *mut u64).add(ring as usize) };
    let mut start = 0;
    while start < count {
        let end = (start + depth).min(count);
        let mut code = 0;
        if lane == leader {
            // Credit for the piece's last ticket covers the piece (completion is in order).
            let last = first + end - 1;
            // Acquire/release on the cache: credit taken from a value another
            // producer cached must also carry that producer's happens-before
            // with the proxy's completion (it read the tail with acquire).
            let cached = unsafe { atomic::load_acquire(cache, Scope::Gpu) };
            if last >= cached + depth {
                if let Err(e) = unsafe { wait_credit(g, abort, ring, (first + start, last), cache) } {
                    code = e.code();
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
            unsafe { write_slot(g, ring, first + rank, body) };
        }
        start = end;
    }
    Ok(first + rank)
}

/// Writes `body` as ticket `ticket`'s slot of `ring`: the body (bytes 8..64)
/// as one 8-byte and three 16-byte stores, then the ticket with release, so
/// the proxy never sees a ticket before its body.
///
/// # Safety
/// As for [`post`]; the caller holds `ticket` and its credit.
#[inline(always)]
unsafe fn write_slot(g: &GinState, ring: u64, ticket: u64, body: &GinDescriptor) {
    let depth = g.queue_depth as u64;
    let slot = unsafe { (g.rings as *mut GinDescriptor).add((ring * depth + ticket % depth) as usize) };
    let words: &[u32; 16] = unsafe { &*(body as *const GinDescriptor as *const [u32; 16]) };
    let base = slot as *mut u8;
    unsafe {
        (base.add(8) as *mut u64).write_volatile((words[2] as u64) | ((words[3] as u64) << 32));
        store16(base.add(16), [words[4], words[5], words[6], words[7]]);
        store16(base.add(32), [words[8], words[9], words[10], words[11]]);
        store16(base.add(48), [words[12], words[13], words[14], words[15]]);
        atomic::store_release(core::ptr::addr_of_mut!((*slot).ticket_plus_one), ticket + 1, Scope::Sys);
    }
}

/// Producers whose first ticket is at most this many tickets past the
/// credit read the proxy's tail over PCIe (about the front warp's group);
/// those further back watch the tail cache in device memory, which every
/// tail read refreshes, so thousands of blocked producers do not flood the
/// bus the proxy and the copy engine also need.
pub const TAIL_POLLERS: u64 = 32;

/// Longest nap, in ns, of a producer far from credit between two looks at the tail cache.
const MAX_NAP_NS: u64 = 1024;

/// Waits for credit for tickets `lo..=hi` of `ring` (the ring is full): see
/// [`TAIL_POLLERS`]. A producer further back naps in proportion to its
/// distance from the credit (at most [`MAX_NAP_NS`]), and still reads the
/// tail itself every [`BACK_CHECK_EVERY`] polls, so a failed ring is
/// noticed by all.
///
/// # Safety
/// As for [`post`]; `cache` is `ring`'s tail-cache word.
#[inline(never)]
unsafe fn wait_credit(
    g: &GinState,
    abort: &AbortInfo,
    ring: u64,
    (lo, hi): (u64, u64),
    cache: *mut u64,
) -> Result<(), QueueError> {
    let depth = g.queue_depth as u64;
    let mut deadline = Deadline::new(abort);
    let mut polls = 0u32;
    loop {
        // Acquire/release on the cache: credit taken from a value another
        // producer cached must also carry that producer's happens-before
        // with the proxy's completion (it read the tail with acquire).
        let cached = unsafe { atomic::load_acquire(cache, Scope::Gpu) };
        if hi < cached + depth {
            return Ok(());
        }
        let behind = lo.saturating_sub(cached + depth);
        polls = polls.wrapping_add(1);
        let front = behind < TAIL_POLLERS;
        if front || polls % BACK_CHECK_EVERY == 0 {
            let done = unsafe { completed(g, ring) }?;
            if done > cached {
                unsafe { atomic::fetch_max(cache, done, Order::Release, Scope::Gpu) };
            }
            if hi < done + depth {
                return Ok(());
            }
        }
        if !front {
            // Roughly the time the proxy needs for the tickets ahead.
            crate::arch::spin_backoff((behind * 16).min(MAX_NAP_NS) as u32);
        }
        // The abort flag is host memory too: producers further back look at it less often.
        if front || polls % (BACK_CHECK_EVERY / crate::wait::CHECK_EVERY) == 0 {
            deadline.poll()?;
        }
    }
}

/// Polls between two reads of the tail (and, through [`Deadline`], of the
/// abort flag) by a producer that is not at the front: both are host
/// memory, and every such read crosses PCIe.
const BACK_CHECK_EVERY: u32 = 1024;

/// Waits until the proxy has completed every ticket taken on `ring` so far
/// (sources read, local actions applied).
///
/// # Safety
/// As for [`post`].
#[inline]
pub unsafe fn flush_ring(g: &GinState, abort: &AbortInfo, ring: u64) -> Result<(), QueueError> {
    let target = unsafe { atomic::load_relaxed((g.heads as *const u64).add(ring as usize), Scope::Gpu) };
    let mut deadline = Deadline::new(abort);
    loop {
        let done = unsafe { completed(g, ring) }?;
        if done >= target {
            return Ok(());
        }
        // Many flushers at once must not flood PCIe with reads of the tail.
        crate::arch::spin_backoff(((target - done) * 16).min(MAX_NAP_NS) as u32);
        deadline.poll()?;
    }
}
