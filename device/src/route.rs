//! Put, signal and wait that pick LSA or GIN per peer: one loop over all
//! peers, one wait.
//!
//! A kernel whose peers sit both inside its node (load/store-accessible:
//! the LSA team) and outside it (reached through GIN) would otherwise route
//! every peer by hand and wait on two kinds of signal: LSA signal words in
//! a window, and GIN signals. A [`Router`] does both: [`Router::put`] moves
//! the data with NVLink stores to an LSA peer and with a GIN put to any
//! other, and bumps the peer's routed signal; [`Router::wait`] waits until
//! the routed signal, counted over both routes, reaches a value.
//!
//! A routed signal `s` is two words on the receiver: word `s` of the LSA
//! signal array the router was made with (a `u64` array in a window, the
//! same offset on every rank, zeroed by the host before first use) that LSA
//! peers add to with a system-scope release, and GIN signal `s` that the
//! GIN backend adds to. Its value is their sum (wrapping); waits compare
//! with rolling arithmetic ([`crate::wait::rolling_ge_u64`]). A routed
//! signal id must be below both [`Router::signal_count`] (the LSA array's
//! length) and the GIN signal count of the device communicator, when it
//! has GIN.
//!
//! ## Ordering
//!
//! A put with a signal is complete at the peer when the peer's wait sees
//! the signal's increment: the data of that put — and of every earlier put
//! the same coop made to that peer — is visible to the waiting coop after
//! its wait returns. LSA puts are done when [`Router::put`] returns (the
//! stores are issued; the signal publishes them); a GIN put's source may be
//! overwritten only after [`Router::flush`] (or a local counter: use
//! [`Gin`] directly for those).
//!
//! ```no_run
//! use devcomm_device::comm::{DevComm, SymPtr};
//! use devcomm_device::coop::Cta;
//! use devcomm_device::gin::GinError;
//! use devcomm_device::route::Router;
//! /// Every rank sends `n` bytes to every rank's slot `rank`, then waits for
//! /// all of theirs.
//! ///
//! /// # Safety
//! /// `slots` holds `nranks` slots of `n` bytes, `src` `n` bytes, `signals`
//! /// one zeroed word per routed signal; all in windows of `comm`'s
//! /// communicator; `round` counts the earlier calls.
//! unsafe fn exchange(comm: &DevComm, signals: SymPtr<u64>, slots: SymPtr<u8>, src: SymPtr<u8>,
//!                    n: u64, round: u64) -> Result<(), GinError> {
//!     let cta = Cta::new();
//!     let router = Router::new(comm, 0, signals, 1)?;
//!     let world = comm.world();
//!     for peer in 0..world.nranks {
//!         // SAFETY: the caller's contract.
//!         unsafe { router.put(&cta, &world, peer, slots.add(comm.rank() as u64 * n), src, n, Some(0)) }?;
//!     }
//!     router.wait(&cta, 0, (round + 1) * world.nranks as u64)?;
//!     unsafe { router.flush(&cta) } // `src` may be rewritten
//! }
//! ```

use crate::atomic::{self, Scope};
use crate::comm::{DevComm, SymPtr};
use crate::coop::Coop;
use crate::gin::{Gin, GinError, LocalAction, QueueError, RemoteAction, RING_CHECK_EVERY};
use crate::lsa::ops;
use crate::team::Team;
use crate::wait::{self, Deadline};

/// How a peer is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Loads and stores; the peer's index in the LSA team.
    Lsa(u32),
    /// GIN; the peer's world rank.
    Gin(u32),
}

/// What a GIN put does at the peer for a routed put with `signal`: a
/// strong `SignalInc` of it (ordered after every earlier operation to the
/// peer), or nothing.
#[inline(always)]
fn arrival(signal: Option<u32>) -> RemoteAction {
    match signal {
        Some(s) => RemoteAction::SignalInc { signal: s, strong: true },
        None => RemoteAction::None,
    }
}

/// Put / signal / wait routed per peer over LSA or GIN (see the
/// [module docs](self)).
#[derive(Clone, Copy)]
pub struct Router<'a> {
    comm: &'a DevComm,
    gin: Option<Gin<'a>>,
    signals: SymPtr<u64>,
    count: u32,
}

