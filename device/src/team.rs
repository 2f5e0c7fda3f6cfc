//! Teams: strided subsets of the world, and rank conversions between them.
//!
//! A [`Team`] is seen from one rank: it has `nranks` members, the caller is
//! member `rank`, and consecutive members are `stride` world ranks apart. The
//! three teams every communicator has:
//!
//! | team | nranks | rank | stride |
//! |---|---|---|---|
//! | world | `nranks` | `rank` | 1 |
//! | LSA (load/store-accessible: this node's ranks) | `lsa_size` | `lsa_rank` | 1 |
//! | rail (same LSA index on every node) | `nranks / lsa_size` | `rank / lsa_size` | `lsa_size` |
//!
//! Member `i` of a team is world rank `my_world - team.rank * stride + i * stride`,
//! which is all the conversions below need. The same code runs on the host
//! (the `devcomm` crate re-exports it) and on the GPU, so both sides agree.
//!
//! ```
//! use devcomm_device::team::Team;
//! // 8 ranks, 4 per node; we are world rank 6 (node 1, local 2).
//! let world = Team::world(8, 6);
//! let lsa = Team::lsa(4, 2);
//! let rail = Team::rail(8, 4, 6);
//! assert_eq!(rail, Team { nranks: 2, rank: 1, stride: 4 });
//! assert_eq!(lsa.rank_to_world(6, 0), 4); // first rank of our node
//! assert_eq!(rail.rank_to_world(6, 0), 2); // our rail peer on node 0
//! assert_eq!(world.rank_to_team(&lsa, 6, 5), Some(1));
//! assert_eq!(world.rank_to_team(&lsa, 6, 1), None);
//! ```

/// A strided subset of the world's ranks, seen from one member.
#[doc(alias = "ncclTeam")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Team {
    /// Number of members.
    pub nranks: u32,
    /// The caller's index in the team.
    pub rank: u32,
    /// World-rank distance between consecutive members.
    pub stride: u32,
}

impl Team {
    /// The world team of a communicator of `nranks` seen from `rank`.
    #[doc(alias = "ncclTeamWorld")]
    pub const fn world(nranks: u32, rank: u32) -> Team {
        Team { nranks, rank, stride: 1 }
    }

    /// The LSA team: `lsa_size` consecutive world ranks, we are `lsa_rank`.
    #[doc(alias = "ncclTeamLsa")]
    pub const fn lsa(lsa_size: u32, lsa_rank: u32) -> Team {
        Team { nranks: lsa_size, rank: lsa_rank, stride: 1 }
    }

    /// The rail team of world rank `rank` in a world of `nranks` split into
    /// nodes of `lsa_size` (which must divide `nranks`).
    #[doc(alias = "ncclTeamRail")]
    pub const fn rail(nranks: u32, lsa_size: u32, rank: u32) -> Team {
        let lsa = if lsa_size == 0 { 1 } else { lsa_size };
        Team { nranks: nranks / lsa, rank: rank / lsa, stride: lsa }
    }

    /// World rank of the team's first member, given the caller's world rank.
    #[inline]
    pub const fn world_base(&self, my_world_rank: u32) -> i64 {
        my_world_rank as i64 - self.rank as i64 * self.stride as i64
    }

    /// World rank of member `peer` (`peer < nranks`), given the caller's world rank.
    #[doc(alias = "ncclTeamRankToWorld")]
    #[inline]
    pub const fn rank_to_world(&self, my_world_rank: u32, peer: u32) -> u32 {
        (self.world_base(my_world_rank) + peer as i64 * self.stride as i64) as u32
    }

    /// Whether world rank `world_rank` is a member.
    #[inline]
    pub const fn contains_world(&self, my_world_rank: u32, world_rank: u32) -> bool {
        let d = world_rank as i64 - self.world_base(my_world_rank);
        let s = self.stride as i64;
        s > 0 && d >= 0 && d % s == 0 && d / s < self.nranks as i64
    }

