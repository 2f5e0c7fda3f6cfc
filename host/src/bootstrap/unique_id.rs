//! [`UniqueId`]: the address of a bootstrap root plus a random magic.

use super::root::Root;
use crate::error::{Error, Result};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

/// Size of [`UniqueId::to_bytes`]'s output, as NCCL's `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// Environment variable naming the address a new root binds
/// (`IP`, `IP:PORT`, `HOST` or `HOST:PORT`; default `127.0.0.1:0`).
pub const BOOTSTRAP_ADDR_ENV: &str = "DEVCOMM_BOOTSTRAP_ADDR";

const STRING_PREFIX: &str = "dcid1-";
const BYTES_TAG: [u8; 4] = *b"DCID";
const BYTES_VERSION: u8 = 1;

/// Identifies one communicator's bootstrap: the root's TCP address and a
/// random 128-bit magic that every rank must present.
///
/// Make one with [`UniqueId::new`] (which starts the root in this process, as
/// `ncclGetUniqueId` does), hand it to every rank — as a string
/// (`Display`/[`FromStr`], for environment variables and files) or as bytes
/// ([`UniqueId::to_bytes`]) — and call `Communicator::init_rank` everywhere.
///
/// ```
/// # fn main() -> devcomm::Result<()> {
/// use devcomm::bootstrap::UniqueId;
/// let id = UniqueId::new()?;
/// let text = id.to_string();
/// assert_eq!(text.parse::<UniqueId>()?, id);
/// assert_eq!(UniqueId::from_bytes(&id.to_bytes())?, id);
/// # Ok(()) }
/// ```
#[doc(alias = "ncclUniqueId")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    addr: SocketAddr,
    magic: u128,
}

impl UniqueId {
    /// Starts a bootstrap root in this process (a listener on an ephemeral
    /// port of [`BOOTSTRAP_ADDR_ENV`], default `127.0.0.1`) and returns its id.
    ///
    /// The root serves exactly one communicator's ranks and exits once they
    /// have all finalized or disconnected.
    pub fn new() -> Result<UniqueId> {
        let bind = default_bind_addr()?;
        Ok(*Root::spawn(bind, random_magic())?.id())
    }

    /// An id from its parts (the root must already be listening at `addr`).
    pub fn from_parts(addr: SocketAddr, magic: u128) -> UniqueId {
        UniqueId { addr, magic }
    }

    /// The root's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The magic ranks present to the root.
    pub fn magic(&self) -> u128 {
        self.magic
    }

    /// The id as [`UNIQUE_ID_BYTES`] bytes (tag, version, address, magic, zero padding).
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..4].copy_from_slice(&BYTES_TAG);
        b[4] = BYTES_VERSION;
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&ip.octets());
            }
        }
        b[6..8].copy_from_slice(&self.addr.port().to_be_bytes());
        b[24..40].copy_from_slice(&self.magic.to_le_bytes());
        b
    }

    /// Parses [`UniqueId::to_bytes`]'s output.
    ///
    /// Errors: [`Error::InvalidArgument`] when the bytes are not a unique id.
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        let bad = |why: &str| Error::invalid_argument(format!("malformed unique id bytes: {why}"));
        if b.len() != UNIQUE_ID_BYTES {
            return Err(bad(&format!("{} bytes, expected {UNIQUE_ID_BYTES}", b.len())));
        }
        if b[..4] != BYTES_TAG {
            return Err(bad("missing DCID tag"));
        }
        if b[4] != BYTES_VERSION {
            return Err(bad(&format!("version {}, expected {BYTES_VERSION}", b[4])));
        }
        if b[40..].iter().any(|&x| x != 0) {
            return Err(bad("non-zero padding"));
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let ip = match b[5] {
            4 => {
                if b[12..24].iter().any(|&x| x != 0) {
                    return Err(bad("non-zero padding after IPv4 address"));
                }
                IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11]))
            }
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[8..24]);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            f => return Err(bad(&format!("unknown address family {f}"))),
        };
        let mut m = [0u8; 16];
        m.copy_from_slice(&b[24..40]);
        UniqueId::checked(SocketAddr::new(ip, port), u128::from_le_bytes(m))
            .map_err(|e| e.context("malformed unique id bytes"))
    }

    fn checked(addr: SocketAddr, magic: u128) -> Result<UniqueId> {
        if addr.port() == 0 {
            return Err(Error::invalid_argument("port 0 is not a root address"));
        }
        if addr.ip().is_unspecified() {
            return Err(Error::invalid_argument(format!("{} is not an address to connect to", addr.ip())));
        }
        Ok(UniqueId { addr, magic })
    }
}

impl fmt::Display for UniqueId {
    /// `dcid1-<32 hex digits of magic>@<address:port>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{STRING_PREFIX}{:032x}@{}", self.magic, self.addr)
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({self})")
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// Parses `dcid1-<32 hex digits>@<address:port>` (surrounding whitespace ignored).
    ///
    /// Errors: [`Error::InvalidArgument`] naming what is wrong.
    fn from_str(s: &str) -> Result<UniqueId> {
        let t = s.trim();
        let bad = |why: String| {
            Error::invalid_argument(format!(
                "malformed unique id {t:?}: {why} (expected {STRING_PREFIX}<32 hex digits>@<ip>:<port>)"
            ))
        };
        let rest = t.strip_prefix(STRING_PREFIX).ok_or_else(|| bad(format!("missing {STRING_PREFIX:?} prefix")))?;
        let (hex, addr) = rest.split_once('@').ok_or_else(|| bad("missing '@'".into()))?;
        if hex.len() != 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad(format!("magic {hex:?} is not 32 hex digits")));
        }
        let magic = u128::from_str_radix(hex, 16).map_err(|e| bad(format!("magic: {e}")))?;
        let addr = SocketAddr::from_str(addr).map_err(|e| bad(format!("address {addr:?}: {e}")))?;
        UniqueId::checked(addr, magic).map_err(|e| bad(e.message().to_string()))
    }
}

