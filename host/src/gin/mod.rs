//! GIN on the host side: which backend a communicator can have, and how to
//! force one.
//!
//! | backend | what it is | in devcomm |
//! |---|---|---|
//! | [`GinType::Proxy`] | a CPU progress thread serves GPU-posted descriptors (`devcomm-gin`) | implemented; works on every host |
//! | [`GinType::Gdaki`] | GPUDirect Async Kernel-Initiated: GPU threads drive mlx5 NIC queues (DOCA GPUNetIO) | not implemented yet |
//! | [`GinType::Gpi`] | GPU-Push Interface: NCCL's experimental GIN type for NVIDIA Spectrum-X Ethernet (NCCL 2.30.6+, through the Spectrum-X network plugin) | not implemented |
//!
//! Automatic selection ([`GinProbe::auto`]) takes the best backend that
//! devcomm implements *and* this host supports, so today it is always the
//! proxy, also on hosts with an mlx5 NIC and DOCA GPUNetIO; [`Communicator::gin_type`]
//! reports what will be used. `DEVCOMM_GIN_TYPE=proxy|gdaki|gpi|none` or
//! [`Config::gin_type`](crate::comm::Config) forces one; forcing one that
//! cannot be used is an [`Error::InvalidUsage`] that says why.
//!
//! Where things are: this module chooses the backend; `resources`
//! allocates a device communicator's GIN memory and starts the proxy from
//! `devcomm-gin` with the transports; `stream_copy_queue` is the proxy's
//! asynchronous device data path over a CUDA (or emulated) stream
//! (`devcomm_gin::CopyQueue`'s implementation); `verbs` connects the RDMA
//! transport (feature `verbs`).
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

pub(crate) mod resources;
mod stream_copy_queue;
#[cfg(feature = "verbs")]
mod verbs;

use crate::comm::Communicator;
use crate::error::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The environment variable that forces a GIN backend.
pub const GIN_TYPE_ENV: &str = "DEVCOMM_GIN_TYPE";

/// A GIN backend (`ncclGinType`).
#[doc(alias = "ncclGinType_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GinType {
    /// No GIN.
    None,
    /// CPU proxy.
    Proxy,
    /// GPUDirect Async Kernel-Initiated: GPU threads drive NIC queues
    /// (`NCCL_GIN_TYPE_GDAKI`). Not implemented in devcomm yet.
    Gdaki,
    /// GPU-Push Interface, NCCL's experimental GIN type for NVIDIA
    /// Spectrum-X Ethernet networking (`NCCL_GIN_TYPE_GPI`, NCCL 2.30.6+).
    /// Not implemented in devcomm.
    Gpi,
}

impl GinType {
    /// Whether this build of devcomm can run the backend at all (on a host
    /// that has what it needs).
    pub fn is_implemented(self) -> bool {
        matches!(self, GinType::None | GinType::Proxy)
    }

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
#[doc(alias = "ncclGinConnectionType_t")]
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
    /// The code kernels see in `GinState::connection`
    /// ([`devcomm_device::abi::gin::GinConnection`]).
    pub fn code(self) -> u32 {
        use devcomm_device::abi::gin::GinConnection;
        (match self {
            GinConnectionType::None => GinConnection::None,
            GinConnectionType::Full => GinConnection::Full,
            GinConnectionType::Rail => GinConnection::Rail,
        }) as u32
    }
}

/// What this host offers the GIN backends: the probe behind automatic
/// selection and behind the errors for forced backends. Made from the
/// system with [`GinProbe::of_this_host`]; tests build one by hand to
/// simulate other hosts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GinProbe {
    /// RDMA devices listed under `/sys/class/infiniband` (`mlx5_0`, ...).
    pub rdma_devices: Vec<String>,
    /// DOCA GPUNetIO's library (GDAKI's host side), where found.
    pub doca_gpunetio: Option<PathBuf>,
}

