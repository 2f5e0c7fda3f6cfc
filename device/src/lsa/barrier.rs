//! Barriers among the GPUs of an LSA team.
//!
//! Barrier `index` owns, in the resource window, one inbox word per source
//! LSA rank on every rank: arriving at epoch `e` stores `e` into slot
//! `[index][my_lsa_rank]` of every peer's inbox; waiting reads the caller's
//! own inbox until every slot has reached `e` (wrap-safe). The epoch lives in
//! the rank's own resource memory, so consecutive kernels keep counting.
//!
//! Ordering: `arrive` first joins the coop (`sync`), so every write the coop
//! made before the barrier precedes the release store at system scope; `wait`
//! loads with acquire at system scope and joins the coop again. With
//! [`Order::Relaxed`] the barrier only synchronises control flow.
//!
//! Contract: one coop at a time uses a given barrier index; all LSA ranks
//! take part with the same index.

use crate::atomic::{self, Order, Scope};
use core::marker::PhantomData;

use crate::comm::{AbortInfo, DevComm};
use crate::coop::Coop;
use crate::wait::{self, Deadline, WaitError};

/// Why a barrier operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierError {
    /// The index is not below the device communicator's `lsa_barrier_count`.
    IndexOutOfRange,
    /// A wait gave up.
    Wait(WaitError),
}

impl From<WaitError> for BarrierError {
    fn from(e: WaitError) -> Self {
        BarrierError::Wait(e)
    }
}

impl BarrierError {
    /// A non-zero code for an error word the host reads.
    pub const fn code(self) -> u32 {
        match self {
            BarrierError::IndexOutOfRange => 16,
            BarrierError::Wait(w) => w.code(),
        }
    }
}

/// One use of an LSA barrier by a coop.
///
/// ```no_run
/// use devcomm_device::{arch, atomic::Order, comm::DevComm, coop::Cta, lsa::{BarrierError, LsaBarrierSession}};
/// /// # Safety
/// /// `comm` is live and has a barrier per block.
/// unsafe fn step(comm: &DevComm) -> Result<(), BarrierError> {
///     let cta = Cta::new();
///     // SAFETY: the caller's contract; each block uses its own barrier.
///     let mut bar = unsafe { LsaBarrierSession::new(&cta, comm, arch::block_idx().x) }?;
///     unsafe { bar.sync(&cta, Order::AcqRel) } // everyone's earlier writes are visible
/// }
/// ```
#[doc(alias = "ncclLsaBarrierSession")]
pub struct LsaBarrierSession<'a> {
    /// Slot `[index][0]` of LSA peer 0's inbox array (an address in this
    /// process); peer `p`'s is `stride * p` further, source `s`'s slot
    /// `4 * s` further.
    slots: u64,
    /// Distance between consecutive LSA peers' mappings of the resources.
    stride: u64,
    /// This rank's epoch word of the barrier.
    epoch_word: *mut u32,
    /// The caller's LSA rank and the team's size.
    me: u32,
    n: u32,
    abort: AbortInfo,
    epoch: u32,
    /// Held by value, so that no reference into the kernel's parameter
    /// escapes into the session: one that did made LLVM copy the
    /// communicator to local memory at every kernel's entry and read it
    /// back there on every arrival.
    _comm: PhantomData<&'a DevComm>,
}

impl<'a> LsaBarrierSession<'a> {
    /// Opens barrier `index` of `comm` for `coop` (every thread calls it).
    ///
    /// # Safety
    /// `comm` describes a live device communicator whose resource window is
    /// mapped; no other coop uses barrier `index` concurrently.
    #[inline]
    pub unsafe fn new<C: Coop>(_coop: &C, comm: &'a DevComm, index: u32) -> Result<Self, BarrierError> {
        if index >= comm.lsa_barrier_count {
            return Err(BarrierError::IndexOutOfRange);
        }
        let r = &comm.resources;
        let (me, n) = (comm.lsa_rank, comm.lsa_size);
        // The contract: the resource window holds, on every LSA peer, the
        // inboxes (`lsa_barrier_count * lsa_size` words at
        // `lsa_barrier_offset`) and this rank's epochs (at
        // `lsa_epoch_offset`), so no address below needs a range check.
        let slots = r.lsa_base + comm.lsa_barrier_offset + index as u64 * n as u64 * 4;
        let epoch_word = (r.lsa_base + me as u64 * r.stride + comm.lsa_epoch_offset + index as u64 * 4) as *mut u32;
        // SAFETY: the caller's contract: `comm` is live and its resource
        // window mapped, so barrier `index < lsa_barrier_count` (checked
        // above) has its epoch word, a 4-byte aligned `u32` of this rank's
        // resource window, accessed only atomically.
        let epoch = unsafe { atomic::load_relaxed(epoch_word, Scope::Gpu) };
        Ok(LsaBarrierSession {
            slots,
            stride: r.stride,
            epoch_word,
            me,
            n,
            abort: comm.abort,
            epoch,
            _comm: PhantomData,
        })
    }

