//! The kernels behind `devcomm::rma` (NCCL's host RMA: `ncclPutSignal`,
//! `ncclSignal`, `ncclWaitSignal`): each host call is one stream-ordered
//! launch of one of them, one thread posting GIN operations on the
//! `HostRma`'s device communicator. So a host `put_signal` and a kernel's
//! GIN put with `SignalInc` are the same operation to the proxy, count on
//! the same signal words, and keep the same ordering.
//!
//! Each kernel reports a failure in `errors` (a host-mapped `u32`: the
//! first failure stays), which the host turns into a typed error.

use devcomm_device::abi::rma::RmaWaitList;
use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::comm::{DevComm, WindowDesc};
use devcomm_device::coop::{Coop, Cta, ThreadCoop};
use devcomm_device::gin::{Gin, GinError, LocalAction, RemoteAction, INLINE_PUT_BYTES};
use devcomm_device::kernel;
use devcomm_device::lsa;

/// Records `r`'s error in `errors` (the first one stays).
///
/// # Safety
/// `errors` is a valid `u32` of memory the device can reach, accessed atomically.
#[inline(always)]
unsafe fn report(errors: *mut u32, r: Result<(), GinError>) {
    if let Err(e) = r {
        // SAFETY: the contract: a valid `u32`, accessed atomically.
        unsafe { atomic::compare_exchange(errors, 0, e.code(), Order::Relaxed, Scope::Sys) };
    }
}

/// The remote action for `signal` (`u32::MAX`: none).
#[inline(always)]
fn signal_inc(signal: u32) -> RemoteAction {
    if signal == u32::MAX {
        RemoteAction::None
    } else {
        RemoteAction::SignalInc { signal, strong: true }
    }
}

kernel! {
    /// Puts `bytes` from `src_offset` of this rank's `src` window into
    /// `dst_offset` of world rank `peer`'s `dst` window on GIN context
    /// `context`, then increments GIN signal `signal` there (`u32::MAX`: no
    /// signal). Puts of more than [`INLINE_PUT_BYTES`] bytes then flush (the
    /// proxy has read the source when the kernel ends, so the stream may
    /// reuse it); smaller ones travel inside the descriptor. The source is
    /// declared released (`with_given_release(Scope::Sys)`): this kernel never
    /// writes it, whatever wrote it ran before in stream order. One thread.
    ///
    /// # Safety
    /// `comm` is a live device communicator with GIN; `src` and `dst` are
    /// windows of its communicator (`dst` declared with `use_window`);
    /// `errors` is a valid device-reachable `u32`.
    pub unsafe fn rma_put_signal(
        comm: DevComm,
        dst: WindowDesc,
        dst_offset: u64,
        src: WindowDesc,
        src_offset: u64,
        bytes: u64,
        peer: u32,
        signal: u32,
        context: u32,
        errors: *mut u32,
    ) {
        let r = (|| {
            // The source was written before this kernel started (by the host,
            // a stream copy or an earlier kernel): already released at system
            // scope, so the put needs no fence of its own.
            let gin = Gin::new(&comm, context)?.with_given_release(Scope::Sys);
            let world = comm.world();
            gin.put(&ThreadCoop, &world, peer, &dst, dst_offset, &src, src_offset, bytes, signal_inc(signal), LocalAction::None)?;
            if bytes > INLINE_PUT_BYTES {
                gin.flush(&ThreadCoop)?;
            }
            Ok(())
        })();
        report(errors, r);
    }

    /// The SM-copy direct path within an LSA team: the CTA copies `bytes`
    /// from `src` (this GPU's memory) to `dst` (the peer's window, mapped
    /// here) with stores, joins, and its leader releases them at system
    /// scope and increments GIN signal `signal` of world rank `peer`
    /// through the proxy (context `context`) — so the signal is seen only
    /// after the data. One CTA, any number of threads.
    ///
    /// # Safety
    /// As for [`rma_put_signal`]; `src..src + bytes` is device memory of this
    /// GPU and `dst..dst + bytes` lies in `peer`'s window mapped here, not
    /// overlapping it.
    pub unsafe fn rma_put_lsa_signal(
        comm: DevComm,
        dst: u64,
        src: u64,
        bytes: u64,
        peer: u32,
        signal: u32,
        context: u32,
        errors: *mut u32,
    ) {
        let cta = Cta::new();
        lsa::copy(&cta, dst as *mut u8, src as *const u8, bytes as usize);
        // Every thread's stores reach the block (bar.sync), the leader's
        // system-scope fence releases them (cumulatively) before it posts.
        cta.sync();
        if cta.is_leader() {
            devcomm_device::atomic::fence_acq_rel(Scope::Sys);
            let r = (|| {
                let gin = Gin::new(&comm, context)?;
                gin.signal(&comm.world(), peer, signal_inc(signal))
            })();
            report(errors, r);
        }
    }

    /// Increments GIN signal `signal` of world rank `peer`, after every
    /// earlier operation of context `context` to that peer. One thread.
    ///
    /// # Safety
    /// As for [`rma_put_signal`].
    pub unsafe fn rma_signal(comm: DevComm, peer: u32, signal: u32, context: u32, errors: *mut u32) {
        let r = (|| {
            let gin = Gin::new(&comm, context)?;
            gin.signal(&comm.world(), peer, signal_inc(signal))
        })();
        report(errors, r);
    }

    /// For each entry of `list`, in order: advances the signal's shadow by
    /// the entry's count and waits until the signal has reached the new
    /// shadow (`increase_signal_shadow` + `wait_signal`: the signal
    /// operations of that many puts/signals are consumed). Waits end with
    /// the device communicator's op timeout, its abort flag, or a failed ring
    /// of the entry's context, as an error. One thread.
    ///
    /// # Safety
    /// As for [`rma_put_signal`].
    pub unsafe fn rma_wait_signal(comm: DevComm, list: RmaWaitList, errors: *mut u32) {
        let r = (|| {
            let n = (list.len as usize).min(list.entries.len());
            for e in &list.entries[..n] {
                let gin = Gin::new(&comm, e.context)?;
                let target = gin.increase_signal_shadow(e.signal, e.count)?;
                gin.wait_signal(&ThreadCoop, e.signal, target)?;
            }
            Ok(())
        })();
        report(errors, r);
    }
}
