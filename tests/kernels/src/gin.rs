//! GIN kernels: self-tests of the device GIN API and the benchmarks' kernels.
//!
//! Errors go to `errors[0]` (first code wins) and their count to `errors[1]`.

use devcomm_device::arch::{block_dim, block_idx, global_timer_ns, grid_dim, thread_idx};
use devcomm_device::atomic::Scope;
use devcomm_device::comm::{DevComm, WindowDesc};
use devcomm_device::coop::{Coop, Cta, ThreadCoop};
use devcomm_device::gin::{Gin, GinBarrierSession, GinBarrierTeam, GinError, LocalAction, RemoteAction};
use devcomm_device::kernel;

use crate::report::{check, report};

kernel! {
    /// Every rank puts `bytes` of its window at `src_off` into slot `rank` (of
    /// `slot` bytes, from offset 0) of every rank's window, itself included,
    /// on context `ctx`, each put followed by `SignalInc` of signal 0 at the
    /// peer and `CounterInc` of counter 0 here. Then: flush, wait for counter
    /// 0 to reach `counter_target` and signal 0 to reach `signal_target`
    /// (cumulative values the host computes). `released != 0`: the puts
    /// declare their source released at system scope (the host wrote it
    /// before the launch), so they post without a fence. One block.
    ///
    /// # Safety
    /// The window holds `nranks` slots and the source; the device
    /// communicator has GIN with at least one signal and one counter.
    pub unsafe fn gin_put_all(comm: DevComm, win: WindowDesc, src_off: u64, slot: u64, bytes: u64, ctx: u32, released: u32, signal_target: u64, counter_target: u64, errors: *mut u32) {
        let cta = Cta::new();
        let Some(gin) = check(errors, Gin::new(&comm, ctx)) else { return };
        let gin = if released != 0 { gin.with_given_release(Scope::Sys) } else { gin };
        let world = comm.world();
        for peer in 0..comm.nranks() {
            let r = gin.put(&cta, &world, peer, &win, comm.rank() as u64 * slot, &win, src_off, bytes,
                RemoteAction::SignalInc { signal: 0, strong: true }, LocalAction::CounterInc { counter: 0 });
            check(errors, r);
        }
        check(errors, gin.flush(&cta));
        check(errors, gin.wait_counter(&cta, 0, counter_target));
        check(errors, gin.wait_signal(&cta, 0, signal_target));
    }

    /// Thread 0 puts `values` inline `u64`s `base + rank * 1000 + k` into
    /// slot `rank` (index k) of every rank's window, the last one to each
    /// peer with `SignalAdd(values)` on signal 1; then waits for signal 1 to
    /// reach `signal_target`.
    ///
    /// # Safety
    /// As for [`gin_put_all`]; at least two signals.
    pub unsafe fn gin_put_values(comm: DevComm, win: WindowDesc, slot: u64, values: u32, base: u64, signal_target: u64, errors: *mut u32) {
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        if thread_idx().x == 0 {
            let world = comm.world();
            for peer in 0..comm.nranks() {
                for k in 0..values {
                    let remote = if k + 1 == values {
                        RemoteAction::SignalAdd { signal: 1, value: values as u64, strong: true }
                    } else {
                        RemoteAction::None
                    };
                    let v = base + comm.rank() as u64 * 1000 + k as u64;
                    check(errors, gin.put_value(&world, peer, &win, comm.rank() as u64 * slot + k as u64 * 8, v, remote, LocalAction::None));
                }
            }
        }
        check(errors, gin.wait_signal(&ThreadCoop, 1, signal_target));
    }

    /// Thread 0 adds `rank + 1` to signal 1 of every member of `team` (0: the
    /// world, 1: the rail team) with `signal`; then waits for signal 1 to
    /// reach `signal_target`.
    ///
    /// # Safety
    /// As for [`gin_put_values`].
    pub unsafe fn gin_signal_team(comm: DevComm, team: u32, signal_target: u64, errors: *mut u32) {
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let t = if team == 1 { comm.rail() } else { comm.world() };
        if thread_idx().x == 0 {
            for peer in 0..t.nranks {
                check(errors, gin.signal(&t, peer, RemoteAction::SignalAdd { signal: 1, value: comm.rank() as u64 + 1, strong: false }));
            }
        }
        check(errors, gin.wait_signal(&ThreadCoop, 1, signal_target));
    }

    /// `rounds` GIN barriers over `team` (0 world, 1 rail), barrier `index`.
    ///
    /// # Safety
    /// Every member of the team runs it with the same arguments.
    pub unsafe fn gin_barrier_rounds(comm: DevComm, team: u32, index: u32, rounds: u32, errors: *mut u32) {
        let cta = Cta::new();
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let which = if team == 1 { GinBarrierTeam::Rail } else { GinBarrierTeam::World };
        let Some(mut bar) = check(errors, GinBarrierSession::new(&cta, &gin, which, index)) else { return };
        for _ in 0..rounds {
            if check(errors, bar.sync(&cta)).is_none() {
                break;
            }
        }
    }

    /// Queue stress: every block's thread 0 posts `per_block` inline puts to
    /// rank `(rank + 1) % nranks`, value `(rank << 40) | (block << 20) | i`
    /// at slot `block * per_block + i` of the window (offset `base_off`),
    /// each with `SignalInc` on signal 2. Then every block waits for signal 2
    /// to reach `signal_target` (all blocks of the previous rank).
    ///
    /// # Safety
    /// The window holds `gridDim.x * per_block` u64s at `base_off`.
    pub unsafe fn gin_stress(comm: DevComm, win: WindowDesc, base_off: u64, per_block: u32, signal_target: u64, errors: *mut u32) {
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let b = block_idx().x as u64;
        if thread_idx().x == 0 {
            let world = comm.world();
            let peer = (comm.rank() + 1) % comm.nranks();
            for i in 0..per_block as u64 {
                let v = ((comm.rank() as u64) << 40) | (b << 20) | i;
                let off = base_off + (b * per_block as u64 + i) * 8;
                check(errors, gin.put_value(&world, peer, &win, off, v, RemoteAction::SignalInc { signal: 2, strong: true }, LocalAction::None));
            }
            check(errors, gin.wait_signal(&ThreadCoop, 2, signal_target));
        }
        let _ = grid_dim();
    }

    /// Tries calls that must fail and stores each error code in `codes`:
    /// [0] signal id out of range, [1] counter id out of range, [2] put past
    /// the window's end, [3] peer outside the team, [4] context out of range,
    /// [5] a put to world rank `rail_probe` (35 when it is outside the rail
    /// and the connection is Rail; 0 when the put was accepted).
    ///
    /// # Safety
    /// `codes` has 6 elements.
    pub unsafe fn gin_bad_calls(comm: DevComm, win: WindowDesc, rail_probe: u32, codes: *mut u32) {
        if thread_idx().x != 0 {
            return;
        }
        let code = |r: Result<(), GinError>| match r { Ok(()) => 0, Err(e) => e.code() };
        let Ok(gin) = Gin::new(&comm, 0) else {
            *codes = 32;
            return;
        };
        let world = comm.world();
        let me = ThreadCoop;
        *codes.add(0) = code(gin.signal(&world, 0, RemoteAction::SignalInc { signal: u32::MAX, strong: true }));
        *codes.add(1) = code(gin.put_value(&world, 0, &win, 0, 1u64, RemoteAction::None, LocalAction::CounterInc { counter: u32::MAX }));
        *codes.add(2) = code(gin.put(&me, &world, 0, &win, win.size() - 8, &win, 0, 16, RemoteAction::None, LocalAction::None));
        *codes.add(3) = code(gin.signal(&world, comm.nranks(), RemoteAction::None));
        *codes.add(4) = match Gin::new(&comm, comm.gin().contexts()) { Ok(_) => 0, Err(e) => e.code() };
        *codes.add(5) = code(gin.put_value(&world, rail_probe, &win, 0, 7u64, RemoteAction::None, LocalAction::None));
        let _ = gin.flush(&me);
    }

    /// Put + signal round trip between world ranks 0 and 1 over GIN, `iters`
    /// times, `bytes` per put (0: a signal alone), one thread. `out[0]`: ns on
    /// rank 0. Signal 3 must be 0 on both ranks at launch.
    ///
    /// # Safety
    /// Two or more ranks; the window holds `bytes` at offsets 0 and `bytes`.
    pub unsafe fn gin_pingpong(comm: DevComm, win: WindowDesc, bytes: u64, iters: u32, out: *mut u64, errors: *mut u32) {
        if comm.rank() > 1 || thread_idx().x != 0 {
            return;
        }
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let world = comm.world();
        let peer = 1 - comm.rank();
        let me = ThreadCoop;
        let base = 0;
        let t0 = global_timer_ns();
        for round in 1..=iters as u64 {
            if comm.rank() == 1 && check(errors, gin.wait_signal(&me, 3, base + round)).is_none() {
                break;
            }
            let remote = RemoteAction::SignalInc { signal: 3, strong: true };
            let r = if bytes == 0 {
                gin.signal(&world, peer, remote)
            } else if bytes <= 8 {
                gin.put_value(&world, peer, &win, bytes, round, remote, LocalAction::None)
            } else {
                gin.put(&me, &world, peer, &win, bytes, &win, 0, bytes, remote, LocalAction::None)
            };
            if check(errors, r).is_none() {
                break;
            }
            if comm.rank() == 0 && check(errors, gin.wait_signal(&me, 3, base + round)).is_none() {
                break;
            }
        }
        *out = global_timer_ns() - t0;
    }

    /// Message rate: every thread of every block posts `per_thread` inline
    /// 8-byte puts to rank `(rank + 1) % nranks` (no signal), then the block
    /// flushes. `out[0]`: ns from first post to the last flush (block 0's view).
    ///
    /// # Safety
    /// The window holds 8 bytes per (block, thread).
    pub unsafe fn gin_put_value_rate(comm: DevComm, win: WindowDesc, per_thread: u32, out: *mut u64, errors: *mut u32) {
        let cta = Cta::new();
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let world = comm.world();
        let peer = (comm.rank() + 1) % comm.nranks();
        let slot = (block_idx().x * cta.size() + cta.thread_rank()) as u64 * 8;
        let t0 = global_timer_ns();
        for i in 0..per_thread as u64 {
            if check(errors, gin.put_value(&world, peer, &win, slot, i, RemoteAction::None, LocalAction::None)).is_none() {
                break;
            }
        }
        check(errors, gin.flush(&cta));
        if block_idx().x == 0 && cta.is_leader() {
            *out = global_timer_ns() - t0;
        }
    }
}

