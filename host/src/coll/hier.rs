//! Collectives over several LSA teams, hierarchically: LSA inside each
//! team (the device collectives' kernels over the team), GIN between teams
//! along the rails (the point-to-point channels to the ranks with the same
//! LSA rank in the other teams), local reductions of what arrived.
//!
//! With `T` teams of `L` ranks (world rank `t * L + l`: team `t`, LSA rank
//! `l`; rail `l` = ranks `l, L + l, 2L + l, …`), `c` elements per block:
//!
//! | collective | steps | bytes a rank sends over GIN (flat) |
//! |---|---|---|
//! | all-reduce, ≥ `hier_split_min_bytes` and ≥ `L` elements | reduce-scatter in the team → all-reduce of the shard along the rail → all-gather in the team (a remainder of `count % L` elements: two-step) | `(T-1)·count/L`, more than 2 teams `2(T-1)/T·count/L` (`(T-1)·L·count`) |
//! | all-reduce, smaller | all-reduce in the team → all-reduce of the whole along the rail | `(T-1)·count` (`(T-1)·L·count`) |
//! | reduce-scatter | blocks regrouped by rail (a local copy) → reduce-scatter in the team → reduce-scatter along the rail | `(T-1)·c` (`(T-1)·L·c`) |
//! | all-gather | all-gather along the rail → all-gather in the team → blocks put back in world order (a local copy) | `(T-1)·c` (`(T-1)·L·c`) |
//! | broadcast | root to its rail → each team's rail rank to its team | root `(T-1)·count` (`(T-1)·L·count`) |
//! | reduce | reduce in each team to the root's LSA rank → those to the root | `count` (`count`; root receives `(T-1)·count`, flat `(T-1)·L·count`) |
//!
//! Reductions run in two levels: the team's kernel, then the rail's local
//! reduction of `T` partial results in team order (the same bits on every
//! rank). `PreMulSum` multiplies in the team, sums along the rail; `Avg`
//! of floats scales by `1/L` in the team and `1/T` along the rail; `Avg`
//! of integers sums in the team and divides the wrapped sum by `L·T` along
//! the rail (exactly NCCL's result). Narrow floats are rounded to their type
//! once per level (f16/bf16/fp8 accumulate in f32 inside each level).

use super::{Algorithm, CollType, Collectives, Kind, Op, Operand, RedOp};
use crate::error::{Error, Result};
use crate::runtime::Stream;
use devcomm_device::coll::MAX_GROUP_OPS;

/// Scratch slots of a [`Collectives`] (slot 0: the flat path's; 1-3: the
/// hierarchical steps').
pub(super) const TEMP_SLOTS: usize = 4;

/// Env: how collectives run over several LSA teams, `auto`, `flat` or
/// `hier` ([`MultiTeam`]); the default of [`CollConfig::multi_team`](super::CollConfig::multi_team).
pub const MULTI_TEAM_ENV: &str = "DEVCOMM_COLL_MULTI_TEAM";

/// The default [`CollConfig::hier_split_min_bytes`](super::CollConfig::hier_split_min_bytes):
/// hierarchical all-reduces from this size on reduce-scatter inside the
/// team first (only a shard crosses GIN); smaller ones all-reduce in the
/// team first (fewer launches).
pub const HIER_SPLIT_MIN_BYTES: usize = 64 << 10;

/// How collectives run when the world spans several LSA teams (see the
/// [module docs](super#several-lsa-teams)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MultiTeam {
    /// Hierarchical for all-reduce, reduce-scatter, all-gather, broadcast
    /// and reduce when the LSA teams have more than one rank; flat
    /// otherwise (gather, scatter, all-to-all always; one-rank teams,
    /// where there is nothing to share inside a team). Checked on 2 × H200
    /// (`benches/results/2026-11-23-h200x2-gin-frees-moe-hier.md`).
    #[default]
    Auto,
    /// Every collective flat: each rank exchanges with every rank
    /// (GIN to every rank of another team).
    Flat,
    /// Hierarchical for all-reduce, reduce-scatter, all-gather, broadcast
    /// and reduce whatever the team size (one-rank teams included: the
    /// team steps are copies); flat for the others.
    Hierarchical,
}

