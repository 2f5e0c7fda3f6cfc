//! Barriers over GIN: among the members of the rail or the world team.
//!
//! Barrier `index` of a team owns one signal on every rank (after the user's
//! signals). Arriving signals every other member (`SignalInc`, strong: after
//! every earlier operation of the context to that member); waiting waits
//! for the own signal to reach `epoch × (members − 1)`. The epoch lives in
//! the signal's shadow, so consecutive kernels keep counting.

use super::{Gin, GinError};
use crate::atomic::{self, Scope};
use crate::coop::Coop;
use crate::team::Team;

/// Which team a GIN barrier spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GinBarrierTeam {
    /// The rail team (same LSA index on every node).
    Rail,
    /// Every rank.
    World,
}

/// One use of a GIN barrier by a coop.
#[doc(alias = "ncclGinBarrierSession")]
pub struct GinBarrierSession<'g, 'a> {
    gin: &'g Gin<'a>,
    team: Team,
    signal: u32,
    epoch: u64,
}

impl<'g, 'a> GinBarrierSession<'g, 'a> {
    /// Opens barrier `index` of `team` (every thread of `coop` calls it).
    ///
    /// # Safety
    /// No other coop uses this barrier concurrently; every member takes part.
    pub unsafe fn new<C: Coop>(
        _coop: &C,
        gin: &'g Gin<'a>,
        team: GinBarrierTeam,
        index: u32,
    ) -> Result<Self, GinError> {
        let s = gin.state();
        let (count, base, t) = match team {
            GinBarrierTeam::Rail => (s.rail_barrier_count, s.signal_count, gin.comm.rail()),
            GinBarrierTeam::World => (s.world_barrier_count, s.signal_count + s.rail_barrier_count, gin.comm.world()),
        };
        if index >= count {
            return Err(GinError::BarrierOutOfRange);
        }
        let signal = base + index;
        let shadow = (s.shadows as *mut u64).wrapping_add(signal as usize);
        // SAFETY: `signal = base + index` with `index < count` (checked above)
        // is below `total_signals()` (user signals, then rail, then world
        // barrier signals); `GinState::from_parts`'s contract makes `shadows`
        // this rank's live device array of `total_signals()` aligned u64s,
        // accessed only atomically.
        let epoch = unsafe { atomic::load_relaxed(shadow, Scope::Gpu) };
        Ok(GinBarrierSession { gin, team: t, signal, epoch })
    }

    /// Signals every other member, then waits for all of them; joins the coop
    /// before and after. Every thread of the coop gets the same result.
    ///
    /// # Safety
    /// As for [`GinBarrierSession::new`].
    pub unsafe fn sync<C: Coop>(&mut self, coop: &C) -> Result<(), GinError> {
        coop.sync();
        self.epoch = self.epoch.wrapping_add(1);
        let mut r = Ok(());
        let n = self.team.nranks;
        let me = self.gin.comm.rank;
        // Members are signalled by the coop's threads in parallel.
        let mut k = coop.thread_rank();
        while k < n && r.is_ok() {
            let w = self.team.rank_to_world(me, k);
            if w != me {
                // SAFETY: `w` is the world rank of team member `k < team.nranks`,
                // so below `nranks`, and `self.signal` is below `total_signals()`
                // (see `new`), as `signal_internal` requires; no window is
                // involved. This session's contract keeps the barrier's
                // signal to itself.
                r = unsafe { self.gin.signal_internal(w, self.signal) };
            }
            k += coop.size();
        }
        // Every thread learns whether any signal failed before the leader waits.
        r = coop.agree(r);
        if r.is_ok() && coop.is_leader() {
            let want = self.epoch.wrapping_mul(n.saturating_sub(1) as u64);
            r = self.gin.wait_signal_any(self.signal, want).map(|_| ());
        }
        coop.agree(r)
    }
}

impl Drop for GinBarrierSession<'_, '_> {
    /// Saves the epoch in the barrier signal's shadow.
    fn drop(&mut self) {
        let shadow = (self.gin.state().shadows as *mut u64).wrapping_add(self.signal as usize);
        // SAFETY: as in `new`: shadow `self.signal < total_signals()` of this
        // rank's live shadow array; every thread of the coop stores the same
        // value atomically.
        unsafe { atomic::store_relaxed(shadow, self.epoch, Scope::Gpu) };
    }
}