impl<'a> Router<'a> {
    /// A router over `comm`, GIN context `context` (when `comm` has GIN),
    /// whose LSA signal words are the `count` `u64`s at `signals`.
    ///
    /// Fails with [`GinError::OutOfWindow`] when the words are not inside
    /// their window or not 8-byte aligned, [`GinError::PeerNotInTeam`] when
    /// the window is not mapped for the whole LSA team, and
    /// [`GinError::ContextOutOfRange`] for a GIN context `comm` lacks.
    pub fn new(comm: &'a DevComm, context: u32, signals: SymPtr<u64>, count: u32) -> Result<Self, GinError> {
        let w = &signals.window;
        let end = signals.offset.checked_add(count as u64 * 8);
        if signals.offset % 8 != 0 || end.is_none_or(|e| e > w.size()) || w.lsa_base() % 8 != 0 || w.stride() % 8 != 0 {
            return Err(GinError::OutOfWindow);
        }
        if w.lsa_size() != comm.lsa_size() || w.lsa_rank() != comm.lsa_rank() {
            return Err(GinError::PeerNotInTeam);
        }
        let gin = match Gin::new(comm, context) {
            Ok(g) => Some(g),
            Err(GinError::NoGin) => None,
            Err(e) => return Err(e),
        };
        Ok(Router { comm, gin, signals, count })
    }