kernel! {
    /// Put bandwidth over GIN: rank 0 posts `iters` puts of `bytes` (window
    /// offset 0 → the peer's offset `bytes * (1 + i % slots)` for put `i`:
    /// `slots` destinations in turn, 1 = always the same) to rank 1, each
    /// with `SignalInc` on signal 3, from `posters` threads of block 0
    /// (thread `t` posts the puts `i ≡ t mod posters`); rank 1 waits for
    /// all of them and answers with one `SignalInc` on rank 0's signal 3.
    /// `out[0]` on rank 0: ns from the first post to the answer; `out[1]`:
    /// ns thread 0's posting took (credit waits included). `released != 0`:
    /// the puts declare their source released at system scope
    /// ([`Gin::with_given_release`]; the source was written by the host
    /// before the launch), so they post without a fence each. Signal 3 must
    /// be 0 on both ranks.
    ///
    /// # Safety
    /// Two or more ranks; the window holds `(1 + slots) * bytes`; `out` has
    /// 2 words; `posters` is at most the block's size.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gin_put_bw(
        comm: DevComm,
        win: WindowDesc,
        bytes: u64,
        iters: u32,
        slots: u64,
        posters: u32,
        released: u32,
        out: *mut u64,
        errors: *mut u32,
    ) {
        let t = thread_idx().x;
        let posting = comm.rank() == 0 && t < posters.max(1);
        if comm.rank() > 1 || (t != 0 && !posting) {
            return;
        }
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        // released: the source was written before the kernel (by the host),
        // so the caller may declare it released at system scope.
        let gin = if released != 0 { gin.with_given_release(Scope::Sys) } else { gin };
        let world = comm.world();
        let me = ThreadCoop;
        let remote = RemoteAction::SignalInc { signal: 3, strong: true };
        let t0 = global_timer_ns();
        if comm.rank() == 0 {
            let mut i = t as u64;
            while i < iters as u64 {
                let dst = bytes * (1 + i % slots.max(1));
                if check(errors, gin.put(&me, &world, 1, &win, dst, &win, 0, bytes, remote, LocalAction::None)).is_none() {
                    return;
                }
                i += posters.max(1) as u64;
            }
            if t != 0 {
                return;
            }
            *out.add(1) = global_timer_ns() - t0;
            check(errors, gin.wait_signal(&me, 3, 1));
        } else {
            if check(errors, gin.wait_signal(&me, 3, iters as u64)).is_some() {
                check(errors, gin.signal(&world, 0, remote));
            }
        }
        *out = global_timer_ns() - t0;
    }
}

