//! The consumer side of the descriptor rings (the producer is
//! `devcomm_device::gin::proxy::post`; `devcomm_device::abi::gin` has the
//! protocol).
//!
//! Ring `q` (`q = context * nranks + peer`) holds `depth` slots. The
//! consumer (one proxy thread) keeps its position in the ring's
//! [`QueueTail::completed`]: the next ticket is `completed`, in slot
//! `completed % depth`, ready once all eight words of that [`GinSlot`]
//! carry the ticket's tag ([`slot_tag`]; relaxed loads, then an acquire
//! fence). Completing the ticket stores `completed + 1` with release, which
//! returns the slot to the producers as credit and tells flushes that the
//! source has been read.

use crate::{slot_tag, GinDescriptor, GinHostError, GinHostMemory, GinResult, GinSlot, QueueTail};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// The rings of one rank, seen from the proxy (a view: clones share the memory).
#[derive(Clone, Debug)]
pub struct Rings {
    mem: GinHostMemory,
    count: usize,
}

impl Rings {
    /// Wraps `mem`, after checking its sizes (depth a non-zero power of two,
    /// at least one context and rank, pointers non-null and aligned).
    ///
    /// # Safety
    /// The pointers of `mem` name live memory of the sizes it states, for
    /// the whole life of the returned value, and every word shared with
    /// producers is accessed atomically by them (as `devcomm_device::gin::proxy::post` does).
    pub unsafe fn new(mem: GinHostMemory) -> GinResult<Rings> {
        let bad = |m: &str| Err(GinHostError::Invalid(format!("GIN host memory: {m}")));
        if mem.depth == 0 || !mem.depth.is_power_of_two() {
            return bad("queue depth must be a non-zero power of two");
        }
        if mem.contexts == 0 || mem.nranks == 0 {
            return bad("no contexts or no ranks");
        }
        if mem.rings.is_null() || mem.tails.is_null() {
            return bad("null ring or tail pointer");
        }
        if (mem.rings as usize) % align_of::<GinSlot>() != 0 || (mem.tails as usize) % align_of::<QueueTail>() != 0 {
            return bad("misaligned rings or tails");
        }
        if (mem.total_signals > 0 && (mem.signals.is_null() || (mem.signals as usize) % 8 != 0))
            || (mem.counters_len > 0 && (mem.counters.is_null() || (mem.counters as usize) % 8 != 0))
        {
            return bad("null or misaligned signals or counters");
        }
        let count = mem.contexts as usize * mem.nranks as usize;
        Ok(Rings { mem, count })
    }

    /// The memory this wraps.
    pub fn memory(&self) -> &GinHostMemory {
        &self.mem
    }

    /// Number of rings (`contexts * nranks`).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Index of the ring of (`context`, `peer`).
    pub fn index(&self, context: u32, peer: u32) -> usize {
        context as usize * self.mem.nranks as usize + peer as usize
    }

    /// The peer ring `q` sends to.
    pub fn peer_of(&self, q: usize) -> usize {
        q % self.mem.nranks as usize
    }

    fn tail(&self, q: usize) -> *mut QueueTail {
        assert!(q < self.count, "ring {q} out of range");
        // SAFETY: q < count, the tails array has `count` entries (Rings::new's contract).
        unsafe { self.mem.tails.add(q) }
    }

