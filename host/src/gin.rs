//! GIN on the host side: which backend a communicator can have, and how to
//! force one.
//!
//! | backend | what it is | available |
//! |---|---|---|
//! | [`GinType::Proxy`] | a CPU progress thread serves GPU-posted descriptors (`devcomm-gin`) | always |
//! | [`GinType::Gdaki`] | GPU threads drive NIC queues (mlx5 + DOCA GPUNetIO) | only with such a NIC |
//! | [`GinType::Gpi`] | GPI | only with a GPI-capable device |
//!
//! Automatic selection takes the best available (GDAKI, else the proxy).
//! `DEVCOMM_GIN_TYPE=proxy|gdaki|gpi|none` or [`Config::gin_type`](crate::comm::Config)
//! forces one; forcing an unavailable backend is an [`Error::InvalidUsage`]
//! that says why it is unavailable.
//!
//! The proxy backend reaches peers through a *transport* ([`GinTransport`]):
//! by default the copy engine for same-host peers and TCP across hosts;
//! `DEVCOMM_GIN_TRANSPORT=tcp|verbs` or [`Config::gin_transport`](crate::comm::Config)
//! picks another. `verbs` (RDMA over libibverbs, for every peer) needs the
//! cargo feature `verbs` and an RDMA NIC.
//!
//! ```no_run
//! # fn main() -> devcomm::Result<()> {
//! let comm = devcomm::comm::Communicator::init_from_env()?;
//! println!("GIN: {} (railed: {})", comm.gin_type()?, comm.railed_gin_type()?);
//! # Ok(()) }
//! ```

use crate::comm::Communicator;
use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// The environment variable that forces a GIN backend.
pub const GIN_TYPE_ENV: &str = "DEVCOMM_GIN_TYPE";

/// A GIN backend (`ncclGinType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GinType {
    /// No GIN.
    None,
    /// CPU proxy.
    Proxy,
    /// GPU-driven NIC queues.
    Gdaki,
    /// GPI.
    Gpi,
}

impl GinType {
    /// The code kernels see in `GinState::backend`.
    pub fn code(self) -> u32 {
        match self {
            GinType::None => devcomm_device::gin::GinBackend::None as u32,
            GinType::Proxy => devcomm_device::gin::GinBackend::Proxy as u32,
            GinType::Gdaki => devcomm_device::gin::GinBackend::Gdaki as u32,
            GinType::Gpi => devcomm_device::gin::GinBackend::Gpi as u32,
        }
    }
}

impl fmt::Display for GinType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GinType::None => "none",
            GinType::Proxy => "proxy",
            GinType::Gdaki => "gdaki",
            GinType::Gpi => "gpi",
        })
    }
}

impl FromStr for GinType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(GinType::None),
            "proxy" => Ok(GinType::Proxy),
            "gdaki" => Ok(GinType::Gdaki),
            "gpi" => Ok(GinType::Gpi),
            other => {
                Err(Error::invalid_argument(format!("unknown GIN type {other:?}: expected proxy, gdaki, gpi or none")))
            }
        }
    }
}

/// The environment variable that picks the proxy backend's transport
/// ([`GinTransport`]): `auto` (default), `tcp` or `verbs`.
pub const GIN_TRANSPORT_ENV: &str = "DEVCOMM_GIN_TRANSPORT";

/// The environment variable that, set to `0`, stops the verbs transport
/// from exporting GPU windows as dmabufs (`cuMemGetHandleForAddressRange`,
/// registered with `ibv_reg_dmabuf_mr`): their device addresses are then
/// registered with `ibv_reg_mr`, which needs the `nvidia-peermem` kernel
/// module. Default `1` (dmabuf where the driver gives one).
pub const GIN_IB_DMABUF_ENV: &str = "DEVCOMM_GIN_IB_DMABUF";

/// Whether this build of devcomm has the RDMA Verbs transport (cargo
/// feature `verbs`). Without it, [`GinTransport::Verbs`] is an
/// [`Error::InvalidArgument`] at device-communicator creation.
pub const VERBS_BUILT: bool = cfg!(feature = "verbs");

/// How the proxy backend ([`GinType::Proxy`]) reaches peers. Every rank must
/// ask for the same one: `create_dev_comm` checks it, and fails on every
/// rank otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GinTransport {
    /// The copy engine for same-host peers (DMA into the peer's window,
    /// mapped into this process) and TCP for the others; TCP for everyone
    /// where the device has no 64-bit stream memory operations. The default.
    #[default]
    Auto,
    /// TCP for every peer.
    Tcp,
    /// RDMA Verbs (RDMA WRITE, atomic fetch-and-add for signals) for every
    /// peer, same-host peers included, as NCCL's GIN proxy does with a NIC.
    /// Needs the cargo feature `verbs` ([`VERBS_BUILT`]) and an RDMA device
    /// with an active port (`DEVCOMM_GIN_IB_*` variables: see
    /// `devcomm_gin::transport::verbs`). Without a device, `create_dev_comm`
    /// returns [`Error::InvalidUsage`] naming the cause on every rank.
    /// Untested on real NICs: none exists on the project's machines.
    Verbs,
}

impl fmt::Display for GinTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GinTransport::Auto => "auto",
            GinTransport::Tcp => "tcp",
            GinTransport::Verbs => "verbs",
        })
    }
}

impl FromStr for GinTransport {
    type Err = Error;

    /// `auto` (also `ce`, `copy_engine` and the empty string), `tcp` or `verbs`.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" | "ce" | "copy_engine" => Ok(GinTransport::Auto),
            "tcp" => Ok(GinTransport::Tcp),
            "verbs" => Ok(GinTransport::Verbs),
            other => Err(Error::invalid_argument(format!(
                "unknown GIN transport {other:?}: expected auto (copy engine on one host, TCP across hosts), \
                 tcp or verbs"
            ))),
        }
    }
}

