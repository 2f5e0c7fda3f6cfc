//! Routed put / signal / wait ([`devcomm_device::route::Router`]): every
//! peer reached over LSA or GIN, whichever the router picks.
//!
//! Errors go to `errors[0]` (first code wins) and their count to
//! `errors[1]`; data mismatches count in `errors[2]`.

use devcomm_device::arch::{block_dim, block_idx, thread_idx};
use devcomm_device::atomic::{self, Scope};
use devcomm_device::comm::{DevComm, SymPtr, WindowDesc};
use devcomm_device::coop::{Coop, Cta};
use devcomm_device::gin::GinError;
use devcomm_device::kernel;
use devcomm_device::lsa::ops::{get_value, put_value};
use devcomm_device::route::Router;

use crate::report::check;

/// Routed signals each block of [`route_exchange()`] uses.
pub const SIGNALS_PER_BLOCK: u32 = 2;

/// Byte `i` of the message rank `rank`'s block `block` sends in round `round`.
#[inline(always)]
pub fn pattern(rank: u32, block: u32, round: u32, i: u64) -> u8 {
    let x = (i as u32).wrapping_mul(2_654_435_761)
        ^ rank.wrapping_mul(0x9E37)
        ^ block.wrapping_mul(0x7F4A_7C15)
        ^ round.wrapping_mul(0x85EB_CA6B);
    (x ^ (x >> 13) ^ (x >> 24)) as u8
}

/// The value rank `rank` stores into its peers' word in round `round`.
#[inline(always)]
pub const fn word(rank: u32, round: u32) -> u64 {
    ((round as u64) << 32) | rank as u64 | 0x5A00_0000
}

/// What round `round` adds to a block's "done" signal from one peer: even
/// rounds signal with the put of the word (+1), odd ones with a separate
/// `signal` of 2.
#[inline(always)]
pub const fn done_increment(round: u32) -> u64 {
    if round % 2 == 0 {
        1
    } else {
        2
    }
}

/// Bytes of one block's area in [`route_exchange()`]'s window layout:
/// `nranks` slots and the source, `slot` bytes each, then `nranks` words.
pub const fn area_bytes(nranks: u64, slot: u64) -> u64 {
    (nranks + 1) * slot + nranks * 8
}

/// Counts a mismatch in `errors[2]`.
///
/// # Safety
/// `errors` points to three `u32`s the kernel can write.
#[inline(always)]
unsafe fn mismatch(errors: *mut u32) {
    atomic::red_add_relaxed(errors.add(2), 1u32, Scope::Gpu);
}