    fn completed_word(&self, q: usize) -> &AtomicU64 {
        // SAFETY: live, 8-aligned, only accessed atomically (Rings::new's contract).
        unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*self.tail(q)).completed)) }
    }

    fn error_word(&self, q: usize) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*self.tail(q)).error)) }
    }

    fn abandoned_word(&self, q: usize) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*self.tail(q)).abandoned)) }
    }

    /// The ticket a producer of ring `q` gave up without writing its slot,
    /// and why (`ABANDON_*` of `devcomm_device::abi::gin`), if one did (see
    /// [`QueueTail::abandoned`]; with several, the last one's).
    pub fn abandoned(&self, q: usize) -> Option<(u64, u64)> {
        devcomm_device::abi::gin::abandoned_ticket(self.abandoned_word(q).load(Ordering::Relaxed))
    }

    /// Tickets completed on ring `q`.
    pub fn completed(&self, q: usize) -> u64 {
        self.completed_word(q).load(Ordering::Acquire)
    }

    /// The next descriptor of ring `q` to complete, if its producer has
    /// published it (`None` also for a failed ring). Returns the same
    /// descriptor until [`Rings::complete`] is called.
    pub fn poll(&self, q: usize) -> Option<GinDescriptor> {
        self.poll_at(q, self.completed_word(q).load(Ordering::Relaxed))
    }

    /// The descriptor of `ticket` on ring `q`, if its producer has published
    /// it (`None` also for a failed ring). A consumer that serves tickets
    /// before completing them (work in flight) reads ahead with this; it
    /// must keep `completed(q) <= ticket <= completed(q) + depth` — producers
    /// cannot publish further, and a slot is only rewritten after its
    /// ticket has completed.
    pub fn poll_at(&self, q: usize, ticket: u64) -> Option<GinDescriptor> {
        if self.is_failed(q) {
            return None;
        }
        let depth = self.mem.depth as u64;
        // SAFETY: q < count (checked by tail()), slot < depth: inside the ring array.
        let slot = unsafe { self.mem.rings.add(q * self.mem.depth as usize + (ticket % depth) as usize) };
        debug_assert!(ticket.wrapping_sub(self.completed(q)) <= depth, "read-ahead past the ring's credit");
        let mut words = [0u64; 8];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: live, 8-aligned words of the slot; producers store
            // them atomically (8-byte single-copy atomic stores).
            *w = unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*slot).words[i])) }.load(Ordering::Relaxed);
        }
        let d = GinSlot::decode(&words, slot_tag(ticket, self.mem.depth))?;
        // Pairs with the producer's fence before the slot (a put's source
        // data): what it wrote before is visible to what we do next.
        fence(Ordering::Acquire);
        Some(d)
    }

    /// Completes the ticket [`Rings::poll`] returned on ring `q`: its
    /// source has been read and its local action applied; the slot is
    /// free for producers again.
    pub fn complete(&self, q: usize) {
        self.complete_n(q, 1);
    }

    /// Completes the next `n` tickets of ring `q` at once (one store the
    /// producers see, instead of `n`).
    pub fn complete_n(&self, q: usize, n: u64) {
        let w = self.completed_word(q);
        w.store(w.load(Ordering::Relaxed) + n, Ordering::Release);
    }

    /// Marks ring `q` failed: producers and flushes give up on it.
    pub fn fail(&self, q: usize) {
        self.error_word(q).store(1, Ordering::Release);
    }

    /// Whether ring `q` has been marked failed.
    pub fn is_failed(&self, q: usize) -> bool {
        self.error_word(q).load(Ordering::Acquire) != 0
    }

    /// Adds 1 to counter `c` (`c < counters_len`, else `Invalid`).
    pub fn counter_inc(&self, c: u32) -> GinResult<()> {
        if c >= self.mem.counters_len {
            return Err(GinHostError::Invalid(format!("counter {c} out of range")));
        }
        // SAFETY: in range, live, 8-aligned, atomically accessed.
        unsafe { AtomicU64::from_ptr(self.mem.counters.add(c as usize)) }.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_complete_wrap() {
        let depth = 2u32;
        let mut rings = vec![GinSlot::default(); 2 * depth as usize];
        let mut tails = vec![QueueTail::default(); 2];
        let mut counters = [0u64; 1];
        let mem = GinHostMemory {
            rings: rings.as_mut_ptr(),
            tails: tails.as_mut_ptr(),
            signals: core::ptr::null_mut(),
            counters: counters.as_mut_ptr(),
            contexts: 1,
            nranks: 2,
            depth,
            total_signals: 0,
            counters_len: 1,
        };
        // SAFETY: the vectors outlive `r`; single-threaded.
        let r = unsafe { Rings::new(mem) }.unwrap();
        assert_eq!(r.count(), 2);
        assert!(r.poll(1).is_none());
        for t in 0..5u64 {
            let slot = &mut rings[depth as usize + (t % depth as u64) as usize];
            let body = GinDescriptor { bytes: t * 10, ..Default::default() };
            *slot = GinSlot::encode(&body, slot_tag(t, depth));
            // One word with another lap's tag: not published yet.
            let last = slot.words[7];
            slot.words[7] = (last & ((1 << 56) - 1)) | ((slot_tag(t + depth as u64, depth) as u64) << 56);
            assert!(r.poll(1).is_none());
            slot.words[7] = last;
            let d = r.poll(1).unwrap();
            assert_eq!(d.bytes, t * 10);
            assert_eq!(r.poll(1), Some(d));
            r.complete(1);
            assert_eq!(r.completed(1), t + 1);
            assert!(r.poll(1).is_none());
        }
        assert!(r.poll(0).is_none());
        r.counter_inc(0).unwrap();
        assert!(r.counter_inc(1).is_err());
        r.fail(1);
        assert!(r.is_failed(1) && !r.is_failed(0));
        assert_eq!(tails[1].error, 1);
        assert_eq!(counters[0], 1);
    }

    #[test]
    fn rejects_bad_memory() {
        let mut rings = vec![GinSlot::default(); 4];
        let mut tails = vec![QueueTail::default(); 2];
        let good = GinHostMemory {
            rings: rings.as_mut_ptr(),
            tails: tails.as_mut_ptr(),
            signals: core::ptr::null_mut(),
            counters: core::ptr::null_mut(),
            contexts: 1,
            nranks: 2,
            depth: 2,
            total_signals: 0,
            counters_len: 0,
        };
        // SAFETY: nothing is accessed by these constructions.
        unsafe {
            assert!(Rings::new(good).is_ok());
            assert!(Rings::new(GinHostMemory { depth: 3, ..good }).is_err());
            assert!(Rings::new(GinHostMemory { depth: 0, ..good }).is_err());
            assert!(Rings::new(GinHostMemory { nranks: 0, ..good }).is_err());
            assert!(Rings::new(GinHostMemory { total_signals: 1, ..good }).is_err());
            assert!(Rings::new(GinHostMemory { rings: core::ptr::null_mut(), ..good }).is_err());
        }
    }
}