impl MultiTeam {
    /// `auto`, `flat`, `hier` (or `hierarchical`), any case.
    ///
    /// Errors: [`Error::InvalidArgument`] for anything else.
    pub fn parse(s: &str) -> Result<MultiTeam> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(MultiTeam::Auto),
            "flat" => Ok(MultiTeam::Flat),
            "hier" | "hierarchical" => Ok(MultiTeam::Hierarchical),
            v => Err(Error::invalid_argument(format!("{MULTI_TEAM_ENV}={v:?}: expected auto, flat or hier"))),
        }
    }

    /// What [`MULTI_TEAM_ENV`] says, if it is set.
    ///
    /// Errors: as [`MultiTeam::parse`].
    pub fn from_env() -> Result<Option<MultiTeam>> {
        match std::env::var(MULTI_TEAM_ENV) {
            Ok(v) => MultiTeam::parse(&v).map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// This rank in a world of `teams` LSA teams of `lsa` ranks.
#[derive(Clone, Copy, Debug)]
struct Layout {
    lsa: usize,
    teams: usize,
    team: usize,
    lsa_rank: usize,
}

impl Layout {
    /// The rank of rail `lsa_rank` in team `team`.
    fn rail_peer(&self, team: usize) -> usize {
        team * self.lsa + self.lsa_rank
    }

    fn ranks(&self) -> usize {
        self.lsa * self.teams
    }

    /// The other teams, the next one first (so teams do not all start
    /// with team 0).
    fn other_teams(&self) -> impl Iterator<Item = usize> {
        let (t, n) = (self.team, self.teams);
        (1..n).map(move |k| (t + k) % n)
    }
}

/// A reduction split in two levels: (inside the team, along the rail's
/// local reduction, the rail's `Avg` divisor or 0 for its block count).
fn levels<'o, T: CollType>(op: &Op<'o, T>, g: &Layout) -> (Op<'o, T>, RedOp, u32) {
    match op {
        Op::Avg if T::DTYPE.is_float() => (Op::Avg, RedOp::Avg, 0),
        Op::Avg => (Op::Sum, RedOp::Avg, g.ranks() as u32),
        Op::PreMulSum(_) | Op::PreMulSumDevice(_) => (*op, RedOp::Sum, 0),
        o => (*o, o.code(), 0),
    }
}

impl Collectives<'_> {
    fn layout(&self) -> Layout {
        let (n, me) = (self.comm.count(), self.comm.rank());
        Layout { lsa: self.lsa, teams: n / self.lsa, team: me / self.lsa, lsa_rank: me % self.lsa }
    }

    /// Whether collective `kind` runs hierarchically (several LSA teams).
    pub(super) fn hierarchical(&self, kind: Kind) -> bool {
        let g = self.layout();
        let applies =
            matches!(kind, Kind::AllReduce | Kind::ReduceScatter | Kind::AllGather | Kind::Broadcast | Kind::Reduce)
                && g.teams > 1
                && 2 * g.teams <= MAX_GROUP_OPS;
        match self.config.multi_team {
            MultiTeam::Flat => false,
            MultiTeam::Auto => applies && g.lsa > 1,
            MultiTeam::Hierarchical => applies,
        }
    }

    /// Queues `copies` (destination, source, elements of `T`), skipping empty ones.
    ///
    /// # Safety
    /// Every range is device memory of this rank alive until the stream
    /// passes this point; no destination overlaps a source or another
    /// destination.
    unsafe fn copy_elems<T: CollType>(&self, copies: &[(u64, u64, usize)], stream: &Stream) -> Result<()> {
        let size = std::mem::size_of::<T>();
        let bytes: Vec<(u64, u64, usize)> =
            copies.iter().filter(|c| c.2 > 0).map(|&(d, s, n)| (d, s, n * size)).collect();
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { stream.memcpy_batch_raw(&bytes) }
    }

    /// The address of element `i` of `o`.
    fn at<T: CollType>(o: &Operand<'_, T>, i: usize) -> u64 {
        o.ptr + (i * std::mem::size_of::<T>()) as u64
    }

    /// A collective over several LSA teams, hierarchically (see the
    /// [module docs](self)). Arguments as `run` takes them (checked).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_hier<T: CollType>(
        &self,
        kind: Kind,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        op: &Op<'_, T>,
        root: usize,
        algorithm: Algorithm,
        stream: &Stream,
    ) -> Result<()> {
        let g = self.layout();
        if count == 0 {
            return Ok(());
        }
        match kind {
            Kind::AllReduce => self.hier_all_reduce(g, send, recv, count, op, algorithm, stream),
            Kind::ReduceScatter => self.hier_reduce_scatter(g, send, recv, count, op, stream),
            Kind::AllGather => self.hier_all_gather(g, send, recv, count, stream),
            Kind::Broadcast => self.hier_broadcast(g, send, recv, count, root, stream),
            Kind::Reduce => self.hier_reduce(g, send, recv, count, op, root, stream),
            _ => Err(Error::internal(format!("{kind:?} has no hierarchical algorithm"))),
        }
    }

    /// All-reduce: three steps (reduce-scatter in the team, all-reduce of
    /// the shard along the rail, all-gather in the team) from
    /// `hier_split_min_bytes`, two below and for the remainder.
    #[allow(clippy::too_many_arguments)]
    fn hier_all_reduce<T: CollType>(
        &self,
        g: Layout,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        op: &Op<'_, T>,
        algorithm: Algorithm,
        stream: &Stream,
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        let (team_op, rail_op, avg) = levels(op, &g);
        let c = count / g.lsa;
        if c == 0 || count * size < self.config.hier_split_min_bytes {
            return self.hier_all_reduce_small(g, send, recv, count, &team_op, rail_op, avg, algorithm, stream);
        }
        let main = c * g.lsa;
        let shard = self.temp::<T>(1, c)?;
        let gathered = self.temp::<T>(2, g.teams * c)?;
        let bytes = main * size;
        // 1. Shard `l` of the team's sum.
        let (send_main, recv_main) = (send.sub(0, main)?, recv.sub(0, main)?);
        self.launch_lsa(Kind::ReduceScatter, &send_main, &shard, c, &team_op, 0, Algorithm::OneShot, bytes, stream)?;
        // 2. The shard summed over the teams, along the rail.
        self.rail_all_reduce(g, &shard, &gathered, c, rail_op, avg, stream)?;
        // 3. Every shard to every rank of the team.
        self.launch_lsa(Kind::AllGather, &shard, &recv_main, c, &Op::Sum, 0, Algorithm::OneShot, bytes, stream)?;
        if main < count {
            let (s, r) = (send.sub(main, count - main)?, recv.sub(main, count - main)?);
            self.hier_all_reduce_small(g, &s, &r, count - main, &team_op, rail_op, avg, Algorithm::Auto, stream)?;
        }
        Ok(())
    }

    /// All-reduce in the team (with `algorithm`, `Auto`: by size), then
    /// of the whole result along the rail.
    #[allow(clippy::too_many_arguments)]
    fn hier_all_reduce_small<T: CollType>(
        &self,
        g: Layout,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        team_op: &Op<'_, T>,
        rail_op: RedOp,
        avg: u32,
        algorithm: Algorithm,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = count * std::mem::size_of::<T>();
        let algorithm = match algorithm {
            Algorithm::Ll if bytes as u64 <= self.ctx.ll_bytes() => Algorithm::Ll,
            Algorithm::OneShot | Algorithm::TwoShot => algorithm,
            _ => Algorithm::choose(bytes as u64, &self.ctx),
        };
        self.launch_lsa(Kind::AllReduce, send, recv, count, team_op, 0, algorithm, bytes, stream)?;
        let gathered = self.temp::<T>(3, g.teams * count)?;
        self.rail_all_reduce(g, recv, &gathered, count, rail_op, avg, stream)
    }

    /// `buf = rail_op over the rail of buf` (`count` elements; `gathered`
    /// holds `teams * count`). Two teams, or a message under
    /// `hier_split_min_bytes` or of fewer elements than teams: every rank of
    /// the rail sends `buf` to every other one, receives theirs into
    /// `gathered` (block `t` from team `t`) and reduces the blocks (one
    /// group, `(T-1)·count` elements out). Else a reduce-scatter then an
    /// all-gather along the rail, direct (rank `t` reduces piece `t`: two
    /// groups, `2·(T-1)/T·count` out, as a ring, in two steps).
    #[allow(clippy::too_many_arguments)]
    fn rail_all_reduce<T: CollType>(
        &self,
        g: Layout,
        buf: &Operand<'_, T>,
        gathered: &Operand<'static, T>,
        count: usize,
        rail_op: RedOp,
        avg: u32,
        stream: &Stream,
    ) -> Result<()> {
        let buf = *buf;
        let size = std::mem::size_of::<T>();
        if g.teams > 2 && count >= g.teams && count * size >= self.config.hier_split_min_bytes {
            // Piece `j` of the message: `count / T` elements, one more for the first `count % T`.
            let piece = |j: usize| {
                let (base, extra) = (count / g.teams, count % g.teams);
                (j * base + j.min(extra), base + usize::from(j < extra))
            };
            let (mine, len) = piece(g.team);
            // 1. Piece `t` of every rank of the rail, reduced on rank `t`.
            // SAFETY: `gathered` holds `teams` blocks of `len <= count`,
            // `buf` `count` elements; not overlapping.
            unsafe { self.copy_elems::<T>(&[(Self::at(gathered, g.team * len), Self::at(&buf, mine), len)], stream) }?;
            self.step_group(stream, |grp| {
                for t in g.other_teams() {
                    let (at, n) = piece(t);
                    grp.send(buf.sub(at, n)?, g.rail_peer(t))?;
                    grp.recv(gathered.sub(t * len, len)?, g.rail_peer(t))?;
                }
                Ok(())
            })?;
            // SAFETY: `gathered` holds `teams` blocks of `len` (filled
            // above), `buf`'s piece `len` elements.
            unsafe { self.reduce_local(gathered, g.teams, Self::at(&buf, mine), len, rail_op, (0, 0), avg, stream) }?;
            // 2. Every reduced piece to every rank of the rail.
            return self.step_group(stream, |grp| {
                for t in g.other_teams() {
                    let (at, n) = piece(t);
                    grp.send(buf.sub(mine, len)?, g.rail_peer(t))?;
                    grp.recv(buf.sub(at, n)?, g.rail_peer(t))?;
                }
                Ok(())
            });
        }
        // SAFETY: `gathered` holds `teams` blocks of `count`, `buf` `count`
        // elements (a checked operand or a scratch slot), not overlapping.
        unsafe { self.copy_elems::<T>(&[(Self::at(gathered, g.team * count), buf.ptr, count)], stream) }?;
        self.step_group(stream, |grp| {
            for t in g.other_teams() {
                grp.send(buf, g.rail_peer(t))?;
                grp.recv(gathered.sub(t * count, count)?, g.rail_peer(t))?;
            }
            Ok(())
        })?;
        // SAFETY: `gathered` holds `teams` blocks of `count` (filled above,
        // earlier on this stream), `buf` `count` elements.
        unsafe { self.reduce_local(gathered, g.teams, buf.ptr, count, rail_op, (0, 0), avg, stream) }
    }

    /// Reduce-scatter: regroup the blocks by rail, reduce-scatter in the
    /// team (rank `l` gets the team's sum of the blocks of rail `l`), then
    /// along the rail (rank `t·L + l` gets block `t·L + l`). `c`: elements
    /// per block.
    #[allow(clippy::too_many_arguments)]
    fn hier_reduce_scatter<T: CollType>(
        &self,
        g: Layout,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        c: usize,
        op: &Op<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        let (team_op, rail_op, avg) = levels(op, &g);
        let n = g.ranks();
        // 1. by_rail[l'][t'] = send's block t'·L + l'.
        let by_rail = self.temp::<T>(1, n * c)?;
        let mut copies = Vec::with_capacity(n);
        for l in 0..g.lsa {
            for t in 0..g.teams {
                copies.push((Self::at(&by_rail, (l * g.teams + t) * c), Self::at(send, (t * g.lsa + l) * c), c));
            }
        }
        // SAFETY: `by_rail` and `send` hold `n` blocks of `c` (a scratch
        // slot; checked by the caller), the destinations are disjoint.
        unsafe { self.copy_elems::<T>(&copies, stream) }?;
        // 2. partial[t'] = the team's sum of block t'·L + l.
        let partial = self.temp::<T>(2, g.teams * c)?;
        let rail_len = g.teams * c;
        self.launch_lsa(
            Kind::ReduceScatter,
            &by_rail,
            &partial,
            rail_len,
            &team_op,
            0,
            Algorithm::OneShot,
            n * c * size,
            stream,
        )?;
        // 3. partial[t'] to rail rank t'; the teams' partial sums of my block reduced.
        let gathered = self.temp::<T>(3, g.teams * c)?;
        let own = g.team * c;
        // SAFETY: both scratch slots hold `teams` blocks of `c`.
        unsafe { self.copy_elems::<T>(&[(Self::at(&gathered, own), Self::at(&partial, own), c)], stream) }?;
        self.step_group(stream, |grp| {
            for t in g.other_teams() {
                grp.send(partial.sub(t * c, c)?, g.rail_peer(t))?;
                grp.recv(gathered.sub(t * c, c)?, g.rail_peer(t))?;
            }
            Ok(())
        })?;
        // SAFETY: `gathered` holds `teams` blocks of `c` (filled above),
        // `recv` `c` elements (checked by the caller).
        unsafe { self.reduce_local(&gathered, g.teams, recv.ptr, c, rail_op, (0, 0), avg, stream) }
    }

    /// All-gather: along the rail (rank `t·L + l` gets the blocks of rail
    /// `l`), in the team (every rail's), then into world order. `c`:
    /// elements per block.
    fn hier_all_gather<T: CollType>(
        &self,
        g: Layout,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        c: usize,
        stream: &Stream,
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        let n = g.ranks();
        let send = *send;
        // 1. rail[t'] = block t'·L + l.
        let rail = self.temp::<T>(1, g.teams * c)?;
        // SAFETY: `rail` holds `teams` blocks of `c`, `send` `c` elements.
        unsafe { self.copy_elems::<T>(&[(Self::at(&rail, g.team * c), send.ptr, c)], stream) }?;
        self.step_group(stream, |grp| {
            for t in g.other_teams() {
                grp.send(send, g.rail_peer(t))?;
                grp.recv(rail.sub(t * c, c)?, g.rail_peer(t))?;
            }
            Ok(())
        })?;
        // 2. team[l'][t'] = block t'·L + l'.
        let team = self.temp::<T>(2, n * c)?;
        self.launch_lsa(
            Kind::AllGather,
            &rail,
            &team,
            g.teams * c,
            &Op::Sum,
            0,
            Algorithm::OneShot,
            n * c * size,
            stream,
        )?;
        // 3. World order.
        let mut copies = Vec::with_capacity(n);
        for l in 0..g.lsa {
            for t in 0..g.teams {
                copies.push((Self::at(recv, (t * g.lsa + l) * c), Self::at(&team, (l * g.teams + t) * c), c));
            }
        }
        // SAFETY: `recv` holds `n` blocks of `c` (checked by the caller),
        // `team` too (a scratch slot); the destinations are disjoint.
        unsafe { self.copy_elems::<T>(&copies, stream) }
    }

    /// Broadcast: the root to the ranks of its rail, then each of those to
    /// its team.
    fn hier_broadcast<T: CollType>(
        &self,
        g: Layout,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let me = self.comm.rank();
        let (root_team, root_lsa) = (root / g.lsa, root % g.lsa);
        let (send, recv) = (*send, *recv);
        if g.lsa_rank == root_lsa {
            self.step_group(stream, |grp| {
                if me == root {
                    for t in (1..g.teams).map(|k| (root_team + k) % g.teams) {
                        grp.send(send, g.rail_peer(t))?;
                    }
                    Ok(())
                } else {
                    grp.recv(recv, root)
                }
            })?;
        }
        let src = if me == root {
            send
        } else if g.lsa_rank == root_lsa {
            recv
        } else {
            Operand::null()
        };
        let bytes = count * std::mem::size_of::<T>();
        self.launch_lsa(Kind::Broadcast, &src, &recv, count, &Op::Sum, root_lsa, Algorithm::Auto, bytes, stream)
    }

    /// Reduce: in each team to the root's LSA rank, then those partial
    /// results to the root, reduced there.
    #[allow(clippy::too_many_arguments)]
    fn hier_reduce<T: CollType>(
        &self,
        g: Layout,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        op: &Op<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let me = self.comm.rank();
        let (root_team, root_lsa) = (root / g.lsa, root % g.lsa);
        let (team_op, rail_op, avg) = levels(op, &g);
        let on_rail = g.lsa_rank == root_lsa;
        let partial = if on_rail { self.temp::<T>(1, count)? } else { Operand::null() };
        let bytes = count * std::mem::size_of::<T>();
        self.launch_lsa(Kind::Reduce, send, &partial, count, &team_op, root_lsa, Algorithm::Auto, bytes, stream)?;
        if !on_rail {
            return Ok(());
        }
        if me != root {
            return self.step_group(stream, |grp| grp.send(partial, root));
        }
        let gathered = self.temp::<T>(2, g.teams * count)?;
        let own = root_team * count;
        // SAFETY: `gathered` holds `teams` blocks of `count`, `partial` `count`.
        unsafe { self.copy_elems::<T>(&[(Self::at(&gathered, own), partial.ptr, count)], stream) }?;
        self.step_group(stream, |grp| {
            for t in (1..g.teams).map(|k| (root_team + k) % g.teams) {
                grp.recv(gathered.sub(t * count, count)?, g.rail_peer(t))?;
            }
            Ok(())
        })?;
        // SAFETY: `gathered` holds `teams` blocks of `count` (filled above),
        // `recv` `count` elements (checked by the caller on the root).
        unsafe { self.reduce_local(&gathered, g.teams, recv.ptr, count, rail_op, (0, 0), avg, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_team_names() {
        assert_eq!(MultiTeam::parse("auto").unwrap(), MultiTeam::Auto);
        assert_eq!(MultiTeam::parse("").unwrap(), MultiTeam::Auto);
        assert_eq!(MultiTeam::parse(" Flat ").unwrap(), MultiTeam::Flat);
        assert_eq!(MultiTeam::parse("hier").unwrap(), MultiTeam::Hierarchical);
        assert_eq!(MultiTeam::parse("HIERARCHICAL").unwrap(), MultiTeam::Hierarchical);
        for bad in ["ring", "1", "hier2"] {
            assert!(matches!(MultiTeam::parse(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }

    #[test]
    fn reductions_split_in_two_levels() {
        let g = Layout { lsa: 2, teams: 3, team: 1, lsa_rank: 0 };
        assert_eq!(g.rail_peer(2), 4);
        assert_eq!(g.other_teams().collect::<Vec<_>>(), vec![2, 0]);
        let code = |o: &Op<'_, f32>| o.code();
        let (team, rail, avg) = levels::<f32>(&Op::Avg, &g);
        assert_eq!((code(&team), rail, avg), (RedOp::Avg, RedOp::Avg, 0));
        let (team, rail, avg) = levels::<i32>(&Op::Avg, &g);
        assert_eq!((team.code(), rail, avg), (RedOp::Sum, RedOp::Avg, 6));
        let (team, rail, avg) = levels::<f32>(&Op::PreMulSum(0.5), &g);
        assert_eq!((code(&team), rail, avg), (RedOp::PreMulSum, RedOp::Sum, 0));
        let (team, rail, avg) = levels::<u8>(&Op::Max, &g);
        assert_eq!((team.code(), rail, avg), (RedOp::Max, RedOp::Max, 0));
    }
}
