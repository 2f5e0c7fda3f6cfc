//! The LL all-to-all session (NCCL's `ncclLLA2ASession`): a kernel's
//! threads exchange 8-byte values with every rank of the LSA team without
//! a barrier, each value stored with its epoch as a flag in one 16-byte
//! store (the LL protocol), so its arrival is the signal.
//!
//! A session belongs to one block of the context (a part: usually the
//! CTA's index) and runs in *epochs*. In an epoch, threads [`send`]
//! values into numbered slots of a peer's inbox (or [`bcast`] one value to
//! the same slot of every rank, itself included) and [`recv`] values from
//! their own inbox's slots (or [`recv_reduce`] several slots at once); the
//! slot numbers are the kernel's to choose (e.g. `source rank × threads +
//! thread`), each slot written at most once per epoch.
//! [`end_epoch`] joins the coop and moves to the next epoch.
//!
//! Inboxes alternate between two parities. Reuse is safe when every rank
//! that sends to a peer in an epoch also receives from that peer in the
//! next one (an all-to-all exchange every epoch, as in NCCL's LL
//! all-gather and reduce-scatter): a rank writes parity `e & 1` again in
//! epoch `e + 2` only after receiving the peer's epoch-`e + 1` values, sent
//! after the peer finished reading epoch `e`.
//!
//! [`send`]: LlA2aSession::send
//! [`bcast`]: LlA2aSession::bcast
//! [`recv`]: LlA2aSession::recv
//! [`recv_reduce`]: LlA2aSession::recv_reduce
//! [`end_epoch`]: LlA2aSession::end_epoch

use super::element::Element;
use super::ll::{lane, poll_flagged, store_flagged};
use super::op::Reduction;
use super::pack::each_lane;
use super::{CollContext, CollError};
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::wait::Deadline;
use core::mem::size_of;

/// The epoch after `e`: never 0 (zeroed inboxes would match it), and of
/// the other parity (after `u32::MAX` comes 2).
const fn next_epoch(e: u32) -> u32 {
    match e.wrapping_add(1) {
        0 => 2,
        n => n,
    }
}

/// An LL all-to-all session of one block of a [`CollContext`] (see the
/// [module docs](self)). Every thread of the coop makes its own with the
/// same arguments.
#[doc(alias = "ncclLLA2ASession")]
#[derive(Debug)]
pub struct LlA2aSession<'a> {
    ctx: &'a CollContext,
    block: u32,
    epoch: u32,
}

impl<'a> LlA2aSession<'a> {
    /// Opens block `block`'s session, continuing its epochs.
    ///
    /// Errors (the same on every thread): [`CollError::PartOutOfRange`] for
    /// a block not below the context's parts, [`CollError::BadArgument`]
    /// for a context without LL all-to-all slots.
    ///
    /// # Safety
    /// `ctx` is live; no other session of `block` is open on this rank;
    /// every thread of `coop` calls it.
    pub unsafe fn new<C: Coop>(coop: &C, ctx: &'a CollContext, block: u32) -> Result<Self, CollError> {
        let r = if ctx.ll_a2a_slots() == 0 {
            Err(CollError::BadArgument)
        } else if block >= ctx.parts() {
            Err(CollError::PartOutOfRange)
        } else {
            Ok(())
        };
        coop.agree(r)?;
        // SAFETY: the block's epoch line in the caller's own scratch
        // (`block < parts`), written only by this block's sessions.
        let last = unsafe { atomic::load_relaxed(Self::epoch_word(ctx, block), Scope::Gpu) };
        Ok(LlA2aSession { ctx, block, epoch: next_epoch(last) })
    }

    fn epoch_word(ctx: &CollContext, block: u32) -> *mut u32 {
        ctx.scratch().lsa_ptr(ctx.ll_a2a_offset(block), ctx.scratch().lsa_rank())
    }

    /// Slots per parity of each inbox: valid slot numbers are below it.
    pub fn slots(&self) -> u32 {
        self.ctx.ll_a2a_slots()
    }

    /// The current epoch (non-zero).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Slot `slot` of the current parity in LSA rank `peer`'s inbox (null
    /// when out of range).
    fn slot_ptr(&self, peer: u32, slot: u32) -> *mut u64 {
        if slot >= self.slots() {
            return core::ptr::null_mut();
        }
        let at =
            self.ctx.ll_a2a_offset(self.block) + 16 * (1 + (self.epoch & 1) as u64 * self.slots() as u64 + slot as u64);
        self.ctx.scratch().lsa_ptr(at, peer)
    }

