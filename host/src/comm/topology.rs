//! What every rank tells every other rank at bootstrap: [`RankInfo`].

use crate::bootstrap::fnv1a64;
use crate::error::{Error, Result};
use crate::runtime::{Device, RuntimeKind};

/// Environment variable that overrides this process's host identity, so one
/// machine can pretend to be several hosts (ranks with different values are
/// never load/store candidates).
pub const HOST_ID_ENV: &str = "DEVCOMM_HOST_ID";

const INFO_VERSION: u8 = 1;

/// One rank as seen by every rank: where it runs and which device it drives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// The rank.
    pub rank: usize,
    /// The host's name.
    pub hostname: String,
    /// The host's boot id (`/proc/sys/kernel/random/boot_id`; empty if unreadable).
    pub boot_id: String,
    /// The identity ranks compare to decide "same host": hostname + boot id,
    /// or [`HOST_ID_ENV`] when set.
    pub host_id: String,
    /// The rank's process id.
    pub pid: u32,
    /// The runtime of the rank's device.
    pub runtime: RuntimeKind,
    /// The device's ordinal.
    pub device_ordinal: usize,
    /// The device's UUID.
    pub device_uuid: [u8; 16],
    /// The device's name.
    pub device_name: String,
}

impl RankInfo {
    /// Describes this process as rank `rank` driving `device`.
    pub fn local(rank: usize, device: &Device) -> RankInfo {
        let hostname = read_trimmed("/proc/sys/kernel/hostname")
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown-host".into());
        let boot_id = read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let host_id = match std::env::var(HOST_ID_ENV) {
            Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
            _ => format!("{hostname}/{boot_id}"),
        };
        RankInfo {
            rank,
            hostname,
            boot_id,
            host_id,
            pid: std::process::id(),
            runtime: device.kind(),
            device_ordinal: device.ordinal(),
            device_uuid: device.uuid(),
            device_name: device.name(),
        }
    }

    /// A 64-bit hash of [`RankInfo::host_id`].
    pub fn host_hash(&self) -> u64 {
        fnv1a64(0, self.host_id.as_bytes())
    }

    /// Whether `other` runs on the same host (a load/store candidate).
    pub fn same_host(&self, other: &RankInfo) -> bool {
        self.host_id == other.host_id
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![INFO_VERSION];
        b.extend_from_slice(&(self.rank as u64).to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.push(match self.runtime {
            RuntimeKind::Cuda => 0,
            RuntimeKind::Emulated => 1,
        });
        b.extend_from_slice(&(self.device_ordinal as u64).to_le_bytes());
        b.extend_from_slice(&self.device_uuid);
        for s in [&self.hostname, &self.boot_id, &self.host_id, &self.device_name] {
            let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
            b.extend_from_slice(&(s.len() as u16).to_le_bytes());
            b.extend_from_slice(s);
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<RankInfo> {
        let bad = |why: &str| Error::remote(format!("malformed rank info from bootstrap: {why}"));
        let mut r = b;
        let mut take = |n: usize| -> Result<&[u8]> {
            if r.len() < n {
                return Err(bad("truncated"));
            }
            let (a, rest) = r.split_at(n);
            r = rest;
            Ok(a)
        };
        if take(1)?[0] != INFO_VERSION {
            return Err(bad("unknown version"));
        }
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
        let rank = u64_of(take(8)?) as usize;
        let pid = u32::from_le_bytes(take(4)?.try_into().unwrap_or([0; 4]));
        let runtime = match take(1)?[0] {
            0 => RuntimeKind::Cuda,
            1 => RuntimeKind::Emulated,
            _ => return Err(bad("unknown runtime kind")),
        };
        let device_ordinal = u64_of(take(8)?) as usize;
        let mut device_uuid = [0u8; 16];
        device_uuid.copy_from_slice(take(16)?);
        let mut strings = Vec::with_capacity(4);
        for _ in 0..4 {
            let n = u16::from_le_bytes(take(2)?.try_into().unwrap_or([0; 2])) as usize;
            strings.push(String::from_utf8_lossy(take(n)?).into_owned());
        }
        if !r.is_empty() {
            return Err(bad("trailing bytes"));
        }
        let mut s = strings.into_iter();
        let mut next = || s.next().unwrap_or_default();
        Ok(RankInfo {
            rank,
            pid,
            runtime,
            device_ordinal,
            device_uuid,
            hostname: next(),
            boot_id: next(),
            host_id: next(),
            device_name: next(),
        })
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// Who shares a host with whom, derived from every rank's [`RankInfo`].
#[derive(Clone, Debug)]
pub(crate) struct Topology {
    pub(crate) infos: Vec<RankInfo>,
    /// `host_of[r]`: index of rank r's host, in order of first appearance.
    pub(crate) host_of: Vec<usize>,
    pub(crate) nhosts: usize,
}

impl Topology {
    pub(crate) fn new(infos: Vec<RankInfo>) -> Topology {
        let mut hosts: Vec<&str> = Vec::new();
        let host_of = infos
            .iter()
            .map(|i| match hosts.iter().position(|h| *h == i.host_id) {
                Some(p) => p,
                None => {
                    hosts.push(&i.host_id);
                    hosts.len() - 1
                }
            })
            .collect();
        let nhosts = hosts.len();
        Topology { infos, host_of, nhosts }
    }

    pub(crate) fn ranks_on_host_of(&self, rank: usize) -> Vec<usize> {
        let h = self.host_of[rank];
        (0..self.infos.len()).filter(|&r| self.host_of[r] == h).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rank: usize, host: &str) -> RankInfo {
        RankInfo {
            rank,
            hostname: host.into(),
            boot_id: "b".into(),
            host_id: host.into(),
            pid: 7,
            runtime: RuntimeKind::Emulated,
            device_ordinal: rank,
            device_uuid: [rank as u8; 16],
            device_name: format!("dev{rank}"),
        }
    }

    #[test]
    fn info_roundtrip_and_garbage() {
        let i = info(3, "node-a");
        assert_eq!(RankInfo::decode(&i.encode()).unwrap(), i);
        let b = i.encode();
        for cut in 0..b.len() {
            assert!(matches!(RankInfo::decode(&b[..cut]), Err(Error::RemoteError(_))));
        }
    }

    #[test]
    fn hosts_group_ranks() {
        let t = Topology::new(vec![info(0, "a"), info(1, "b"), info(2, "a"), info(3, "b")]);
        assert_eq!(t.nhosts, 2);
        assert_eq!(t.ranks_on_host_of(0), vec![0, 2]);
        assert_eq!(t.ranks_on_host_of(3), vec![1, 3]);
    }
}