impl GinTransport {
    /// The transport asked for: [`Config::gin_transport`](crate::comm::Config),
    /// else [`GIN_TRANSPORT_ENV`] read through `get`, else `Auto`.
    pub(crate) fn requested(
        config: Option<GinTransport>,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<GinTransport> {
        if let Some(t) = config {
            return Ok(t);
        }
        match get(GIN_TRANSPORT_ENV) {
            Some(v) => v.parse().map_err(|e: Error| e.context(GIN_TRANSPORT_ENV)),
            None => Ok(GinTransport::Auto),
        }
    }
}

/// Which peers a device communicator's GIN must reach (`ncclGinConnectionType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GinConnectionType {
    /// No GIN.
    #[default]
    None,
    /// Every rank.
    Full,
    /// The rail team only (same LSA index on every node).
    Rail,
}

impl GinConnectionType {
    /// The code kernels see in `GinState::connection`.
    pub fn code(self) -> u32 {
        match self {
            GinConnectionType::None => 0,
            GinConnectionType::Full => 1,
            GinConnectionType::Rail => 2,
        }
    }
}

/// Why GDAKI is not available here, if it is not: it needs an mlx5 NIC
/// (listed under `/sys/class/infiniband`) and DOCA GPUNetIO's library.
pub fn gdaki_unavailable_reason() -> Option<String> {
    let nics: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    if !nics.iter().any(|n| n.starts_with("mlx5")) {
        return Some("no mlx5 NIC found under /sys/class/infiniband (GDAKI drives mlx5 queues from the GPU)".into());
    }
    let doca = ["libdoca_gpunetio.so", "libdoca_gpunetio.so.2"];
    let found = ["/opt/mellanox/doca/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
        .iter()
        .any(|dir| doca.iter().any(|l| std::path::Path::new(dir).join(l).exists()));
    if !found {
        return Some("an mlx5 NIC is present but DOCA GPUNetIO (libdoca_gpunetio) is not installed".into());
    }
    None
}

/// Why GPI is not available here (it never is on the machines devcomm targets today).
pub fn gpi_unavailable_reason() -> Option<String> {
    Some("no GPI-capable device or library (libGPI2) was found".into())
}

fn forced(comm: &Communicator) -> Result<Option<GinType>> {
    if let Some(t) = comm.config().gin_type {
        return Ok(Some(t));
    }
    match std::env::var(GIN_TYPE_ENV) {
        Ok(v) if !v.trim().is_empty() && v.trim() != "auto" => {
            v.parse().map(Some).map_err(|e: Error| e.context(GIN_TYPE_ENV))
        }
        _ => Ok(None),
    }
}

fn check_available(t: GinType) -> Result<GinType> {
    let reason = match t {
        GinType::None | GinType::Proxy => None,
        GinType::Gdaki => gdaki_unavailable_reason(),
        GinType::Gpi => gpi_unavailable_reason(),
    };
    match reason {
        None => Ok(t),
        Some(r) => Err(Error::invalid_usage(format!("GIN backend {t} was forced but is not available: {r}"))),
    }
}

impl Communicator {
    /// The GIN backend device communicators of this communicator get with a
    /// full connection: the forced one (config, then `DEVCOMM_GIN_TYPE`),
    /// else the best available.
    ///
    /// Errors: [`Error::InvalidUsage`] when the forced backend is not available.
    pub fn gin_type(&self) -> Result<GinType> {
        match forced(self)? {
            Some(t) => check_available(t),
            None => Ok(if gdaki_unavailable_reason().is_none() { GinType::Gdaki } else { GinType::Proxy }),
        }
    }

    /// The GIN backend with a rail connection. The proxy serves both; a NIC
    /// backend would need one NIC per rail, which the same probe checks.
    pub fn railed_gin_type(&self) -> Result<GinType> {
        self.gin_type()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_errors() {
        for t in [GinType::None, GinType::Proxy, GinType::Gdaki, GinType::Gpi] {
            assert_eq!(t.to_string().parse::<GinType>().unwrap(), t);
        }
        assert!(matches!("verbs".parse::<GinType>(), Err(Error::InvalidArgument(_))));
        assert_eq!(GinType::Proxy.code(), 1);
    }

    #[test]
    fn transports_parse_and_the_config_wins_over_the_environment() {
        for t in [GinTransport::Auto, GinTransport::Tcp, GinTransport::Verbs] {
            assert_eq!(t.to_string().parse::<GinTransport>().unwrap(), t);
        }
        assert_eq!(" Copy_Engine ".parse::<GinTransport>().unwrap(), GinTransport::Auto);
        let env = |v: &'static str| move |k: &str| (k == GIN_TRANSPORT_ENV).then(|| v.to_string());
        assert_eq!(GinTransport::requested(None, |_| None).unwrap(), GinTransport::Auto);
        assert_eq!(GinTransport::requested(None, env("verbs")).unwrap(), GinTransport::Verbs);
        assert_eq!(GinTransport::requested(Some(GinTransport::Tcp), env("verbs")).unwrap(), GinTransport::Tcp);
        let e = GinTransport::requested(None, env("rdma")).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(ref m) if m.contains(GIN_TRANSPORT_ENV) && m.contains("verbs")),
            "{e}"
        );
    }

    #[test]
    fn forcing_an_absent_backend_says_why() {
        assert!(check_available(GinType::Proxy).is_ok());
        let e = check_available(GinType::Gpi).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(ref m) if m.contains("gpi") && m.contains("not available")), "{e}");
        if gdaki_unavailable_reason().is_some() {
            assert!(matches!(check_available(GinType::Gdaki), Err(Error::InvalidUsage(_))));
        }
    }
}
