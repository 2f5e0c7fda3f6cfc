//! Purpose-written *wrong* kernels, each with its correct version behind a
//! `correct` argument: the cases the emulator's strict mode
//! (`DEVCOMM_EMU_STRICT=1`) must fail as a GPU may, and the correct
//! versions that must pass everywhere (`tests/strict_emulator.rs`).
//!
//! | kernel | the bug (`correct == 0`) | the fix |
//! |---|---|---|
//! | [`strict_lsa_signal()`] | data stored to an LSA peer, then a *relaxed* signal | a release signal ([`lsa::signal_add`]) |
//! | [`strict_lsa_cta_signal()`] | a block copies to an LSA peer, joins a barrier, and its leader signals *relaxed* | a release signal after the barrier |
//! | [`strict_flag_acquire()`] | a flag polled with *relaxed* loads, then the data read | an acquire load of the flag |
//! | [`strict_reuse_barrier()`] | a shared buffer rewritten with no barrier after the others read it | a barrier before the rewrite |
//! | [`strict_gin_given_release()`] | a put's freshly written source declared released ([`Gin::with_given_release`]) | the put's own fence |
//! | [`strict_gin_reuse_flush()`] | a put's source rewritten before [`Gin::flush`] | a flush first |
//! | [`strict_grid_wait()`] | blocks that wait for each other, launched plainly | a co-resident launch (host side) |
//!
//! Every kernel records in `out` (four `u64`s, zero before the launch):
//! `out[0]` how many wrong values it read, `out[1]` the first round that
//! read one, `out[2]` a device error code (a wait that timed out: first
//! wins). Values are [`strict_word()`]`(round, rank, index)`.

use devcomm_device::arch::{self, thread_rank_in_block, threads_per_block};
use devcomm_device::atomic::{self, Order, Scope};
use devcomm_device::comm::{AbortInfo, DevComm, WindowDesc};
use devcomm_device::coop::{Coop, Cta, ThreadCoop};
use devcomm_device::gin::{Gin, GinError, LocalAction, RemoteAction};
use devcomm_device::lsa;
use devcomm_device::wait::{self, Deadline};

/// Words of `out` the kernels write.
pub const OUT_WORDS: usize = 4;

/// The value word `index` carries in round `round` from rank `rank`.
pub const fn strict_word(round: u64, rank: u64, index: u64) -> u64 {
    (round << 40) | (rank << 32) | index
}

/// Counts a wrong value read in round `round`.
///
/// # Safety
/// `out` points to [`OUT_WORDS`] `u64`s the kernel can write.
#[inline(always)]
unsafe fn bad(out: *mut u64, round: u64) {
    atomic::fetch_add(out, 1, Order::Relaxed, Scope::Gpu);
    atomic::compare_exchange(out.add(1), 0, round, Order::Relaxed, Scope::Gpu);
}

/// Records a device error code (first wins).
///
/// # Safety
/// As for [`bad`].
#[inline(always)]
unsafe fn failed(out: *mut u64, code: u32) {
    atomic::compare_exchange(out.add(2), 0, code as u64, Order::Relaxed, Scope::Gpu);
}