pub(crate) fn random_magic() -> u128 {
    loop {
        let m: u128 = rand::random();
        if m != 0 {
            return m;
        }
    }
}

/// The address a new root binds: [`BOOTSTRAP_ADDR_ENV`] or `127.0.0.1:0`.
pub(crate) fn default_bind_addr() -> Result<SocketAddr> {
    match std::env::var(BOOTSTRAP_ADDR_ENV) {
        Ok(v) if !v.trim().is_empty() => {
            parse_host_port(v.trim(), 0).map_err(|e| e.context(format!("{BOOTSTRAP_ADDR_ENV}={v:?}")))
        }
        _ => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)),
    }
}

/// Resolves `IP`, `IP:PORT`, `[V6]:PORT`, `HOST` or `HOST:PORT` (`default_port` when none).
pub(crate) fn parse_host_port(s: &str, default_port: u16) -> Result<SocketAddr> {
    if let Ok(a) = SocketAddr::from_str(s) {
        return Ok(a);
    }
    if let Ok(ip) = IpAddr::from_str(s.trim_matches(|c| c == '[' || c == ']')) {
        return Ok(SocketAddr::new(ip, default_port));
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => {
            (h, p.parse::<u16>().map_err(|_| Error::invalid_argument(format!("bad port in {s:?}")))?)
        }
        _ => (s, default_port),
    };
    if host.is_empty() {
        return Err(Error::invalid_argument(format!("no host in {s:?}")));
    }
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::invalid_argument(format!("cannot resolve {host:?}: {e}")))?
        .collect::<Vec<_>>();
    // Prefer IPv4, which every rank can reach when the host has both.
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs.into_iter().next().ok_or_else(|| Error::invalid_argument(format!("{host:?} resolves to no address")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn string_roundtrip_and_format() {
        let id = UniqueId::from_parts("10.1.2.3:4567".parse().unwrap(), 0xabc);
        let s = id.to_string();
        assert_eq!(s, "dcid1-00000000000000000000000000000abc@10.1.2.3:4567");
        assert_eq!(s.parse::<UniqueId>().unwrap(), id);
        assert_eq!(format!("  {s}\n").parse::<UniqueId>().unwrap(), id);
        let v6 = UniqueId::from_parts("[::1]:80".parse().unwrap(), u128::MAX);
        assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
    }

    #[test]
    fn malformed_strings_are_invalid_argument() {
        for s in [
            "",
            "garbage",
            "dcid1-",
            "dcid1-abc@127.0.0.1:5",
            "dcid1-0000000000000000000000000000000g@127.0.0.1:5",
            "dcid1-+0000000000000000000000000000000@127.0.0.1:5",
            "dcid1-00000000000000000000000000000abc@127.0.0.1",
            "dcid1-00000000000000000000000000000abc@127.0.0.1:0",
            "dcid1-00000000000000000000000000000abc@0.0.0.0:5",
            "dcid1-00000000000000000000000000000abc127.0.0.1:5",
            "dcid2-00000000000000000000000000000abc@127.0.0.1:5",
        ] {
            match s.parse::<UniqueId>() {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("malformed unique id"), "{m}"),
                other => panic!("{s:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn malformed_bytes_are_invalid_argument() {
        let id = UniqueId::from_parts("127.0.0.1:9".parse().unwrap(), 5);
        let good = id.to_bytes();
        assert!(matches!(UniqueId::from_bytes(&good[..10]), Err(Error::InvalidArgument(_))));
        for i in [0usize, 4, 5, 13, 100] {
            let mut b = good;
            b[i] ^= 0x40;
            assert!(matches!(UniqueId::from_bytes(&b), Err(Error::InvalidArgument(_))), "byte {i}");
        }
    }

    #[test]
    fn new_starts_a_root() {
        let id = UniqueId::new().unwrap();
        assert!(id.addr().ip().is_loopback());
        assert_ne!(id.addr().port(), 0);
        std::net::TcpStream::connect(id.addr()).unwrap();
    }

    #[test]
    fn host_port_parsing() {
        assert_eq!(parse_host_port("1.2.3.4", 7).unwrap(), "1.2.3.4:7".parse().unwrap());
        assert_eq!(parse_host_port("1.2.3.4:9", 7).unwrap(), "1.2.3.4:9".parse().unwrap());
        assert_eq!(parse_host_port("::1", 7).unwrap(), "[::1]:7".parse().unwrap());
        assert_eq!(parse_host_port("localhost:9", 7).unwrap().port(), 9);
        assert!(parse_host_port("localhost:x", 7).is_err());
    }

    proptest! {
        #[test]
        fn roundtrips(a: [u8; 4], v6: [u8; 16], port in 1u16.., magic: u128, use_v6: bool) {
            let ip = if use_v6 { IpAddr::V6(Ipv6Addr::from(v6)) } else { IpAddr::V4(Ipv4Addr::from(a)) };
            prop_assume!(!ip.is_unspecified());
            let id = UniqueId::from_parts(SocketAddr::new(ip, port), magic);
            prop_assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
            prop_assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
        }

        #[test]
        fn parse_never_panics(s in ".{0,80}") {
            let _ = s.parse::<UniqueId>();
        }
    }
}