/// A row word of [`gin_dispatch()`]: `(from << 48) | (to << 40) | (round << 24) | i`.
pub const fn dispatch_word(from: u64, to: u64, round: u64, i: u64) -> u64 {
    (from << 48) | (to << 40) | ((round & 0xffff) << 24) | (i & 0xff_ffff)
}

/// Flags of [`gin_dispatch()`].
pub mod dispatch_flags {
    /// Flush right after the two puts (error site 1).
    pub const FLUSH_AFTER_PUTS: u32 = 1;
    /// Thread 0 alone stages, puts and flushes (`ThreadCoop`) instead of the CTA.
    pub const LEADER_ONLY: u32 = 2;
    /// The block of this rank's own slot sends to itself through GIN too.
    pub const GIN_TO_SELF: u32 = 4;
    /// Counter increment on the two puts (as the passing stress does).
    pub const COUNTER: u32 = 8;
    /// No staging writes in the kernel (the puts send what the host left there).
    pub const HOST_SRC: u32 = 16;
    /// Only the rows' put (no metadata put).
    pub const ONE_PUT: u32 = 32;
    /// One block, sending to rank `(rank + 1) % nranks`.
    pub const ONE_BLOCK: u32 = 64;
    /// The posting thread fences at system scope after the puts (a workaround).
    pub const FENCE_AFTER_PUTS: u32 = 128;
}

