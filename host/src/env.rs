//! Rank, world size and rendezvous from the environment of the launcher
//! people already use: torchrun (and `devcomm-run`), Slurm, Open MPI.
//!
//! | what        | torchrun / devcomm-run | Open MPI                       | Slurm                 |
//! |-------------|------------------------|--------------------------------|-----------------------|
//! | rank        | `RANK`                 | `OMPI_COMM_WORLD_RANK`         | `SLURM_PROCID`        |
//! | world size  | `WORLD_SIZE`           | `OMPI_COMM_WORLD_SIZE`         | `SLURM_NTASKS`        |
//! | local rank  | `LOCAL_RANK`           | `OMPI_COMM_WORLD_LOCAL_RANK`   | `SLURM_LOCALID`       |
//! | local size  | `LOCAL_WORLD_SIZE`     | `OMPI_COMM_WORLD_LOCAL_SIZE`   | —                     |
//!
//! The first launcher whose rank and size variables are both set wins, in
//! the column order above. Rendezvous:
//!
//! * `DEVCOMM_UNIQUE_ID` (a [`UniqueId`] string), when set, wins: every rank
//!   connects to that root (`devcomm-run` hosts one and sets it).
//! * Otherwise rank 0 hosts the root at `MASTER_ADDR:port` and the others
//!   connect there, retrying until the bootstrap timeout. The port is
//!   `DEVCOMM_BOOTSTRAP_PORT`, else `MASTER_PORT` — plus one under a real
//!   torchrun (`TORCHELASTIC_RUN_ID` set), whose agent already listens on
//!   `MASTER_PORT`. Under Slurm without `MASTER_ADDR`, the first node of
//!   `SLURM_JOB_NODELIST` and a port derived from `SLURM_JOB_ID` are used.
//!   The magic is a hash of address, port and the job id
//!   (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`, `OMPI_MCA_ess_base_jobid`), so
//!   every rank derives the same one.

use crate::bootstrap::{fnv1a64, parse_host_port, Root, UniqueId};
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Variable holding a [`UniqueId`] string; wins over every other rendezvous.
pub const UNIQUE_ID_ENV: &str = "DEVCOMM_UNIQUE_ID";
/// Variable overriding the port rank 0's root binds when there is no unique id.
pub const BOOTSTRAP_PORT_ENV: &str = "DEVCOMM_BOOTSTRAP_PORT";

/// Which launcher's variables gave the rank and world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `RANK` / `WORLD_SIZE` (torchrun, `devcomm-run`, or set by hand).
    Torchrun,
    /// `OMPI_COMM_WORLD_*`.
    OpenMpi,
    /// `SLURM_PROCID` / `SLURM_NTASKS`.
    Slurm,
}

/// What the environment says about this process's place in a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Whose variables these are.
    pub launcher: Launcher,
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank among the processes of this host, when the launcher says.
    pub local_rank: Option<usize>,
    /// Number of processes on this host, when the launcher says.
    pub local_world_size: Option<usize>,
    /// `DEVCOMM_UNIQUE_ID`, parsed.
    pub explicit_id: Option<UniqueId>,
    /// The rendezvous host (`MASTER_ADDR` or Slurm's first node) and port.
    pub master: Option<(String, u16)>,
    /// A job identifier mixed into the magic.
    pub job_id: Option<String>,
}

fn parse_var<T: std::str::FromStr>(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<T>> {
    match get(var) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => v
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|_| Error::invalid_argument(format!("{var}={v:?} is not a valid number"))),
    }
}