    /// Inbox slot `[index][src]` in LSA peer `peer < n`'s resource window.
    #[inline(always)]
    fn inbox(&self, peer: u32, src: u32) -> *mut u32 {
        (self.slots + peer as u64 * self.stride + src as u64 * 4) as *mut u32
    }

    /// The epoch the next `wait` waits for.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Signals every LSA peer that the caller's coop has arrived.
    ///
    /// # Safety
    /// As for [`LsaBarrierSession::new`]; every thread of `coop` calls it.
    #[inline]
    pub unsafe fn arrive<C: Coop>(&mut self, coop: &C, order: Order) {
        coop.sync();
        self.epoch = self.epoch.wrapping_add(1);
        let (me, n) = (self.me, self.n);
        let mut peer = coop.thread_rank();
        while peer < n {
            let p = self.inbox(peer, me);
            // SAFETY: `new`'s contract (live `comm`, mapped resource window)
            // and `index < lsa_barrier_count`, `peer < lsa_size`: `p` is slot
            // `[index][me]` of peer `peer`'s inbox array, an aligned `u32`
            // that is written only by this rank (atomically) and read only
            // atomically by that peer's `wait`.
            unsafe {
                match order {
                    Order::Release | Order::AcqRel => atomic::store_release(p, self.epoch, Scope::Sys),
                    Order::Relaxed | Order::Acquire => atomic::store_relaxed(p, self.epoch, Scope::Sys),
                }
            }
            peer += coop.size();
        }
    }

    /// Waits until every LSA peer has arrived at the current epoch (the coop's
    /// threads watch the peers between them), then joins the coop; every
    /// thread gets the same result, the error of any peer's wait included.
    ///
    /// # Safety
    /// As for [`LsaBarrierSession::arrive`].
    #[inline]
    pub unsafe fn wait<C: Coop>(&mut self, coop: &C, order: Order) -> Result<(), BarrierError> {
        let (me, n) = (self.me, self.n);
        let mut deadline = Deadline::new(&self.abort);
        let mut result = Ok(());
        let mut src = coop.thread_rank();
        while src < n && result.is_ok() {
            let p = self.inbox(me, src) as *const u32;
            // SAFETY: as in `arrive`: slot `[index][src]` of this rank's own
            // inbox array (`src < lsa_size`), an aligned `u32` that peers
            // only store to atomically.
            let r = unsafe {
                match order {
                    // Every poll acquires: the coop waits with this
                    // thread, and a re-read after the last arrival would
                    // cost every long barrier one more round trip.
                    Order::Acquire | Order::AcqRel => {
                        wait::wait_ge_u32_acquiring(p, self.epoch, Scope::Sys, &mut deadline)
                    }
                    Order::Relaxed | Order::Release => {
                        wait::wait_ge_u32_relaxed(p, self.epoch, Scope::Sys, &mut deadline)
                    }
                }
            };
            result = r.map(|_| ()).map_err(BarrierError::from);
            src += coop.size();
        }
        coop.agree(result)
    }

    /// `arrive` then `wait`.
    ///
    /// # Safety
    /// As for [`LsaBarrierSession::arrive`].
    #[inline]
    pub unsafe fn sync<C: Coop>(&mut self, coop: &C, order: Order) -> Result<(), BarrierError> {
        // SAFETY: this function's contract is `arrive`'s and `wait`'s.
        unsafe {
            self.arrive(coop, order);
            self.wait(coop, order)
        }
    }
}

impl Drop for LsaBarrierSession<'_> {
    /// Saves the epoch for the barrier's next session (every thread stores
    /// the same value).
    fn drop(&mut self) {
        // SAFETY: the epoch word is the caller's own, valid per `new`'s contract.
        unsafe { atomic::store_relaxed(self.epoch_word, self.epoch, Scope::Gpu) };
    }
}