impl GinProbe {
    /// Where DOCA GPUNetIO's library is looked for.
    const DOCA_DIRS: [&'static str; 3] =
        ["/opt/mellanox/doca/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"];

    /// Probes this host.
    pub fn of_this_host() -> GinProbe {
        let mut rdma_devices: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        rdma_devices.sort();
        let doca_gpunetio = Self::DOCA_DIRS
            .iter()
            .flat_map(|dir| ["libdoca_gpunetio.so", "libdoca_gpunetio.so.2"].map(|l| Path::new(dir).join(l)))
            .find(|p| p.exists());
        GinProbe { rdma_devices, doca_gpunetio }
    }

    /// Why `t` cannot be used on this host by this build, or `None` when it can.
    pub fn unavailable_reason(&self, t: GinType) -> Option<String> {
        match t {
            GinType::None | GinType::Proxy => None,
            GinType::Gdaki => {
                let mlx5: Vec<&str> =
                    self.rdma_devices.iter().map(String::as_str).filter(|n| n.starts_with("mlx5")).collect();
                let host = match (mlx5.is_empty(), &self.doca_gpunetio) {
                    (true, _) => "this host has no mlx5 NIC either (none under /sys/class/infiniband)".to_string(),
                    (false, None) => {
                        format!("this host has {} but no DOCA GPUNetIO (libdoca_gpunetio) either", mlx5.join(", "))
                    }
                    (false, Some(doca)) => {
                        format!("this host has what it would need ({} and {})", mlx5.join(", "), doca.display())
                    }
                };
                Some(format!(
                    "devcomm does not implement GDAKI (GPU threads driving mlx5 NIC queues through DOCA \
                     GPUNetIO) yet, and {host}; the proxy backend (DEVCOMM_GIN_TYPE=proxy, the default) \
                     serves GIN on every host"
                ))
            }
            GinType::Gpi => Some(
                "GPI (GPU-Push Interface) is NCCL's experimental GIN type for NVIDIA Spectrum-X Ethernet \
                 networking (NCCL 2.30.6 and later, through the Spectrum-X network plugin); devcomm does not \
                 implement it: the proxy backend (DEVCOMM_GIN_TYPE=proxy, the default) serves GIN on every host"
                    .into(),
            ),
        }
    }

    /// What automatic selection picks: the best backend devcomm implements
    /// and this host supports (GDAKI, then GPI, then the proxy), so never one
    /// that cannot run.
    pub fn auto(&self) -> GinType {
        [GinType::Gdaki, GinType::Gpi]
            .into_iter()
            .find(|&t| t.is_implemented() && self.unavailable_reason(t).is_none())
            .unwrap_or(GinType::Proxy)
    }

    /// `t` if it can be used here, else [`Error::InvalidUsage`] saying why.
    pub fn check(&self, t: GinType) -> Result<GinType> {
        match self.unavailable_reason(t) {
            None => Ok(t),
            Some(r) => Err(Error::invalid_usage(format!("GIN backend {t} was asked for but cannot be used: {r}"))),
        }
    }
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

impl Communicator {
    /// The GIN backend device communicators of this communicator get with a
    /// full connection (`ncclCommQueryProperties`' `ginType`): the forced
    /// one (config, then `DEVCOMM_GIN_TYPE`), else [`GinProbe::auto`] —
    /// what will actually be used.
    ///
    /// Errors: [`Error::InvalidUsage`] when the forced backend cannot be used
    /// here, saying why.
    #[doc(alias = "ginType")]
    pub fn gin_type(&self) -> Result<GinType> {
        let probe = GinProbe::of_this_host();
        match forced(self)? {
            Some(t) => probe.check(t),
            None => Ok(probe.auto()),
        }
    }

    /// The GIN backend with a rail connection. The proxy serves both; a NIC
    /// backend would need one NIC per rail, which the same probe checks.
    #[doc(alias = "railedGinType")]
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
        let here = GinProbe::of_this_host();
        assert!(here.check(GinType::Proxy).is_ok());
        let e = here.check(GinType::Gpi).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(ref m) if m.contains("gpi") && m.contains("Spectrum-X") && m.contains("NCCL")),
            "{e}"
        );
        let e = here.check(GinType::Gdaki).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(ref m) if m.contains("does not implement GDAKI")), "{e}");
    }

    #[test]
    fn auto_never_picks_a_backend_devcomm_cannot_run() {
        let bare = GinProbe::default();
        // A DGX-class host: mlx5 NICs and DOCA GPUNetIO installed.
        let dgx = GinProbe {
            rdma_devices: vec!["mlx5_0".into(), "mlx5_1".into()],
            doca_gpunetio: Some("/opt/mellanox/doca/lib/x86_64-linux-gnu/libdoca_gpunetio.so".into()),
        };
        let nic_only = GinProbe { rdma_devices: vec!["mlx5_0".into()], doca_gpunetio: None };
        for probe in [&bare, &dgx, &nic_only] {
            let t = probe.auto();
            assert_eq!(t, GinType::Proxy, "{probe:?}");
            assert!(t.is_implemented() && probe.check(t).is_ok());
        }
        // Asked for explicitly, GDAKI still says it is not implemented, and what the host has.
        let m = dgx.check(GinType::Gdaki).unwrap_err().to_string();
        assert!(m.contains("does not implement GDAKI") && m.contains("mlx5_0, mlx5_1") && m.contains("libdoca"), "{m}");
        let m = nic_only.check(GinType::Gdaki).unwrap_err().to_string();
        assert!(m.contains("no DOCA GPUNetIO"), "{m}");
        let m = bare.check(GinType::Gdaki).unwrap_err().to_string();
        assert!(m.contains("no mlx5 NIC"), "{m}");
    }
}