impl LaunchEnv {
    /// Reads the process environment.
    ///
    /// Errors: [`Error::InvalidUsage`] when no launcher's variables are set;
    /// [`Error::InvalidArgument`] when one is malformed or inconsistent.
    pub fn from_env() -> Result<LaunchEnv> {
        LaunchEnv::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`LaunchEnv::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        const SETS: [(Launcher, &str, &str, &str, Option<&str>); 3] = [
            (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", Some("LOCAL_WORLD_SIZE")),
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
            ),
            (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
        ];
        let mut found = None;
        for (launcher, rank_var, size_var, local_var, local_size_var) in SETS {
            let rank = parse_var::<usize>(&get, rank_var)?;
            let size = parse_var::<usize>(&get, size_var)?;
            match (rank, size) {
                (Some(rank), Some(size)) => {
                    if size == 0 {
                        return Err(Error::invalid_argument(format!("{size_var} is 0")));
                    }
                    if rank >= size {
                        return Err(Error::invalid_argument(format!(
                            "{rank_var}={rank} is out of range for {size_var}={size}"
                        )));
                    }
                    let local_rank = parse_var::<usize>(&get, local_var)?;
                    let local_size = match local_size_var {
                        Some(v) => parse_var::<usize>(&get, v)?,
                        None => None,
                    };
                    found = Some((launcher, rank, size, local_rank, local_size));
                    break;
                }
                (Some(_), None) if launcher == Launcher::Torchrun => {
                    return Err(Error::invalid_argument("RANK is set but WORLD_SIZE is not"))
                }
                _ => {}
            }
        }
        let Some((launcher, rank, world_size, local_rank, local_world_size)) = found else {
            return Err(Error::invalid_usage(
                "no launcher environment: set RANK and WORLD_SIZE (torchrun, devcomm-run), \
                 or run under Slurm (SLURM_PROCID, SLURM_NTASKS) or Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)",
            ));
        };
        let explicit_id = match get(UNIQUE_ID_ENV) {
            Some(v) if !v.trim().is_empty() => Some(v.parse::<UniqueId>().map_err(|e| e.context(UNIQUE_ID_ENV))?),
            _ => None,
        };
        let job_id = get("TORCHELASTIC_RUN_ID")
            .or_else(|| get("SLURM_JOB_ID").map(|j| format!("{j}.{}", get("SLURM_STEP_ID").unwrap_or_default())))
            .or_else(|| get("OMPI_MCA_ess_base_jobid"))
            .filter(|s| !s.is_empty());
        let master_addr = get("MASTER_ADDR")
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().to_string())
            .or_else(|| get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST")).and_then(|l| first_slurm_node(&l)));
        let master_port = parse_var::<u16>(&get, "MASTER_PORT")?;
        let mut port = match parse_var::<u16>(&get, BOOTSTRAP_PORT_ENV)? {
            Some(p) => Some(p),
            None if get("TORCHELASTIC_RUN_ID").is_some() => master_port.map(|p| p.wrapping_add(1)),
            None => master_port,
        };
        if port.is_none() {
            if let Some(j) = get("SLURM_JOB_ID").and_then(|j| j.trim().parse::<u64>().ok()) {
                port = Some(20000 + (j % 20000) as u16);
            }
        }
        if port == Some(0) {
            return Err(Error::invalid_argument("the bootstrap port is 0"));
        }
        let master = master_addr.zip(port);
        Ok(LaunchEnv { launcher, rank, world_size, local_rank, local_world_size, explicit_id, master, job_id })
    }

    /// The magic every rank derives for the `MASTER_ADDR` rendezvous.
    pub fn derived_magic(&self, host: &str, port: u16) -> u128 {
        let text = format!("devcomm-env-v1|{host}|{port}|{}|{}", self.world_size, self.job_id.as_deref().unwrap_or(""));
        let lo = fnv1a64(0x5eed_0001, text.as_bytes()) as u128;
        let hi = fnv1a64(0x5eed_0002, text.as_bytes()) as u128;
        (hi << 64) | lo | 1
    }

    /// The id this rank joins with. Rank 0 of a `MASTER_ADDR` rendezvous
    /// starts the root here (binding `MASTER_ADDR:port`, or all interfaces
    /// on that port when the address is not local).
    ///
    /// Errors: [`Error::InvalidUsage`] when the environment gives neither
    /// `DEVCOMM_UNIQUE_ID` nor a master address and port;
    /// [`Error::SystemError`] when rank 0 cannot bind.
    pub fn unique_id(&self) -> Result<UniqueId> {
        if let Some(id) = self.explicit_id {
            return Ok(id);
        }
        let Some((host, port)) = &self.master else {
            return Err(Error::invalid_usage(format!(
                "no rendezvous in the environment: set {UNIQUE_ID_ENV}, or MASTER_ADDR and MASTER_PORT"
            )));
        };
        let addr = parse_host_port(host, *port).map_err(|e| e.context("MASTER_ADDR"))?;
        let addr = SocketAddr::new(addr.ip(), *port);
        let magic = self.derived_magic(host, *port);
        if self.rank == 0 {
            match Root::spawn(addr, magic) {
                Ok(_) => {}
                Err(first) => {
                    // MASTER_ADDR may name this host by an address it cannot bind (NAT, alias).
                    let any = SocketAddr::new(
                        if addr.is_ipv4() {
                            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                        } else {
                            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                        },
                        *port,
                    );
                    Root::spawn(any, magic).map_err(|_| first.context("rank 0 hosts the bootstrap root"))?;
                }
            }
        }
        Ok(UniqueId::from_parts(addr, magic))
    }
}

/// First host of a Slurm node list: `node[01-04,07],other` → `node01`.
fn first_slurm_node(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find(',').unwrap_or(list.len());
    let bracket = list.find('[');
    match bracket {
        Some(b) if b < end => {
            let prefix = &list[..b];
            let inner = &list[b + 1..];
            let first: String = inner.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            (!first.is_empty()).then(|| format!("{prefix}{first}"))
        }
        _ => {
            let h = &list[..end];
            (!h.is_empty()).then(|| h.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_lookup(move |k| m.get(k).cloned())
    }

    #[test]
    fn torchrun_vars() {
        let e = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(e.launcher, Launcher::Torchrun);
        assert_eq!((e.rank, e.world_size, e.local_rank, e.local_world_size), (3, 8, Some(1), Some(2)));
        assert_eq!(e.master, Some(("10.0.0.1".into(), 29500)));
        let id = e.unique_id().unwrap();
        assert_eq!(id.addr(), "10.0.0.1:29500".parse().unwrap());
        // Every rank derives the same magic.
        let e2 =
            env(&[("RANK", "5"), ("WORLD_SIZE", "8"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")]).unwrap();
        assert_eq!(e2.unique_id().unwrap(), id);
    }

    #[test]
    fn real_torchrun_shifts_port() {
        let e = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ])
        .unwrap();
        assert_eq!(e.master, Some(("h".into(), 29501)));
        let e = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "29500"),
            (BOOTSTRAP_PORT_ENV, "4000"),
        ])
        .unwrap();
        assert_eq!(e.master, Some(("h".into(), 4000)));
    }

    #[test]
    fn slurm_and_ompi_vars() {
        let e = env(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_ID", "12345"),
            ("SLURM_JOB_NODELIST", "gpu[07-08],cpu1"),
        ])
        .unwrap();
        assert_eq!(e.launcher, Launcher::Slurm);
        assert_eq!((e.rank, e.world_size, e.local_rank), (2, 4, Some(0)));
        assert_eq!(e.master, Some(("gpu07".into(), 20000 + 12345)));
        let e =
            env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0")])
                .unwrap();
        assert_eq!(e.launcher, Launcher::OpenMpi);
        assert!(matches!(e.unique_id(), Err(Error::InvalidUsage(_))));
    }

    #[test]
    fn unique_id_wins() {
        let id = UniqueId::from_parts("127.0.0.1:5555".parse().unwrap(), 42);
        let s = id.to_string();
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "1"),
            (UNIQUE_ID_ENV, &s),
        ])
        .unwrap();
        assert_eq!(e.unique_id().unwrap(), id);
        let bad = env(&[("RANK", "0"), ("WORLD_SIZE", "2"), (UNIQUE_ID_ENV, "nope")]);
        assert!(matches!(bad, Err(Error::InvalidArgument(m)) if m.contains(UNIQUE_ID_ENV)));
    }

    #[test]
    fn bad_vars() {
        assert!(matches!(env(&[]), Err(Error::InvalidUsage(_))));
        assert!(matches!(env(&[("RANK", "x"), ("WORLD_SIZE", "2")]), Err(Error::InvalidArgument(_))));
        assert!(matches!(env(&[("RANK", "2"), ("WORLD_SIZE", "2")]), Err(Error::InvalidArgument(_))));
        assert!(matches!(env(&[("RANK", "0"), ("WORLD_SIZE", "0")]), Err(Error::InvalidArgument(_))));
        assert!(matches!(env(&[("RANK", "0")]), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            env(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "99999")]),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn slurm_nodelists() {
        assert_eq!(first_slurm_node("node1"), Some("node1".into()));
        assert_eq!(first_slurm_node("a,b"), Some("a".into()));
        assert_eq!(first_slurm_node("n[3-5]"), Some("n3".into()));
        assert_eq!(first_slurm_node(""), None);
    }

    #[test]
    fn rank0_hosts_root() {
        // Pick a free port, then let rank 0 bind it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port.to_string()),
        ])
        .unwrap();
        let id = e.unique_id().unwrap();
        std::net::TcpStream::connect(id.addr()).unwrap();
    }
}
