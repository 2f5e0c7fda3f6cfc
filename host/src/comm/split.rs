//! [`Communicator::split`]: sub-communicators by color and key.

use super::{Communicator, Config};
use crate::bootstrap::{Root, UniqueId};
use crate::error::{Error, Result};
use std::net::SocketAddr;

const NO_COLOR: u8 = 0;
const HAS_COLOR: u8 = 1;

impl Communicator {
    /// Splits the communicator (`ncclCommSplit`). Collective over this
    /// communicator: every rank calls it.
    ///
    /// Ranks with the same `color` form a new communicator, ordered by `key`
    /// (ties by their rank here); `color: None` (`NCCL_SPLIT_NOCOLOR`) takes
    /// part in the collective but joins nothing and gets `Ok(None)`. The new
    /// communicators drive the same devices and use this one's [`Config`]
    /// (creation is always blocking).
    ///
    /// How: the (color, key) pairs are allgathered over this communicator's
    /// bootstrap; each group's first member starts a new root; the roots'
    /// ids are allgathered; members join theirs.
    #[doc(alias = "ncclCommSplit")]
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.split_with_config(color, key, self.config.clone())
    }

    /// As [`Communicator::split`] with an explicit [`Config`] for the new
    /// communicator (its `device` defaults to this communicator's).
    pub fn split_with_config(&self, color: Option<u32>, key: i32, config: Config) -> Result<Option<Communicator>> {
        let ready = self.ready()?;
        let mut mine = Vec::with_capacity(9);
        mine.push(if color.is_some() { HAS_COLOR } else { NO_COLOR });
        mine.extend_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = ready.client.allgather(&mine).map_err(|e| e.context("split: exchanging colors"))?;
        let mut pairs = Vec::with_capacity(all.len());
        for (r, b) in all.iter().enumerate() {
            if b.len() != 9 || b[0] > HAS_COLOR {
                return Err(Error::remote(format!("split: rank {r} sent a malformed color/key")));
            }
            let c = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
            let k = i32::from_le_bytes([b[5], b[6], b[7], b[8]]);
            pairs.push(((b[0] == HAS_COLOR).then_some(c), k));
        }
        let group: Vec<usize> = match color {
            Some(c) => {
                let mut g: Vec<usize> = (0..pairs.len()).filter(|&r| pairs[r].0 == Some(c)).collect();
                g.sort_by_key(|&r| (pairs[r].1, r));
                g
            }
            None => Vec::new(),
        };
        // The group's leader starts the new root, reachable where this rank reaches the parent's.
        let leader = group.first().copied();
        let my_id = if leader == Some(self.rank) {
            let ip = ready.client.local_ip().map_err(|e| e.context("split"))?;
            let root = Root::spawn(SocketAddr::new(ip, 0), crate::bootstrap::random_magic())?;
            root.id().to_bytes().to_vec()
        } else {
            Vec::new()
        };
        let ids = ready.client.allgather(&my_id).map_err(|e| e.context("split: exchanging ids"))?;
        let (Some(leader), Some(new_rank)) = (leader, group.iter().position(|&r| r == self.rank)) else {
            return Ok(None);
        };
        let id = UniqueId::from_bytes(&ids[leader])
            .map_err(|e| Error::remote(format!("split: leader rank {leader} sent a bad id: {e}")))?;
        let mut cfg = config.with_blocking(true);
        if cfg.device.is_none() {
            cfg.device = Some(self.device.clone());
        }
        Communicator::init_rank_with_config(group.len(), id, new_rank, cfg).map(Some)
    }
}