devcomm_device::kernel! {
    /// Every thread of one block stores its `words_per_thread` words of
    /// round `r` into the next LSA peer's window (offset 0) with
    /// [`lsa::put_value`] and adds 1 to that peer's signal word at
    /// `sig_off` — with release ([`lsa::signal_add`]) when `correct`, with a
    /// relaxed add otherwise: the bug, nothing orders the data before the
    /// signal. Each thread then waits (acquire) until its own signal word
    /// counts every thread of the previous peer for round `r`, checks its
    /// words of what that peer sent, and acknowledges with a release add
    /// to the previous peer's word at `sig_off + 64`; before round `r + 1`
    /// it waits (acquire) for the next peer's acknowledgements of round
    /// `r`. No barrier anywhere: a barrier releases too.
    ///
    /// # Safety
    /// The window holds `words_per_thread * threads * 8` bytes at 0 and two
    /// `u64`s at `sig_off` and `sig_off + 64` (zero before the first
    /// launch) on every LSA peer; one block; `out` as in the module docs.
    pub unsafe fn strict_lsa_signal(comm: DevComm, win: WindowDesc, sig_off: u64, words_per_thread: u32, rounds: u32, correct: u32, out: *mut u64) {
        let (me, n) = (win.lsa_rank(), win.lsa_size());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let (t, nt) = (thread_rank_in_block() as u64, threads_per_block() as u64);
        let abort = comm.abort();
        let words = words_per_thread as u64 * nt;
        for r in 1..=rounds as u64 {
            if r > 1 {
                // The next peer has checked round r - 1: its area is free.
                if let Err(e) = lsa::wait_signal(win.local_ptr(sig_off + 64), (r - 1) * nt, &abort) {
                    failed(out, e.code());
                    return;
                }
            }
            let dst = win.lsa_ptr::<u64>(0, next);
            let mut k = t;
            while k < words {
                lsa::put_value(dst.add(k as usize), strict_word(r, me as u64, k));
                k += nt;
            }
            let signal = win.lsa_ptr::<u64>(sig_off, next);
            if correct != 0 {
                lsa::signal_add(signal, 1);
            } else {
                atomic::red_add_relaxed(signal, 1, Scope::Sys);
            }
            if let Err(e) = lsa::wait_signal(win.local_ptr(sig_off), r * nt, &abort) {
                failed(out, e.code());
                return;
            }
            let src = win.local_ptr::<u64>(0);
            let mut k = t;
            while k < words {
                if lsa::get_value(src.add(k as usize)) != strict_word(r, prev as u64, k) {
                    bad(out, r);
                }
                k += nt;
            }
            lsa::signal_add(win.lsa_ptr(sig_off + 64, prev), 1);
        }
    }

    /// The common form of [`strict_lsa_signal()`]: the block copies round
    /// `r`'s words into the next LSA peer's window (offset 0) with
    /// [`lsa::copy`], joins a barrier, and its leader adds 1 to the peer's
    /// signal word at `sig_off` — with release when `correct`, relaxed
    /// otherwise: the bug, the barrier orders the block's stores before the
    /// leader's signal for the block only, not for the peer. The leader
    /// then waits (acquire) for its own signal to reach `r`, the block
    /// checks what the previous peer sent, and the leader acknowledges with
    /// a release add at the previous peer's `sig_off + 64`; before round
    /// `r + 1` the leader waits (acquire) for the next peer's
    /// acknowledgement of round `r`. `src_off` holds the block's source:
    /// `words` `u64`s the kernel writes itself each round.
    ///
    /// # Safety
    /// The window holds `words * 8` bytes at 0 and at `src_off`, and two
    /// `u64`s at `sig_off` and `sig_off + 64` (zero before the first
    /// launch) on every LSA peer; one block; `out` as in the module docs.
    pub unsafe fn strict_lsa_cta_signal(comm: DevComm, win: WindowDesc, src_off: u64, sig_off: u64, words: u32, rounds: u32, correct: u32, out: *mut u64) {
        let cta = Cta::new();
        let (me, n) = (win.lsa_rank(), win.lsa_size());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let (t, nt) = (thread_rank_in_block() as u64, threads_per_block() as u64);
        let abort = comm.abort();
        let words = words as u64;
        let src = win.local_ptr::<u64>(src_off);
        for r in 1..=rounds as u64 {
            let mut k = t;
            while k < words {
                lsa::put_value(src.add(k as usize), strict_word(r, me as u64, k));
                k += nt;
            }
            let ready = if cta.is_leader() && r > 1 {
                lsa::wait_signal(win.local_ptr(sig_off + 64), r - 1, &abort).map(|_| ())
            } else {
                Ok(())
            };
            if let Err(e) = cta.agree(ready) {
                failed(out, e.code());
                return;
            }
            lsa::copy(&cta, win.lsa_ptr(0, next), src as *const u8, (words * 8) as usize);
            cta.sync();
            let seen = if cta.is_leader() {
                let signal = win.lsa_ptr::<u64>(sig_off, next);
                if correct != 0 {
                    lsa::signal_add(signal, 1);
                } else {
                    atomic::red_add_relaxed(signal, 1, Scope::Sys);
                }
                lsa::wait_signal(win.local_ptr(sig_off), r, &abort).map(|_| ())
            } else {
                Ok(())
            };
            if let Err(e) = cta.agree(seen) {
                failed(out, e.code());
                return;
            }
            let got = win.local_ptr::<u64>(0);
            let mut k = t;
            while k < words {
                if lsa::get_value(got.add(k as usize)) != strict_word(r, prev as u64, k) {
                    bad(out, r);
                }
                k += nt;
            }
            cta.sync();
            if cta.is_leader() {
                lsa::signal_add(win.lsa_ptr(sig_off + 64, prev), 1);
            }
        }
    }

    /// Two blocks of one grid (launch it co-resident), `2 * threads`
    /// words at `data`. Block 0's thread `t` writes words `2t, 2t + 1` of
    /// round `r` with [`lsa::put_value`] and adds 1 to `flag` with release.
    /// Block 1's thread `t` polls `flag` until it counts every producer
    /// thread of round `r` — with acquire loads when `correct`, with
    /// relaxed ones otherwise: the bug, its later loads are not ordered
    /// after the producer's stores — then reads the two words as one
    /// 16-byte plain load ([`arch::load16`], cached on a GPU), checks them
    /// and adds 1 to `ack` with release. Producers wait (acquire) for
    /// every acknowledgement of round `r - 1` before writing round `r`.
    ///
    /// # Safety
    /// `data` holds `2 * threads` `u64`s, 16-byte aligned; `flag` and `ack`
    /// are `u64`s, zero before the launch; two blocks of the same size,
    /// co-resident; `out` as in the module docs.
    pub unsafe fn strict_flag_acquire(data: *mut u64, flag: *mut u64, ack: *mut u64, rounds: u32, timeout_ns: u64, correct: u32, out: *mut u64) {
        let (t, nt) = (thread_rank_in_block() as u64, threads_per_block() as u64);
        let abort = AbortInfo::none().with_timeout_ns(timeout_ns);
        let mine = data.add(2 * t as usize);
        for r in 1..=rounds as u64 {
            if arch::block_idx().x == 0 {
                let mut d = Deadline::new(&abort);
                if let Err(e) = wait::wait_ge_u64(ack, (r - 1) * nt, Scope::Gpu, &mut d) {
                    failed(out, e.code());
                    return;
                }
                lsa::put_value(mine, strict_word(r, 0, 2 * t));
                lsa::put_value(mine.add(1), strict_word(r, 0, 2 * t + 1));
                atomic::red_add_release(flag, 1, Scope::Gpu);
            } else {
                let mut d = Deadline::new(&abort);
                let seen = if correct != 0 {
                    wait::wait_ge_u64(flag, r * nt, Scope::Gpu, &mut d).map(|_| ())
                } else {
                    loop {
                        if atomic::load_relaxed(flag as *const u64, Scope::Gpu) >= r * nt {
                            break Ok(());
                        }
                        if let Err(e) = d.poll() {
                            break Err(e);
                        }
                    }
                };
                if let Err(e) = seen {
                    failed(out, e.code());
                    return;
                }
                let v = arch::load16(mine as *const u8);
                let got = [v[0] as u64 | (v[1] as u64) << 32, v[2] as u64 | (v[3] as u64) << 32];
                if got != [strict_word(r, 0, 2 * t), strict_word(r, 0, 2 * t + 1)] {
                    bad(out, r);
                }
                atomic::red_add_release(ack, 1, Scope::Gpu);
            }
        }
    }

    /// Every block's thread 0 adds 1 to `arrived` (release) and waits
    /// (acquire, at most `timeout_ns`) until every block of the grid has:
    /// a grid barrier, launch `launch_index` (from 0) of a sequence on the
    /// same counter. Correct only when the launch makes every block
    /// resident at once (`LaunchConfig::co_resident` on the host): without
    /// it a GPU may run part of the grid first — and the strict emulator
    /// does — and the waiting blocks hold the others out (the bug; the wait
    /// ends in a timeout, recorded in `out[2]`).
    ///
    /// # Safety
    /// `arrived` is a `u64`, zero before the first launch of the sequence;
    /// `out` as in the module docs.
    pub unsafe fn strict_grid_wait(arrived: *mut u64, launch_index: u32, timeout_ns: u64, out: *mut u64) {
        if thread_rank_in_block() == 0 {
            let blocks = arch::grid_dim().x as u64 * arch::grid_dim().y as u64 * arch::grid_dim().z as u64;
            atomic::red_add_release(arrived, 1, Scope::Gpu);
            let abort = AbortInfo::none().with_timeout_ns(timeout_ns);
            let mut d = Deadline::new(&abort);
            if let Err(e) = wait::wait_ge_u64(arrived, (launch_index as u64 + 1) * blocks, Scope::Gpu, &mut d) {
                failed(out, e.code());
            }
        }
        arch::sync_threads();
    }

    /// One block; `stage` holds one `u64` per thread. Each round every
    /// thread writes its word with [`lsa::put_value`], joins a block
    /// barrier, and reads its neighbour's word with [`lsa::get_value`];
    /// with `correct` a second barrier follows before the next round's
    /// write, without it a thread may rewrite its word while its
    /// neighbour has yet to read it — the bug.
    ///
    /// # Safety
    /// `stage` holds `threads` `u64`s; one block; `out` as in the module docs.
    pub unsafe fn strict_reuse_barrier(stage: *mut u64, rounds: u32, correct: u32, out: *mut u64) {
        let (t, nt) = (thread_rank_in_block() as u64, threads_per_block() as u64);
        let next = (t + 1) % nt;
        for r in 1..=rounds as u64 {
            lsa::put_value(stage.add(t as usize), strict_word(r, 0, t));
            arch::sync_threads();
            if lsa::get_value(stage.add(next as usize)) != strict_word(r, 0, next) {
                bad(out, r);
            }
            if correct != 0 {
                arch::sync_threads();
            }
        }
    }

    /// GIN between ranks (one block): every thread stages its `chunk`
    /// `u64`s of round `r` in its own window at `stage_off + t * chunk * 8`
    /// with [`lsa::put_value`] and puts them (its own
    /// [`ThreadCoop`] put) to the next rank's window at
    /// `recv_off + t * chunk * 8` with a strong `SignalInc` of signal 0.
    /// With `correct` the put fences first (the default); without, the
    /// handle declares the source already released at system scope
    /// ([`Gin::with_given_release`]) — the bug: nothing publishes the
    /// staging stores before the proxy reads them. Each thread then waits
    /// for its signal 0 to count every thread of the previous rank for
    /// round `r`, checks its chunk of what arrived, acknowledges with
    /// `SignalInc` of signal 1 at the previous rank, flushes, and waits
    /// for the next rank's acknowledgements before the next round.
    ///
    /// # Safety
    /// The window holds both areas (`threads * chunk * 8` bytes each) on
    /// every rank; GIN with two signals, zero before the first launch, and
    /// a queue deeper than `2 * threads`; one block; `out` as in the
    /// module docs.
    pub unsafe fn strict_gin_given_release(comm: DevComm, win: WindowDesc, stage_off: u64, recv_off: u64, chunk: u32, rounds: u32, correct: u32, out: *mut u64) {
        let base = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => return failed(out, e.code()),
        };
        let gin = if correct != 0 { base } else { base.with_given_release(Scope::Sys) };
        if let Err(e) = gin_rounds(&comm, &gin, &win, stage_off, recv_off, chunk as u64, rounds as u64, false, out) {
            failed(out, e.code());
        }
    }

    /// As [`strict_gin_given_release()`] with the default (fencing) puts, but
    /// right after posting its put every thread overwrites its staged
    /// chunk (as a next step's data would) and publishes that with a
    /// system-scope fence; with `correct` it flushes first
    /// ([`Gin::flush`]: the proxy has read the source), without — the bug —
    /// the proxy may send the overwritten bytes.
    ///
    /// # Safety
    /// As for [`strict_gin_given_release()`].
    pub unsafe fn strict_gin_reuse_flush(comm: DevComm, win: WindowDesc, stage_off: u64, recv_off: u64, chunk: u32, rounds: u32, correct: u32, out: *mut u64) {
        let gin = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => return failed(out, e.code()),
        };
        let early = correct == 0;
        if let Err(e) = gin_rounds(&comm, &gin, &win, stage_off, recv_off, chunk as u64, rounds as u64, early, out) {
            failed(out, e.code());
        }
    }
}