    /// The device communicator.
    pub fn comm(&self) -> &'a DevComm {
        self.comm
    }

    /// The GIN handle, when the communicator has GIN.
    pub fn gin(&self) -> Option<&Gin<'a>> {
        self.gin.as_ref()
    }

    /// Number of routed signals (the LSA signal words).
    pub fn signal_count(&self) -> u32 {
        self.count
    }

    /// How member `peer` of `team` is reached: LSA when it is in the
    /// caller's LSA team, else GIN (checked: [`GinError::NoGin`] without
    /// GIN; [`GinError::PeerNotConnected`] for a rail connection and a peer
    /// off the rail).
    pub fn path(&self, team: &Team, peer: u32) -> Result<Path, GinError> {
        let c = self.comm;
        if peer >= team.nranks {
            return Err(GinError::PeerNotInTeam);
        }
        let w = team.rank_to_world(c.rank(), peer);
        if w >= c.nranks() {
            return Err(GinError::PeerNotInTeam);
        }
        match (c.lsa().world_to_rank(c.rank(), w), &self.gin) {
            (Some(l), _) => Ok(Path::Lsa(l)),
            (None, Some(g)) => g.connected(w).map(Path::Gin),
            (None, None) => Err(GinError::NoGin),
        }
    }

    fn check_signal(&self, signal: u32) -> Result<(), GinError> {
        let gin_ok = self.gin.is_none_or(|_| signal < self.comm.gin().signal_count);
        if signal < self.count && gin_ok {
            Ok(())
        } else {
            Err(GinError::SignalOutOfRange)
        }
    }

    /// The caller's LSA word of routed signal `signal` (checked).
    fn local_word(&self, signal: u32) -> *mut u64 {
        self.signals.add(signal as u64).local()
    }

    /// `count` elements from `src` (the caller's copy) into member `peer` of
    /// `team`'s copy of `dst`; then, with `signal = Some(s)`, routed signal
    /// `s` of the peer gains 1 once the data is visible there. Every thread
    /// of `coop` calls it with the same arguments; the coop is joined first
    /// (its writes to `src` are included) and every thread gets the result.
    ///
    /// # Safety
    /// `dst` and `src` are in windows of this communicator; nobody else
    /// writes or reads the destination range until the peer has seen the
    /// signal; for a put to the caller itself the ranges do not overlap.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub unsafe fn put<T, C: Coop>(
        &self,
        coop: &C,
        team: &Team,
        peer: u32,
        dst: SymPtr<T>,
        src: SymPtr<T>,
        count: u64,
        signal: Option<u32>,
    ) -> Result<(), GinError> {
        let bytes = count.checked_mul(core::mem::size_of::<T>() as u64).ok_or(GinError::OutOfWindow)?;
        let fits = |l: u32, p: &SymPtr<T>| {
            l < p.window.lsa_size() && p.offset.checked_add(bytes).is_some_and(|e| e <= p.window.size())
        };
        // Joins the coop too: its writes to `src` are in.
        let path = coop.agree(self.path(team, peer).and_then(|p| {
            signal.map_or(Ok(()), |s| self.check_signal(s))?;
            match p {
                Path::Lsa(l) if !(fits(l, &dst) && fits(l, &src)) => Err(GinError::OutOfWindow),
                p => Ok(p),
            }
        }))?;
        match path {
            Path::Lsa(l) => {
                if bytes != 0 {
                    // SAFETY: both ranges are inside their windows (checked
                    // above), mapped for LSA peer `l < lsa_size` (the windows
                    // belong to this communicator: the caller's contract); they
                    // do not overlap (the caller's contract).
                    unsafe {
                        ops::copy(coop, dst.window.lsa_ptr(dst.offset, l), src.local() as *const u8, bytes as usize)
                    };
                }
                match signal {
                    // SAFETY: `signal_lsa`'s contract: `l` is an LSA peer, `s` checked.
                    Some(s) => unsafe { self.signal_lsa(coop, l, s, 1) },
                    None => Ok(()),
                }
            }
            Path::Gin(_) => {
                let remote = arrival(signal);
                let gin = self.gin.as_ref().ok_or(GinError::NoGin)?;
                // SAFETY: the caller's contract (the windows are this communicator's).
                unsafe {
                    gin.put(
                        coop,
                        team,
                        peer,
                        &dst.window,
                        dst.offset,
                        &src.window,
                        src.offset,
                        bytes,
                        remote,
                        LocalAction::None,
                    )
                }
            }
        }
    }

    /// Joins the coop and has its leader add `value` to LSA peer `l`'s word
    /// of routed signal `s` with a system-scope release, so everything the
    /// coop wrote before is visible to a peer whose wait sees it.
    ///
    /// # Safety
    /// `l` is below the LSA team's size and `s < self.count`.
    unsafe fn signal_lsa<C: Coop>(&self, coop: &C, l: u32, s: u32, value: u64) -> Result<(), GinError> {
        coop.sync();
        if coop.is_leader() {
            let word: *mut u64 = self.signals.add(s as u64).lsa(l);
            // SAFETY: `Router::new` checked the words lie 8-byte aligned inside
            // a window mapped for the whole LSA team; `l` is an LSA peer and
            // `s < count` (this function's contract). Routed signal words are
            // only updated atomically.
            unsafe { ops::signal_add(word, value) };
        }
        Ok(())
    }

    /// One thread stores `value` (at most 8 bytes) into member `peer` of
    /// `team`'s copy of `dst`, then, with `signal = Some(s)`, adds 1 to the
    /// peer's routed signal `s` (after the value is visible there).
    ///
    /// # Safety
    /// As for [`Router::put`].
    #[doc(alias = "putValue")]
    #[inline]
    pub unsafe fn put_value<T: Copy>(
        &self,
        team: &Team,
        peer: u32,
        dst: SymPtr<T>,
        value: T,
        signal: Option<u32>,
    ) -> Result<(), GinError> {
        let size = core::mem::size_of::<T>() as u64;
        if size > 8 {
            return Err(GinError::ValueTooWide);
        }
        if let Some(s) = signal {
            self.check_signal(s)?;
        }
        match self.path(team, peer)? {
            Path::Lsa(l) => {
                let end = dst.offset.checked_add(size);
                let aligned = (dst.window.lsa_ptr::<u8>(dst.offset, l) as u64) % core::mem::align_of::<T>() as u64 == 0;
                if end.is_none_or(|e| e > dst.window.size()) || !aligned {
                    return Err(GinError::OutOfWindow);
                }
                // SAFETY: inside the window (checked), mapped for LSA peer `l`
                // (the window is this communicator's: the caller's contract),
                // aligned for `T` (checked).
                unsafe { ops::put_value(dst.window.lsa_ptr::<T>(dst.offset, l), value) };
                match signal {
                    // SAFETY: `l` is an LSA peer and `s` was checked.
                    Some(s) => unsafe { self.signal_lsa(&crate::coop::ThreadCoop, l, s, 1) },
                    None => Ok(()),
                }
            }
            Path::Gin(_) => {
                let remote = arrival(signal);
                let gin = self.gin.as_ref().ok_or(GinError::NoGin)?;
                // SAFETY: the caller's contract.
                unsafe { gin.put_value(team, peer, &dst.window, dst.offset, value, remote, LocalAction::None) }
            }
        }
    }

    /// Adds `value` to member `peer` of `team`'s routed signal `signal`,
    /// after every write the calling thread made before (and, for a GIN
    /// peer, after every earlier operation of this context to it). One
    /// thread calls it; to order a coop's writes, join the coop first.
    ///
    /// # Safety
    /// The routed signal words are zeroed and only updated through routers
    /// (or GIN signals) while the kernel runs.
    #[inline]
    pub unsafe fn signal(&self, team: &Team, peer: u32, signal: u32, value: u64) -> Result<(), GinError> {
        self.check_signal(signal)?;
        match self.path(team, peer)? {
            // SAFETY: `l` is an LSA peer and `signal` was checked.
            Path::Lsa(l) => unsafe { self.signal_lsa(&crate::coop::ThreadCoop, l, signal, value) },
            Path::Gin(_) => {
                let gin = self.gin.as_ref().ok_or(GinError::NoGin)?;
                // SAFETY: the caller's contract.
                unsafe { gin.signal(team, peer, RemoteAction::SignalAdd { signal, value, strong: true }) }
            }
        }
    }

    /// The caller's routed signal `signal`: its LSA word plus its GIN
    /// signal (acquire, system scope).
    pub fn read(&self, signal: u32) -> Result<u64, GinError> {
        self.check_signal(signal)?;
        // SAFETY: `Router::new` checked the word lies aligned inside the
        // caller's window; `signal < count` (checked); only updated atomically.
        let lsa = unsafe { atomic::load_acquire(self.local_word(signal), Scope::Sys) };
        let gin = match &self.gin {
            Some(g) => g.read_signal(signal)?,
            None => 0,
        };
        Ok(lsa.wrapping_add(gin))
    }

    /// Waits (the coop's leader polls) until routed signal `signal` has
    /// reached `least` (rolling comparison), then joins the coop; returns
    /// the value seen to the leader (`least` to the others). Ends with the
    /// same error on every thread: a timeout, the abort flag, or a GIN ring
    /// the proxy failed (a dead peer).
    #[doc(alias = "waitSignal")]
    pub fn wait<C: Coop>(&self, coop: &C, signal: u32, least: u64) -> Result<u64, GinError> {
        let r = coop.agree(self.check_signal(signal));
        let r = r.and_then(|()| if coop.is_leader() { self.wait_leader(signal, least) } else { Ok(least) });
        coop.agree(r)
    }

    fn wait_leader(&self, signal: u32, least: u64) -> Result<u64, GinError> {
        let lsa = self.local_word(signal) as *const u64;
        let gin = self.gin.map(|g| g.signal_word(signal));
        let mut deadline = Deadline::new(&self.comm.abort());
        let mut misses = 0u32;
        loop {
            // The first polls acquire; later ones read relaxed and re-read
            // with acquire once the sum shows (both words only grow).
            let acquire = misses < wait::ACQUIRE_POLLS;
            for pass in 0..2 {
                let strong = acquire || pass == 1;
                // SAFETY: both words are this rank's live, aligned u64s updated
                // only atomically (`Router::new` checked the LSA word, the GIN
                // signal id was checked by `wait`).
                let load = |p: *const u64| unsafe {
                    if strong {
                        atomic::load_acquire(p, Scope::Sys)
                    } else {
                        atomic::load_relaxed(p, Scope::Sys)
                    }
                };
                let v = load(lsa).wrapping_add(gin.map_or(0, load));
                if !wait::rolling_ge_u64(v, least) {
                    break;
                }
                if strong {
                    return Ok(v);
                }
            }
            misses = misses.wrapping_add(1);
            if misses % RING_CHECK_EVERY == 0 && self.gin.is_some_and(|g| g.any_ring_failed()) {
                return Err(GinError::Queue(QueueError::RingFailed));
            }
            deadline.poll()?;
        }
    }

    /// Waits until the sources of every GIN put posted through this
    /// router's context have been read, then joins the coop (LSA puts need
    /// nothing: their stores were issued when `put` returned).
    ///
    /// # Safety
    /// As for [`Gin::flush`].
    pub unsafe fn flush<C: Coop>(&self, coop: &C) -> Result<(), GinError> {
        match &self.gin {
            // SAFETY: the caller's contract.
            Some(g) => unsafe { g.flush(coop) },
            None => {
                coop.sync();
                Ok(())
            }
        }
    }

    /// Sets the caller's routed signal `signal` to 0 (its LSA word and its
    /// GIN signal and shadow). Only when nothing that signals it is in flight.
    pub fn reset(&self, signal: u32) -> Result<(), GinError> {
        self.check_signal(signal)?;
        // SAFETY: as in `read`.
        unsafe { atomic::store_relaxed(self.local_word(signal), 0, Scope::Sys) };
        match &self.gin {
            Some(g) => g.reset_signal(signal),
            None => Ok(()),
        }
    }
}