kernel! {
    /// An MoE-style dispatch over GIN as issue 13 describes it. Block `p`
    /// sends to world rank `p` (`gridDim.x == nranks`): the CTA copies `rows`
    /// u64 words from the token area (window offset `tok_off + p * rows * 8`,
    /// written by the host) into its staging area inside its own window
    /// (`stage_off + p * slot`, through `lsa_ptr(.., own lsa rank)`), its
    /// threads write 4 metadata words after them with `lsa::put_value`; the
    /// CTA posts `Gin::put` of the rows and of the metadata into rank `p`'s
    /// window at `rank * slot` (both `RemoteAction::None`); the leader posts
    /// `put_value` of the row count into `p`'s window at `cnt_off + rank * 8`
    /// with a strong `SignalInc` of signal 0; then `flush` over the CTA.
    /// Errors: `errors[0] = site * 100 + code` (first wins), site 1: flush
    /// after the puts, 2: the puts, 3: put_value, 4: final flush.
    ///
    /// # Safety
    /// The window holds the areas named; GIN with 1 signal (and a counter
    /// with [`dispatch_flags::COUNTER`]).
    pub unsafe fn gin_dispatch(comm: DevComm, win: WindowDesc, slot: u64, tok_off: u64, stage_off: u64, cnt_off: u64, rows: u64, flags: u32, errors: *mut u32) {
        use devcomm_device::lsa;
        let tag = |site: u32, r: Result<(), GinError>| -> bool {
            match r {
                Ok(()) => true,
                Err(e) => {
                    report(errors, site * 100 + e.code());
                    false
                }
            }
        };
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let world = comm.world();
        let me = comm.rank();
        let p = if flags & dispatch_flags::ONE_BLOCK != 0 { (me + 1) % comm.nranks() } else { block_idx().x };
        let tag = |site: u32, r: Result<(), GinError>| -> bool {
            let ok = tag(site, r);
            if !ok && thread_idx().x == 0 {
                for q in 0..comm.nranks().min(8) {
                    let done = devcomm_device::gin::proxy::completed(comm.gin(), q as u64).map(|v| v as u32).unwrap_or(u32::MAX - 1);
                    *errors.add(2 + q as usize) = done.wrapping_add(1000 * site);
                }
            }
            ok
        };
        if p >= comm.nranks() || (p == me && flags & dispatch_flags::GIN_TO_SELF == 0) {
            return;
        }
        let bytes = rows * 8;
        let stage = stage_off + p as u64 * slot;
        let dst = me as u64 * slot;
        let own = comm.lsa_rank();
        let local = if flags & dispatch_flags::COUNTER != 0 { LocalAction::CounterInc { counter: 0 } } else { LocalAction::None };
        if flags & dispatch_flags::LEADER_ONLY != 0 {
            if thread_idx().x != 0 {
                return;
            }
            let c = ThreadCoop;
            if flags & dispatch_flags::HOST_SRC == 0 {
            lsa::copy(&c, win.lsa_ptr::<u8>(stage, own), win.lsa_ptr::<u8>(tok_off + p as u64 * bytes, own), bytes as usize);
            for k in 0..4u64 {
                lsa::put_value(win.lsa_ptr::<u64>(stage + bytes + k * 8, own), dispatch_word(me as u64, p as u64, 0xffff, k));
            }
            }
            let ok = tag(2, gin.put(&c, &world, p, &win, dst, &win, stage, bytes, RemoteAction::None, local))
                && (flags & dispatch_flags::ONE_PUT != 0 || tag(2, gin.put(&c, &world, p, &win, dst + bytes, &win, stage + bytes, 32, RemoteAction::None, local)));
            if flags & dispatch_flags::FENCE_AFTER_PUTS != 0 {
                devcomm_device::atomic::fence_acq_rel(Scope::Sys);
            }
            if !ok || (flags & dispatch_flags::FLUSH_AFTER_PUTS != 0 && !tag(1, gin.flush(&c))) {
                return;
            }
            let r = gin.put_value(&world, p, &win, cnt_off + me as u64 * 8, rows, RemoteAction::SignalInc { signal: 0, strong: true }, LocalAction::None);
            if tag(3, r) {
                tag(4, gin.flush(&c));
            }
            return;
        }
        let cta = Cta::new();
        if flags & dispatch_flags::HOST_SRC == 0 {
            lsa::copy(&cta, win.lsa_ptr::<u8>(stage, own), win.lsa_ptr::<u8>(tok_off + p as u64 * bytes, own), bytes as usize);
            let t = thread_idx().x as u64;
            if t < 4 {
                lsa::put_value(win.lsa_ptr::<u64>(stage + bytes + t * 8, own), dispatch_word(me as u64, p as u64, 0xffff, t));
            }
        }
        let ok = tag(2, gin.put(&cta, &world, p, &win, dst, &win, stage, bytes, RemoteAction::None, local))
            && (flags & dispatch_flags::ONE_PUT != 0
                || tag(2, gin.put(&cta, &world, p, &win, dst + bytes, &win, stage + bytes, 32, RemoteAction::None, local)));
        if flags & dispatch_flags::FENCE_AFTER_PUTS != 0 && cta.is_leader() {
            devcomm_device::atomic::fence_acq_rel(Scope::Sys);
        }
        if !ok || (flags & dispatch_flags::FLUSH_AFTER_PUTS != 0 && !tag(1, gin.flush(&cta))) {
            return;
        }
        let r = if cta.is_leader() {
            gin.put_value(&world, p, &win, cnt_off + me as u64 * 8, rows, RemoteAction::SignalInc { signal: 0, strong: true }, LocalAction::None)
        } else {
            Ok(())
        };
        if tag(3, cta.agree(r)) {
            tag(4, gin.flush(&cta));
        }
    }

    /// The second kernel of [`gin_dispatch()`]: the CTA waits (`Gin::wait_signal`)
    /// until signal 0 has reached `target`. Error site 5.
    ///
    /// # Safety
    /// GIN with 1 signal.
    pub unsafe fn gin_dispatch_wait(comm: DevComm, target: u64, errors: *mut u32) {
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        if let Err(e) = gin.wait_signal(&Cta::new(), 0, target) {
            report(errors, 500 + e.code());
        }
    }
}

