//! The examples' kernels, written as a user writes a kernel crate: `no_std`,
//! kernels declared with `devcomm_device::kernel!`, a panic handler for the
//! GPU target. `examples/build.rs` turns this crate into PTX with
//! `devcomm-build` (from its committed copy in `examples/ptx/` when that is
//! fresh, so that running the examples needs no nightly toolchain); the
//! programs load it with `Device::load_module` and launch with
//! `Stream::launch_in`. On the emulated runtime the same functions run from
//! their host form.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![warn(missing_docs)]

use devcomm_device::atomic::{self, Scope};
use devcomm_device::comm::{DevComm, WindowDesc};
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::gin::{Gin, LocalAction, RemoteAction};
use devcomm_device::{arch, kernel, lsa};

devcomm_device::kernel_crate!();

/// Records the first non-zero error `code` in `*errors`.
///
/// # Safety
/// `errors` points to a `u32` the kernel may write.
unsafe fn report(errors: *mut u32, code: u32) {
    if code != 0 {
        // SAFETY: the caller's contract.
        unsafe { atomic::compare_exchange(errors, 0, code, atomic::Order::Relaxed, Scope::Gpu) };
    }
}

kernel! {
    /// One round of an LSA ring: the block copies `bytes` from the caller's
    /// window at `src_off` into the next LSA peer's window at `dst_off`
    /// (NVLink stores), then adds 1 to that peer's `u64` signal at `sig_off`
    /// with release, then waits until its own signal has reached `round`.
    /// A failed wait writes its device error code to `*errors`.
    ///
    /// # Safety
    /// `win` is a window of `comm`'s communicator holding `src_off + bytes`,
    /// `dst_off + bytes` and the 8-aligned `sig_off + 8` bytes; one block.
    pub unsafe fn lsa_put_signal(comm: DevComm, win: WindowDesc, src_off: u64, dst_off: u64, sig_off: u64, bytes: u64, round: u64, errors: *mut u32) {
        let cta = Cta::new();
        let next = (comm.lsa_rank() + 1) % comm.lsa_size();
        lsa::copy(&cta, win.lsa_ptr(dst_off, next), win.local_ptr(src_off), bytes as usize);
        cta.sync(); // every thread's stores come before the signal
        if cta.is_leader() {
            lsa::signal_add(win.lsa_ptr::<u64>(sig_off, next), 1);
            if let Err(e) = lsa::wait_signal(win.local_ptr::<u64>(sig_off), round, &comm.abort()) {
                report(errors, e.code());
            }
        }
        cta.sync();
    }

    /// `iters` rounds of GIN ping-pong between world ranks 0 and 1: rank 0
    /// puts `bytes` from its window at offset 0 to rank 1's window at
    /// `bytes` with an increment of signal 0 there, and waits for rank 1 to
    /// do the same back; rank 1 waits, then answers. `out[0]` gets the
    /// elapsed nanoseconds on rank 0; the first failure's device error code
    /// goes to `*errors`. Other ranks return at once.
    ///
    /// # Safety
    /// `win` is registered for GIN (`DevCommRequirements::use_window`) and
    /// holds `2 * bytes`; `comm` has GIN with signal 0; one block.
    pub unsafe fn gin_pingpong(comm: DevComm, win: WindowDesc, bytes: u64, iters: u32, out: *mut u64, errors: *mut u32) {
        let me = comm.rank();
        if me > 1 {
            return;
        }
        let peer = 1 - me;
        let cta = Cta::new();
        let gin = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => { report(errors, e.code()); return; }
        };
        let world = comm.world();
        let signal = RemoteAction::SignalInc { signal: 0, strong: true };
        let t0 = arch::global_timer_ns();
        for round in 1..=iters as u64 {
            let step = |wait_first: bool| -> Result<(), devcomm_device::gin::GinError> {
                if wait_first {
                    gin.wait_signal(&cta, 0, round)?;
                }
                gin.put(&cta, &world, peer, &win, bytes, &win, 0, bytes, signal, LocalAction::None)?;
                if !wait_first {
                    gin.wait_signal(&cta, 0, round)?;
                }
                Ok(())
            };
            if let Err(e) = step(me == 1) {
                report(errors, e.code());
                break;
            }
        }
        if let Err(e) = gin.flush(&cta) {
            report(errors, e.code());
        }
        if me == 0 && cta.is_leader() {
            *out = arch::global_timer_ns() - t0;
        }
    }
}

kernel! {
    /// The `devcomm` crate's walkthrough kernel: word 0 of the next rank's
    /// window := my rank + 100 (an LSA store), an LSA barrier, then word 2
    /// of the next rank's window := my word 1 (a GIN put with signal 0),
    /// waiting for the previous rank's. The first failure's device error
    /// code goes to `*errors`.
    ///
    /// # Safety
    /// `win` holds 24 bytes, is registered for GIN, and every rank is in
    /// the LSA team; `comm` has LSA barrier 0 and GIN signal 0; one block.
    pub unsafe fn ring_step(comm: DevComm, win: WindowDesc, errors: *mut u32) {
        use devcomm_device::atomic::Order;
        use devcomm_device::lsa::LsaBarrierSession;
        let cta = Cta::new();
        let next = (comm.rank() + 1) % comm.nranks();
        if cta.is_leader() {
            *win.lsa_ptr::<u64>(0, next) = comm.rank() as u64 + 100;
        }
        let r = LsaBarrierSession::new(&cta, &comm, 0).and_then(|mut b| b.sync(&cta, Order::AcqRel));
        if let Err(e) = r {
            report(errors, e.code());
            return;
        }
        let gin = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => { report(errors, e.code()); return; }
        };
        let signal = RemoteAction::SignalInc { signal: 0, strong: true };
        let r = gin
            .put(&cta, &comm.world(), next, &win, 16, &win, 8, 8, signal, LocalAction::None)
            .and_then(|()| gin.wait_signal(&cta, 0, 1).map(drop))
            .and_then(|()| gin.flush(&cta));
        if let Err(e) = r {
            report(errors, e.code());
        }
    }
}
