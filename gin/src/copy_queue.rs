//! [`CopyQueue`]: the asynchronous device data path of the proxy.
//!
//! The copy-engine transport does not wait for each copy. It queues copies
//! and small writes on a device work queue (a CUDA stream of the proxy's
//! own), then a numbered *fence*; the queue reports how far its fences have
//! passed. A fence passed means every operation queued before it is
//! complete and visible to every observer (peer GPUs, CPUs): only then are
//! the signals that follow the data applied, local counters bumped and ring
//! tickets completed (which frees the source for reuse).
//!
//! Besides the copy engine, the TCP transport's receivers land incoming
//! bytes through a queue each ([`CopyQueue::write`] takes host bytes of any
//! length), applying a signal only once a fence behind its data has passed.
//!
//! ```text
//! proxy:  copy(a) write(b) fence()=7  copy(c) fence()=8 ...
//! device: ─ a ─ b ─ [passed=7] ─ c ─ [passed=8]
//! proxy:  passed() >= 7 → signals and completions of a, b
//! ```
//!
//! `devcomm` implements it over its runtime (stream memory operations write
//! the fence number into host-mapped memory; the emulated runtime runs the
//! same operations on its stream thread).

use crate::GinResult;

/// An in-order queue of device copies and writes with host-visible fences
/// (see the module docs). Used by one proxy thread.
pub trait CopyQueue: Send {
    /// Queues a copy of `bytes` from device address `src` to device address
    /// `dst` (this rank's memory, or a same-host peer's mapped here).
    ///
    /// # Safety
    /// Both ranges are device memory this rank can access, do not overlap,
    /// and stay alive (and `src` unchanged) until a fence queued after this
    /// call has passed.
    unsafe fn copy(&mut self, dst: u64, src: u64, bytes: u64) -> GinResult<()>;

    /// Queues a write of `data` — host bytes of any length; empty: nothing
    /// is queued — to device address `dst`, in order with everything else
    /// queued.
    ///
    /// `data` is consumed before this returns (the caller may reuse it at
    /// once): the queue copies it into staging memory of its own (pinned
    /// host memory the device reads), or into the queued operation itself
    /// (a stream write of an aligned word). Staging is reused only once a
    /// fence queued after the copy that reads it has passed; where all of
    /// it is in use, `write` waits — for such a fence, or, if none is queued
    /// yet, for the device to run what was queued — and never drops or
    /// overwrites data still to be copied. It queues no fence of its own:
    /// fence numbers stay those [`CopyQueue::fence`] returned. A device
    /// fault met while waiting is returned (as [`CopyQueue::passed`] would).
    ///
    /// # Safety
    /// `dst..dst + data.len()` is device memory this rank can access, alive
    /// until a fence queued after this call has passed.
    unsafe fn write(&mut self, dst: u64, data: &[u8]) -> GinResult<()>;

    /// Hands what was queued to the device now. A queue may gather work
    /// to hand it over in fewer driver calls; this (and [`CopyQueue::fence`])
    /// ends the gathering. The default does nothing.
    fn submit(&mut self) -> GinResult<()> {
        Ok(())
    }

    /// Queues a fence and returns its number. Numbers start at 1 and grow
    /// by one per fence; fences pass in order.
    fn fence(&mut self) -> GinResult<u64>;

    /// The number of the last fence passed (0 before the first), or the
    /// error of queued work that failed (a device fault), after which no
    /// fence passes again.
    fn passed(&mut self) -> GinResult<u64>;
}