kernel! {
    /// One round of following a signal's shadow: thread 0 posts `k` weak
    /// `SignalInc`s of signal 3 to the next world rank (`Gin::signal`
    /// alone), then the CTA waits with `wait_signal_follow_shadow(3, k)`;
    /// thread `t` writes the `(before, delta)` it got to `out[2t..2t + 2]`,
    /// and thread 0 writes what `wait_signal_meet_shadow(3)` returns (at
    /// once: the shadow was just moved to the signal) to `out[2 * blockDim.x]`.
    ///
    /// # Safety
    /// GIN with at least 4 signals; `out` holds `2 * blockDim.x + 1` words;
    /// one block; the previous rank runs the same round.
    pub unsafe fn gin_shadow_round(comm: DevComm, k: u32, out: *mut u64, errors: *mut u32) {
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let cta = Cta::new();
        let next = (comm.rank() + 1) % comm.nranks();
        if cta.is_leader() {
            for _ in 0..k {
                if check(errors, gin.signal(&comm.world(), next, RemoteAction::SignalInc { signal: 3, strong: false })).is_none() {
                    break;
                }
            }
        }
        let Some((before, delta)) = check(errors, gin.wait_signal_follow_shadow(&cta, 3, k as u64)) else { return };
        let t = thread_idx().x as usize;
        *out.add(2 * t) = before;
        *out.add(2 * t + 1) = delta;
        if let Some(met) = check(errors, gin.wait_signal_meet_shadow(&cta, 3)) {
            if cta.is_leader() {
                *out.add(2 * cta.size() as usize) = met;
            }
        }
    }
}