kernel! {
    /// Rounds `first_round .. first_round + rounds` of an exchange among all
    /// ranks through a [`Router`] (GIN context 0), each block on its own
    /// area (at `area_off + block * area_bytes(nranks, slot)`) and its own
    /// two routed signals (`2 * block`: data, `2 * block + 1`: done). Per
    /// round every block: writes its `bytes`-byte message into its source,
    /// puts it into slot `rank` of every rank (itself included) with a
    /// signal, waits for all `nranks` messages and checks them byte by byte
    /// (and that the slot's byte past the message is still the host's
    /// poison `0xCB`), flushes; then puts [`word`] into word `rank` of every
    /// rank (even rounds: with the done signal; odd: a separate signal of
    /// 2), waits for all and checks them. The signal targets count from the
    /// rounds before `first_round` (the signals are never reset).
    ///
    /// # Safety
    /// The window holds `grid_dim.x` areas from `area_off` and the routed
    /// signal words at `sig_off` (`2 * grid_dim.x` zeroed `u64`s at first);
    /// GIN (if any) has as many signals; `slot > bytes` and a multiple of
    /// 8; every rank runs the same grid, co-resident; `errors` holds 3 words.
    pub unsafe fn route_exchange(comm: DevComm, win: WindowDesc, sig_off: u64, area_off: u64, slot: u64, bytes: u64, first_round: u32, rounds: u32, errors: *mut u32) {
        let cta = Cta::new();
        let (n, me, b) = (comm.nranks(), comm.rank(), block_idx().x);
        let signals = SymPtr::<u64>::new(win, sig_off);
        let count = 2 * devcomm_device::arch::grid_dim().x;
        let Some(router) = check(errors, Router::new(&comm, 0, signals, count)) else { return };
        let area = area_off + b as u64 * area_bytes(n as u64, slot);
        let slots = SymPtr::<u8>::new(win, area);
        let src = slots.add(n as u64 * slot);
        let words = SymPtr::<u64>::new(win, area + (n as u64 + 1) * slot);
        let (data_sig, done_sig) = (SIGNALS_PER_BLOCK * b, SIGNALS_PER_BLOCK * b + 1);
        let world = comm.world();
        let (t, nt) = (thread_idx().x as u64, block_dim().x as u64);
        let mut done_target = 0u64;
        for r in 0..first_round {
            done_target += n as u64 * done_increment(r);
        }
        for r in first_round..first_round + rounds {
            let mut i = t;
            while i < bytes {
                put_value(src.local().add(i as usize), pattern(me, b, r, i));
                i += nt;
            }
            let mut ok = true;
            for peer in 0..n {
                let put = router.put(&cta, &world, peer, slots.add(me as u64 * slot), src, bytes, Some(data_sig));
                ok &= check(errors, put).is_some();
            }
            if !ok || check(errors, router.wait(&cta, data_sig, (r as u64 + 1) * n as u64)).is_none() {
                return;
            }
            for p in 0..n {
                let slot_p = slots.add(p as u64 * slot).local();
                let mut i = t;
                while i <= bytes {
                    let want = if i == bytes { 0xCB } else { pattern(p, b, r, i) };
                    if get_value(slot_p.add(i as usize)) != want {
                        mismatch(errors);
                    }
                    i += nt;
                }
            }
            if check(errors, router.flush(&cta)).is_none() {
                return;
            }
            done_target += n as u64 * done_increment(r);
            // The leader stores the words; every thread learns its outcome.
            let mut sent: Result<(), GinError> = Ok(());
            if cta.is_leader() {
                let dst = words.add(me as u64);
                for peer in 0..n {
                    if sent.is_ok() {
                        sent = if r % 2 == 0 {
                            router.put_value(&world, peer, dst, word(me, r), Some(done_sig))
                        } else {
                            router.put_value(&world, peer, dst, word(me, r), None)
                                .and_then(|()| router.signal(&world, peer, done_sig, 2))
                        };
                    }
                }
            }
            if check(errors, cta.agree(sent)).is_none() {
                return;
            }
            if check(errors, router.wait(&cta, done_sig, done_target)).is_none() {
                return;
            }
            let mut p = t as u32;
            while p < n {
                if get_value(words.add(p as u64).local()) != word(p, r) {
                    mismatch(errors);
                }
                p += nt as u32;
            }
            cta.sync();
        }
    }

    /// Calls that must fail, one code each into `codes` (0: it succeeded):
    /// 0 signals past the window's end, 1 signals misaligned, 2 a put to a
    /// peer past the world, 3 a signal id past the count, 4 a 16-byte
    /// value, 5 a wait on a signal past the count, 6 a put past the
    /// destination window's end, 7 a put to world rank `probe` (the host
    /// knows what it should give: `NoGin` without GIN and off the node).
    /// One block.
    ///
    /// # Safety
    /// `sig_off` holds 2 routed signal words in `win`; `codes` 8 words.
    pub unsafe fn route_bad_calls(comm: DevComm, win: WindowDesc, sig_off: u64, probe: u32, codes: *mut u32) {
        let cta = Cta::new();
        let code = |r: Result<(), GinError>| r.err().map_or(0, |e| e.code());
        let world = comm.world();
        let past = SymPtr::<u64>::new(win, win.size() - 8);
        let c0 = code(Router::new(&comm, 0, past, 2).map(|_| ()));
        let c1 = code(Router::new(&comm, 0, SymPtr::new(win, sig_off + 4), 1).map(|_| ()));
        let router = match Router::new(&comm, 0, SymPtr::new(win, sig_off), 2) {
            Ok(r) => r,
            Err(e) => {
                if thread_idx().x == 0 {
                    *codes = 100 + e.code();
                }
                return;
            }
        };
        let src = SymPtr::<u8>::new(win, 0);
        let c2 = code(router.put(&cta, &world, comm.nranks(), src, src, 8, Some(0)));
        let c3 = if cta.is_leader() { code(router.signal(&world, comm.rank(), 2, 1)) } else { 0 };
        let c4 = if cta.is_leader() { code(router.put_value(&world, comm.rank(), SymPtr::new(win, 0), [1u64, 2u64], None)) } else { 0 };
        let c5 = code(router.wait(&cta, 5, 1).map(|_| ()));
        let c6 = code(router.put(&cta, &world, comm.rank(), SymPtr::<u8>::new(win, win.size() - 4), src, 8, None));
        let c7 = code(router.put(&cta, &world, probe, SymPtr::<u8>::new(win, 64), src, 8, None));
        if cta.is_leader() {
            for (k, c) in [c0, c1, c2, c3, c4, c5, c6, c7].into_iter().enumerate() {
                *codes.add(k) = c;
            }
        }
    }
}