    /// Index in this team of world rank `world_rank`, if it is a member.
    #[inline]
    pub const fn world_to_rank(&self, my_world_rank: u32, world_rank: u32) -> Option<u32> {
        if self.contains_world(my_world_rank, world_rank) {
            Some(((world_rank as i64 - self.world_base(my_world_rank)) / self.stride as i64) as u32)
        } else {
            None
        }
    }

    /// Member `peer` of `self`, as an index in `other` (both seen from the
    /// caller, world rank `my_world_rank`), if it is a member of `other`.
    #[doc(alias = "ncclTeamRankToTeam")]
    #[inline]
    pub const fn rank_to_team(&self, other: &Team, my_world_rank: u32, peer: u32) -> Option<u32> {
        if peer >= self.nranks {
            return None;
        }
        other.world_to_rank(my_world_rank, self.rank_to_world(my_world_rank, peer))
    }

    /// Whether member `peer` of `self` is also a member of `other`.
    #[inline]
    pub const fn is_member(&self, other: &Team, my_world_rank: u32, peer: u32) -> bool {
        self.rank_to_team(other, my_world_rank, peer).is_some()
    }

    /// The team of `inner_size` consecutive members of `self` that holds
    /// the caller (`ncclTeamInnerFactor`): world and the node size give the
    /// LSA team. `inner_size` must divide `self.nranks` (0 is taken as 1).
    #[doc(alias = "ncclTeamInnerFactor")]
    #[inline]
    pub const fn inner_factor(&self, inner_size: u32) -> Team {
        let k = if inner_size == 0 { 1 } else { inner_size };
        Team { nranks: k, rank: self.rank % k, stride: self.stride }
    }

    /// The members of `self` that hold the caller's index within their
    /// block of `inner_size` consecutive members (`ncclTeamOuterFactor`):
    /// world and the node size give the rail team. `inner_size` must divide
    /// `self.nranks` (0 is taken as 1).
    #[doc(alias = "ncclTeamOuterFactor")]
    #[inline]
    pub const fn outer_factor(&self, inner_size: u32) -> Team {
        let k = if inner_size == 0 { 1 } else { inner_size };
        Team { nranks: self.nranks / k, rank: self.rank / k, stride: self.stride * k }
    }

    /// The `index`-th member of `self` (in team order) that is *not* a member
    /// of `subset`, as an index in `self`; `None` past the end. With the world
    /// and the LSA team this enumerates the ranks that need the network.
    pub fn rank_in_difference(&self, subset: &Team, my_world_rank: u32, index: u32) -> Option<u32> {
        let mut seen = 0;
        let mut peer = 0;
        while peer < self.nranks {
            if !self.is_member(subset, my_world_rank, peer) {
                if seen == index {
                    return Some(peer);
                }
                seen += 1;
            }
            peer += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_lsa_rail_round_trip() {
        for &(n, l) in &[(1u32, 1u32), (2, 1), (2, 2), (8, 4), (12, 3), (8, 1)] {
            for r in 0..n {
                let world = Team::world(n, r);
                let lsa = Team::lsa(l, r % l);
                let rail = Team::rail(n, l, r);
                assert_eq!(world.inner_factor(l), lsa);
                assert_eq!(world.outer_factor(l), Team::rail(n, l, r));
                for p in 0..l {
                    let w = lsa.rank_to_world(r, p);
                    assert_eq!(w, r - r % l + p);
                    assert_eq!(world.world_to_rank(r, w), Some(w));
                    assert_eq!(lsa.rank_to_team(&world, r, p), Some(w));
                }
                for p in 0..rail.nranks {
                    let w = rail.rank_to_world(r, p);
                    assert_eq!(w % l, r % l);
                    assert_eq!(rail.world_to_rank(r, w), Some(p));
                    // A rail peer other than us is never in our LSA team.
                    assert_eq!(rail.is_member(&lsa, r, p), w == r);
                }
                let mut off_node = 0;
                while let Some(p) = world.rank_in_difference(&lsa, r, off_node) {
                    assert!(!lsa.contains_world(r, p));
                    off_node += 1;
                }
                assert_eq!(off_node, n - l);
                assert_eq!(world.rank_to_team(&lsa, r, n), None);
            }
        }
    }
}