/// The rounds of the two GIN kernels. Each overwrites its staged chunk
/// once per round (garbage standing for the area's next use), published
/// with a system-scope fence: `early`, right after posting the put (the
/// reuse bug); otherwise after the flush that says the proxy has read it.
///
/// # Safety
/// As for [`strict_gin_given_release()`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn gin_rounds(
    comm: &DevComm,
    gin: &Gin,
    win: &WindowDesc,
    stage_off: u64,
    recv_off: u64,
    chunk: u64,
    rounds: u64,
    early: bool,
    out: *mut u64,
) -> Result<(), GinError> {
    let (me, n) = (comm.rank(), comm.nranks());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let (t, nt) = (thread_rank_in_block() as u64, threads_per_block() as u64);
    let world = comm.world();
    let stage = win.local_ptr::<u64>(stage_off + t * chunk * 8);
    let recv = win.local_ptr::<u64>(recv_off + t * chunk * 8);
    for r in 1..=rounds {
        for k in 0..chunk {
            lsa::put_value(stage.add(k as usize), strict_word(r, me as u64, t * chunk + k));
        }
        gin.put(
            &ThreadCoop,
            &world,
            next,
            win,
            recv_off + t * chunk * 8,
            win,
            stage_off + t * chunk * 8,
            chunk * 8,
            RemoteAction::SignalInc { signal: 0, strong: true },
            LocalAction::None,
        )?;
        if early {
            overwrite(stage, chunk, r, me, t);
        }
        gin.wait_signal(&ThreadCoop, 0, r * nt)?;
        for k in 0..chunk {
            if lsa::get_value(recv.add(k as usize)) != strict_word(r, prev as u64, t * chunk + k) {
                bad(out, r);
            }
        }
        gin.signal(&world, prev, RemoteAction::SignalInc { signal: 1, strong: true })?;
        gin.flush(&ThreadCoop)?;
        if !early {
            overwrite(stage, chunk, r, me, t);
        }
        gin.wait_signal(&ThreadCoop, 1, r * nt)?;
    }
    Ok(())
}

/// Overwrites thread `t`'s staged chunk of round `r` with garbage and
/// publishes it at system scope.
///
/// # Safety
/// `stage` holds `chunk` `u64`s of the caller's window.
#[inline(always)]
unsafe fn overwrite(stage: *mut u64, chunk: u64, r: u64, me: u32, t: u64) {
    for k in 0..chunk {
        lsa::put_value(stage.add(k as usize), !strict_word(r, me as u64, t * chunk + k));
    }
    atomic::fence_acq_rel(Scope::Sys);
}