    /// Stores `value` into slot `slot` of LSA rank `peer`'s inbox for this
    /// epoch. Errors: [`CollError::BadArgument`] for a peer or slot out of
    /// range (this thread's alone).
    ///
    /// # Safety
    /// No other thread of any rank writes that slot of that peer in this
    /// epoch.
    pub unsafe fn send(&self, peer: u32, slot: u32, value: u64) -> Result<(), CollError> {
        let at = self.slot_ptr(peer, slot);
        if at.is_null() {
            return Err(CollError::BadArgument);
        }
        // SAFETY: a 16-byte aligned slot of the peer's inbox (offsets are
        // multiples of 16 from an aligned area), accessed only atomically.
        unsafe { store_flagged(at, value, self.epoch) };
        Ok(())
    }

    /// [`send`](Self::send) of `value` to slot `slot` of every LSA rank,
    /// the caller included.
    ///
    /// # Safety
    /// As for [`send`](Self::send), for every rank.
    pub unsafe fn bcast(&self, slot: u32, value: u64) -> Result<(), CollError> {
        let (me, n) = (self.ctx.scratch().lsa_rank(), self.ctx.scratch().lsa_size());
        for k in 0..n {
            // Start with the next rank, so ranks do not all store to rank 0 first.
            // SAFETY: this function's contract.
            unsafe { self.send((me + k) % n, slot, value) }?;
        }
        Ok(())
    }

    /// Waits for slot `slot` of the caller's inbox in this epoch and
    /// returns its value. Errors: [`CollError::BadArgument`] for a slot out
    /// of range, [`CollError::Wait`] when the communicator's timeout passes
    /// or it is aborted (this thread's alone: [`end_epoch`](Self::end_epoch)
    /// gives every thread the same outcome).
    ///
    /// # Safety
    /// Some rank sends that slot in this epoch (or the wait times out).
    pub unsafe fn recv(&self, slot: u32) -> Result<u64, CollError> {
        let at = self.slot_ptr(self.ctx.scratch().lsa_rank(), slot);
        if at.is_null() {
            return Err(CollError::BadArgument);
        }
        let mut deadline = Deadline::new(&self.ctx.comm().abort());
        loop {
            // SAFETY: as in `send`: an aligned slot of the caller's inbox.
            if let Some(v) = unsafe { poll_flagged(at, self.epoch) } {
                return Ok(v);
            }
            deadline.poll()?;
        }
    }

    /// Receives slots `first, first + stride, …` (`count` of them, in that
    /// order) and reduces them lane by lane as 8-byte packs of `T` with
    /// `red` (`Reduction::first` on the first, `step` after, `finish` at the
    /// end): the LL reduce-scatter's and all-reduce's receive.
    ///
    /// # Safety
    /// As for [`recv`](Self::recv), for each slot; `count >= 1`.
    pub unsafe fn recv_reduce<T: Element>(
        &self,
        first: u32,
        count: u32,
        stride: u32,
        red: &Reduction<T>,
    ) -> Result<u64, CollError> {
        let lanes = 8 / size_of::<T>();
        let mut acc = [red.first(lane::<T>(0, 0)); 16]; // 16: `each_lane!` covers up to 16 lanes (8 used at most)
        for k in 0..count.max(1) {
            // SAFETY: this function's contract.
            let v = unsafe { self.recv(first.wrapping_add(k.wrapping_mul(stride))) }?;
            each_lane!(lanes, |l| {
                let x = lane::<T>(v, l);
                acc[l] = if k == 0 { red.first(x) } else { red.step(acc[l], x) };
            });
        }
        let (mut out, width) = (0u64, size_of::<T>() * 8);
        each_lane!(lanes, |l| {
            let bits = red.finish(acc[l]).to_bits64();
            let bits = if width == 64 { bits } else { bits & ((1u64 << width) - 1) };
            out |= bits << (l * width);
        });
        Ok(out)
    }

    /// Ends the epoch: joins the coop, gives every thread the same outcome
    /// of `r` (the worst error any thread brought: pass the results of its
    /// `send`s and `recv`s), and moves to the next epoch.
    ///
    /// # Safety
    /// Every thread of `coop` calls it.
    pub unsafe fn end_epoch<C: Coop>(&mut self, coop: &C, r: Result<(), CollError>) -> Result<(), CollError> {
        let r = coop.agree(r);
        self.epoch = next_epoch(self.epoch);
        r
    }
}

impl Drop for LlA2aSession<'_> {
    /// Saves the epoch for the block's next session (every thread stores
    /// the same value).
    fn drop(&mut self) {
        // SAFETY: the block's epoch line in the caller's own scratch (checked
        // in `new`), written only by this block's sessions.
        unsafe {
            atomic::store_relaxed(Self::epoch_word(self.ctx, self.block), self.epoch.wrapping_sub(1), Scope::Gpu)
        };
    }
}
