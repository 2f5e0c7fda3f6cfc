//! Teams on the host: the very [`Team`] type (and rank arithmetic) the
//! device uses, re-exported from `devcomm-device`, plus [`TeamKind`] and the
//! communicator's LSA layout.
//!
//! The LSA team ("load/store accessible") is a block of `lsa_size`
//! consecutive world ranks on one host. It is found from the topology: when
//! every host holds one contiguous block of the same size `L`, `lsa_size = L`,
//! else 1. [`LSA_SIZE_ENV`] lowers it (it must divide the natural size), so
//! one host can pretend to be several nodes. On CUDA, if some rank's GPU
//! cannot access an LSA peer's GPU, the first window registration finds out
//! and every rank falls back to `lsa_size = 1` (with a warning).
//!
//! ```no_run
//! use devcomm::comm::Communicator;
//! use devcomm::team::TeamKind;
//! # fn main() -> devcomm::Result<()> {
//! let comm = Communicator::init_from_env()?;
//! let (world, lsa, rail) = comm.teams()?;
//! assert_eq!(world.nranks as usize, comm.count());
//! assert_eq!(lsa.nranks as usize, comm.lsa_size()?);
//! assert_eq!(rail.nranks * lsa.nranks, world.nranks);
//! assert_eq!(comm.team(TeamKind::Lsa)?, lsa);
//! # Ok(()) }
//! ```

pub use devcomm_device::team::Team;

use crate::comm::Communicator;
use crate::error::{Error, Result};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Environment variable that lowers the LSA team size (a divisor of the
/// natural size; `1` makes every rank its own "node").
pub const LSA_SIZE_ENV: &str = "DEVCOMM_LSA_SIZE";

/// The three teams every communicator has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TeamKind {
    /// All ranks.
    World,
    /// The ranks of this node that load and store each other's memory.
    Lsa,
    /// The ranks with the same LSA index on every node.
    Rail,
}

/// The natural LSA size of ranks whose hosts are `hosts[rank]`: the size of
/// the per-host blocks if every host holds exactly one contiguous block and
/// all blocks are equal, else 1.
pub(crate) fn natural_lsa_size<H: Eq + std::hash::Hash>(hosts: &[H]) -> usize {
    let n = hosts.len();
    let Some(first) = hosts.first() else { return 1 };
    let l = hosts.iter().take_while(|h| *h == first).count();
    if l == 0 || n % l != 0 {
        return 1;
    }
    let mut seen = HashSet::new();
    for block in hosts.chunks(l) {
        if !block.iter().all(|h| *h == block[0]) || !seen.insert(&block[0]) {
            return 1;
        }
    }
    l
}

/// Applies an [`LSA_SIZE_ENV`] value to the natural size.
pub(crate) fn apply_lsa_override(natural: usize, nranks: usize, value: Option<&str>) -> Result<usize> {
    let Some(v) = value else { return Ok(natural) };
    let v = v.trim();
    if v.is_empty() {
        return Ok(natural);
    }
    let l: usize =
        v.parse().map_err(|_| Error::invalid_argument(format!("{LSA_SIZE_ENV}={v:?}: expected a positive integer")))?;
    if l == 0 || nranks % l != 0 || natural % l != 0 {
        return Err(Error::invalid_argument(format!(
            "{LSA_SIZE_ENV}={l}: the LSA size must be positive, divide the number of ranks ({nranks}) and \
             divide the natural LSA size of this topology ({natural})"
        )));
    }
    Ok(l)
}

impl Communicator {
    /// The LSA size from the topology and [`LSA_SIZE_ENV`] (cached), before
    /// any peer-access fallback.
    pub(crate) fn topology_lsa_size(&self) -> Result<usize> {
        let mut cached = self.ext.topo_lsa.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = cached.as_ref() {
            return r.clone();
        }
        let infos = self.rank_infos()?; // InProgress is not cached
        let hosts: Vec<&str> = infos.iter().map(|i| i.host_id.as_str()).collect();
        let natural = natural_lsa_size(&hosts);
        let env = std::env::var(LSA_SIZE_ENV).ok();
        let r = apply_lsa_override(natural, self.count(), env.as_deref());
        *cached = Some(r.clone());
        r
    }

    /// Number of ranks in this rank's LSA team (see the [module docs](crate::team)).
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad [`LSA_SIZE_ENV`];
    /// [`Error::InProgress`] while a non-blocking creation runs.
    pub fn lsa_size(&self) -> Result<usize> {
        if self.ext.p2p_fallback.load(Ordering::SeqCst) {
            return Ok(1);
        }
        self.topology_lsa_size()
    }

    /// This rank's index in its LSA team (`rank % lsa_size`).
    pub fn lsa_rank(&self) -> Result<usize> {
        Ok(self.rank() % self.lsa_size()?)
    }

    /// The world, LSA and rail teams, seen from this rank.
    pub fn teams(&self) -> Result<(Team, Team, Team)> {
        let (n, r, l) = (self.count() as u32, self.rank() as u32, self.lsa_size()? as u32);
        Ok((Team::world(n, r), Team::lsa(l, r % l), Team::rail(n, l, r)))
    }

    /// One of the three teams.
    pub fn team(&self, kind: TeamKind) -> Result<Team> {
        let (w, l, r) = self.teams()?;
        Ok(match kind {
            TeamKind::World => w,
            TeamKind::Lsa => l,
            TeamKind::Rail => r,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_sizes() {
        assert_eq!(natural_lsa_size(&["a", "a", "b", "b"]), 2);
        assert_eq!(natural_lsa_size(&["a"; 8]), 8);
        assert_eq!(natural_lsa_size(&["a", "b", "a", "b"]), 1);
        assert_eq!(natural_lsa_size(&["a", "a", "b"]), 1);
        assert_eq!(natural_lsa_size(&["a", "a", "b", "b", "a", "a"]), 1);
        assert_eq!(natural_lsa_size::<&str>(&[]), 1);
    }

    #[test]
    fn overrides() {
        assert_eq!(apply_lsa_override(4, 8, None).unwrap(), 4);
        assert_eq!(apply_lsa_override(4, 8, Some("2")).unwrap(), 2);
        assert_eq!(apply_lsa_override(4, 8, Some("1")).unwrap(), 1);
        for bad in ["0", "3", "8", "x", "-1"] {
            assert!(matches!(apply_lsa_override(4, 8, Some(bad)), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }
}
