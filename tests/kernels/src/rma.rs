//! Kernels that mix the device GIN API with the host's stream-ordered RMA
//! (`devcomm::rma::HostRma`): they signal and wait on the very GIN signals
//! that host `put_signal`/`signal`/`wait_signal` use.
//!
//! Errors go to `errors[0]` (first code wins) and their count to `errors[1]`.

use devcomm_device::comm::DevComm;
use devcomm_device::coop::ThreadCoop;
use devcomm_device::gin::{Gin, GinError, RemoteAction};
use devcomm_device::kernel;

use crate::report::report;

/// Reports `r`'s error in `errors`.
///
/// # Safety
/// As for [`report`]: `errors` points to two `u32`s the kernel can write.
#[inline(always)]
unsafe fn check(errors: *mut u32, r: Result<(), GinError>) {
    if let Err(e) = r {
        report(errors, e.code());
    }
}

kernel! {
    /// Thread 0 increments GIN signal `signal` of world rank `peer` `times`
    /// times (`SignalInc`, one `Gin::signal` each) on context 0.
    ///
    /// # Safety
    /// `comm` is a live device communicator with GIN; `errors` two `u32`s.
    pub unsafe fn rma_device_signal(comm: DevComm, peer: u32, signal: u32, times: u32, errors: *mut u32) {
        let r = (|| {
            let gin = Gin::new(&comm, 0)?;
            for _ in 0..times {
                gin.signal(&comm.world(), peer, RemoteAction::SignalInc { signal, strong: true })?;
            }
            Ok(())
        })();
        check(errors, r);
    }

    /// Thread 0 consumes `count` signal operations of GIN signal `signal` the
    /// way the host's `wait_signal` does: advances the signal's shadow by
    /// `count` and waits for the signal to reach it.
    ///
    /// # Safety
    /// As for [`rma_device_signal`].
    pub unsafe fn rma_device_wait(comm: DevComm, signal: u32, count: u64, errors: *mut u32) {
        let r = (|| {
            let gin = Gin::new(&comm, 0)?;
            let target = gin.increase_signal_shadow(signal, count)?;
            gin.wait_signal(&ThreadCoop, signal, target).map(|_| ())
        })();
        check(errors, r);
    }

    /// Thread 0 copies the shadows of GIN signals `ids[..count]` to
    /// `out[..count]` (what host `wait_signal`s and kernels have consumed).
    ///
    /// # Safety
    /// As for [`rma_device_signal`]; `ids` and `out` hold `count` elements.
    pub unsafe fn rma_read_shadows(comm: DevComm, ids: *const u32, count: u32, out: *mut u64, errors: *mut u32) {
        let Ok(gin) = Gin::new(&comm, 0) else {
            check(errors, Err(GinError::NoGin));
            return;
        };
        for i in 0..count as usize {
            match gin.signal_shadow(*ids.add(i)) {
                Ok(p) => *out.add(i) = devcomm_device::atomic::load_relaxed(p, devcomm_device::atomic::Scope::Gpu),
                Err(e) => check(errors, Err(e)),
            }
        }
    }
}