kernel! {
    /// A put the proxy cannot carry out (`win` is a window the device
    /// communicator was not given with `use_window`), to the next world
    /// rank; then `flush` and a wait for signal 0, which nobody sends. Thread
    /// 0 writes the flush's device error code to `codes[0]` and the wait's
    /// to `codes[1]` (0: no error).
    ///
    /// # Safety
    /// `win` holds 64 bytes; GIN with a signal; `codes` holds 2 words; one thread.
    pub unsafe fn gin_unusable_window(comm: DevComm, win: WindowDesc, codes: *mut u32) {
        let code = |r: Result<(), GinError>| r.err().map_or(0, |e| e.code());
        let gin = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => {
                *codes = e.code();
                return;
            }
        };
        let next = (comm.rank() + 1) % comm.nranks();
        let t = ThreadCoop;
        let r = gin.put(&t, &comm.world(), next, &win, 0, &win, 0, 64, RemoteAction::None, LocalAction::None);
        *codes = code(r.and_then(|()| gin.flush(&t)));
        *codes.add(1) = code(gin.wait_signal(&t, 0, 1).map(drop));
    }

    /// One thread puts `bytes` from offset 0 of `win` to offset 0 of world
    /// peer `peer`'s `win`, `count` times on context 0, stopping at the
    /// first error; then, if `flush != 0` and nothing failed, flushes.
    /// `codes[0]`: the device error code of what failed (0: none),
    /// `codes[1]`: the puts posted.
    ///
    /// # Safety
    /// `win` holds `bytes`; `peer < nranks`; `codes` holds 2 words; one thread.
    pub unsafe fn gin_put_stream(comm: DevComm, win: WindowDesc, peer: u32, bytes: u64, count: u32, flush: u32, codes: *mut u32) {
        let gin = match Gin::new(&comm, 0) {
            Ok(g) => g,
            Err(e) => {
                *codes = e.code();
                return;
            }
        };
        let (t, world) = (ThreadCoop, comm.world());
        let mut posted = 0;
        let mut r = Ok(());
        while posted < count && r.is_ok() {
            r = gin.put(&t, &world, peer, &win, 0, &win, 0, bytes, RemoteAction::None, LocalAction::None);
            posted += r.is_ok() as u32;
        }
        if flush != 0 && r.is_ok() {
            r = gin.flush(&t);
        }
        *codes = r.err().map_or(0, |e| e.code());
        *codes.add(1) = posted;
    }

    /// Gets: entry `i` of `entries` (four u64s: world peer, source offset,
    /// destination offset, bytes) reads `bytes` of the peer's window into
    /// this rank's `win`, posted by thread `i % blockDim` of the one block.
    /// Completion by counter 0 (`by_counter != 0`: each get counts, thread 0
    /// waits for `counter_target`, cumulative) or by a flush of the CTA.
    /// Then `sums[i]` = Σ (j + 1) · byte j of entry `i`'s destination, as the
    /// kernel reads it after completion.
    ///
    /// # Safety
    /// One block; `entries` holds `4 * count` u64s and `sums` `count` u64s of
    /// device memory; the ranges lie in the window (else the get fails with
    /// `OutOfWindow`), destinations not overlapping each other.
    pub unsafe fn gin_get_batch(comm: DevComm, win: WindowDesc, entries: *const u64, count: u32, by_counter: u32, counter_target: u64, sums: *mut u64, errors: *mut u32) {
        let Some(gin) = check(errors, Gin::new(&comm, 0)) else { return };
        let (cta, world) = (Cta::new(), comm.world());
        let local = if by_counter != 0 { LocalAction::CounterInc { counter: 0 } } else { LocalAction::None };
        let mut i = thread_idx().x;
        while i < count {
            let e = entries.add(4 * i as usize);
            let (peer, src_off, dst_off, bytes) = (*e as u32, *e.add(1), *e.add(2), *e.add(3));
            check(errors, gin.get(&ThreadCoop, &world, peer, &win, dst_off, &win, src_off, bytes, local));
            i += block_dim().x;
        }
        let done = if by_counter != 0 { gin.wait_counter(&cta, 0, counter_target).map(|_| ()) } else { cta.sync(); gin.flush(&cta) };
        if check(errors, done).is_none() {
            return;
        }
        let mut i = thread_idx().x;
        while i < count {
            let e = entries.add(4 * i as usize);
            let (dst_off, bytes) = (*e.add(2), *e.add(3));
            let p = win.local_ptr::<u8>(dst_off);
            let mut sum = 0u64;
            for j in 0..bytes {
                sum = sum.wrapping_add((j + 1).wrapping_mul(p.add(j as usize).read_volatile() as u64));
            }
            *sums.add(i as usize) = sum;
            i += block_dim().x;
        }
    }
}
