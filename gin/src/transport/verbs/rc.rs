//! Reliable-connected queue pairs for users other than the GIN proxy:
//! devcomm's point-to-point engine (`devcomm::p2p`) opens one device per
//! endpoint and one RC queue pair per connection through this module.
//!
//! It is a thin, safe-where-possible layer over the same FFI as the GIN
//! transport ([`RcNic`] adds setup to [`Nic`]): open a device
//! ([`open`]: the device, protection domain and one completion queue),
//! register memory ([`RcNic::reg`] → [`MrKeys`]), create a queue pair and
//! connect it to a peer's [`QpRecord`] (exchanged by the caller, e.g. over
//! a TCP control socket), post RDMA WRITE / READ requests ([`PostWr`],
//! [`Nic::post`]) and poll completions ([`Nic::poll`]). What runs on top
//! (flow control, completion dispatch, failure handling) is the caller's.
//!
//! Without a device, [`open`] is a clean `Unavailable` naming what is
//! missing (the library, or a device, or an active port). The software
//! model of a NIC ([`super::model::ModelNic`]) implements [`RcNic`] too,
//! so that callers can be tested end to end without hardware. **No RDMA
//! device exists on the project's machines: this module was built and
//! tested against the model only** (see the parent module's docs).

use super::conninfo::QpEndpoint;
use super::{ffi, open_device, port_gid, rtr_to, rts_with, Dmabuf, VerbsConfig};
use crate::{GinHostError, GinResult};

pub use super::ffi::{Completion, MrKeys, PostWr, QpCaps};
pub use super::plan::WrOpcode;
pub use super::Nic;

/// Access: the NIC may write the region for local requests (a READ's destination).
pub const ACCESS_LOCAL_WRITE: i32 = ffi::IBV_ACCESS_LOCAL_WRITE;
/// Access: peers may RDMA WRITE into the region.
pub const ACCESS_REMOTE_WRITE: i32 = ffi::IBV_ACCESS_REMOTE_WRITE;
/// Access: peers may RDMA READ from the region.
pub const ACCESS_REMOTE_READ: i32 = ffi::IBV_ACCESS_REMOTE_READ;
/// Access flags of a queue pair that serves peers' RDMA WRITEs and READs.
const QP_ACCESS: i32 = ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_READ;

/// `IBV_WC_REM_ACCESS_ERR`: a remote key or range was refused.
pub const WC_REM_ACCESS_ERR: u32 = 10;
/// `IBV_WC_RETRY_EXC_ERR`: the peer did not answer (gone, or the path cut).
pub const WC_RETRY_EXC_ERR: u32 = 12;
/// `IBV_WC_WR_FLUSH_ERR`: flushed, the queue pair is in the error state.
pub const WC_WR_FLUSH_ERR: u32 = 5;

/// A port's address, as a peer's queue pair needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortAddr {
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID (RoCE; InfiniBand across subnets).
    pub gid: [u8; 16],
    /// Port number (from 1).
    pub port: u8,
    /// `IBV_LINK_LAYER_*` (1 InfiniBand, 2 Ethernet).
    pub link_layer: u8,
    /// Active MTU (`IBV_MTU_*`, 1..=5).
    pub mtu: u8,
}

/// What a peer needs to connect its queue pair to this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpRecord {
    /// The port.
    pub addr: PortAddr,
    /// The queue pair's number.
    pub qpn: u32,
    /// The first packet sequence number it sends with.
    pub psn: u32,
}

const RECORD_MAGIC: [u8; 8] = *b"DCRCQP\0\0";
const RECORD_VERSION: u32 = 1;

impl QpRecord {
    /// Bytes of an encoded record.
    pub const BYTES: usize = 48;

    /// The record as [`QpRecord::BYTES`] bytes (magic, version, fields; little-endian).
    pub fn encode(&self) -> [u8; QpRecord::BYTES] {
        let mut b = [0u8; QpRecord::BYTES];
        b[0..8].copy_from_slice(&RECORD_MAGIC);
        b[8..12].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.qpn.to_le_bytes());
        b[16..20].copy_from_slice(&self.psn.to_le_bytes());
        b[20..22].copy_from_slice(&self.addr.lid.to_le_bytes());
        b[22] = self.addr.port;
        b[23] = self.addr.link_layer;
        b[24] = self.addr.mtu;
        b[32..48].copy_from_slice(&self.addr.gid);
        b
    }

    /// Parses [`QpRecord::encode`]'s bytes; `Invalid` for anything else
    /// (another version included) or impossible values.
    pub fn decode(b: &[u8]) -> GinResult<QpRecord> {
        let bad = |m: String| Err(GinHostError::Invalid(format!("queue pair record: {m}")));
        if b.len() != QpRecord::BYTES || b[0..8] != RECORD_MAGIC {
            return bad(format!("not a record ({} bytes)", b.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let version = u32_at(8);
        if version != RECORD_VERSION {
            return bad(format!("version {version}, this build reads {RECORD_VERSION}"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let r = QpRecord {
            qpn: u32_at(12),
            psn: u32_at(16),
            addr: PortAddr { lid: u16::from_le_bytes([b[20], b[21]]), port: b[22], link_layer: b[23], mtu: b[24], gid },
        };
        if r.qpn > 0xff_ffff || r.psn > 0xff_ffff || !(1..=5).contains(&r.addr.mtu) || r.addr.port == 0 {
            return bad(format!("impossible values {r:?}"));
        }
        Ok(r)
    }
}

/// The device's limits as a queue-pair user needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest message of one work request.
    pub max_msg: u64,
    /// Send-queue depth per queue pair ([`VerbsConfig::send_queue_depth`], capped by the device).
    pub depth: u32,
    /// RDMA READs (and atomics) a queue pair may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// ... and serve as responder.
    pub max_dest_rd_atomic: u8,
}

/// A device that sets up queue pairs and registrations, besides executing
/// work requests ([`Nic`]): libibverbs ([`open`]) or the model NIC.
pub trait RcNic: Nic {
    /// This device's port address.
    fn port(&self) -> PortAddr;
    /// Its limits.
    fn limits(&self) -> DeviceLimits;
    /// Registers `len` bytes at `addr` with `access` (`ACCESS_*`): through
    /// `dmabuf` when given (`ibv_reg_dmabuf_mr`, iova = `addr`), else by
    /// address (`ibv_reg_mr`: host memory, or device memory with nvidia-peermem).
    ///
    /// # Safety
    /// The range stays allocated and mapped until [`RcNic::dereg`] (or the
    /// device is dropped): the NIC reads and writes it asynchronously. A
    /// dmabuf's fd is open during the call.
    unsafe fn reg(&mut self, addr: u64, len: u64, dmabuf: Option<Dmabuf>, access: i32) -> GinResult<MrKeys>;
    /// Deregisters a region (no request in flight may name it).
    fn dereg(&mut self, keys: MrKeys) -> GinResult<()>;
    /// Creates an RC queue pair (send side only) of at most `depth` requests.
    fn create_qp(&mut self, depth: u32) -> GinResult<(usize, QpCaps)>;
    /// Moves queue pair `qp` (sending from `local_psn`) through INIT, RTR
    /// and RTS toward the peer's queue pair `remote`.
    fn connect_qp(&mut self, qp: usize, local_psn: u32, remote: &QpRecord, config: &VerbsConfig) -> GinResult<()>;
    /// Destroys queue pair `qp`.
    fn destroy_qp(&mut self, qp: usize) -> GinResult<()>;
}

/// The first PSN of a queue pair: 24 pseudo-random bits.
pub fn random_psn(salt: usize) -> u32 {
    super::random_psn(salt, std::process::id() as usize)
}

/// libibverbs' device, with what [`RcNic`] reports.
struct HcaNic {
    hca: ffi::Hca,
    port: PortAddr,
    limits: DeviceLimits,
}

impl Nic for HcaNic {
    unsafe fn post(&mut self, qp: usize, wr: &PostWr) -> Result<(), i32> {
        // SAFETY: forwarded (same contract).
        unsafe { Nic::post(&mut self.hca, qp, wr) }
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> GinResult<usize> {
        self.hca.poll(out)
    }
    fn modify_error(&mut self, qp: usize) -> GinResult<()> {
        self.hca.modify_error(qp)
    }
    fn status_str(&self, status: u32) -> String {
        self.hca.verbs().status_str(status)
    }
    fn name(&self) -> &str {
        self.hca.name()
    }
}

impl RcNic for HcaNic {
    fn port(&self) -> PortAddr {
        self.port
    }
    fn limits(&self) -> DeviceLimits {
        self.limits
    }
    unsafe fn reg(&mut self, addr: u64, len: u64, dmabuf: Option<Dmabuf>, access: i32) -> GinResult<MrKeys> {
        match dmabuf {
            // SAFETY: the caller's contract.
            Some(d) => unsafe { self.hca.reg_dmabuf_mr(d.offset, len, addr, d.fd, access) },
            // SAFETY: the caller's contract.
            None => unsafe { self.hca.reg_mr(addr, len, access) },
        }
    }
    fn dereg(&mut self, keys: MrKeys) -> GinResult<()> {
        self.hca.dereg_mr(keys.lkey)
    }
    fn create_qp(&mut self, depth: u32) -> GinResult<(usize, QpCaps)> {
        self.hca.create_qp(depth.min(self.limits.depth), 0)
    }
    fn connect_qp(&mut self, qp: usize, local_psn: u32, remote: &QpRecord, config: &VerbsConfig) -> GinResult<()> {
        if (remote.addr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET)
            != (self.port.link_layer == ffi::IBV_LINK_LAYER_ETHERNET)
        {
            return Err(GinHostError::Invalid(
                "the peer's port and this one have different link layers (InfiniBand and RoCE cannot talk)".into(),
            ));
        }
        let dest = QpEndpoint { qpn: remote.qpn, psn: remote.psn };
        self.hca.modify_init(qp, self.port.port, QP_ACCESS)?;
        self.hca.modify_rtr(qp, &rtr_to(&self.port, &remote.addr, dest, config, self.limits.max_dest_rd_atomic))?;
        self.hca.modify_rts(qp, &rts_with(local_psn, config, self.limits.max_rd_atomic))
    }
    fn destroy_qp(&mut self, qp: usize) -> GinResult<()> {
        self.hca.destroy_qp(qp)
    }
}

/// Opens the device `config` names (or the first with an active port),
/// with a protection domain and one completion queue sized for `max_qps`
/// queue pairs of [`VerbsConfig::send_queue_depth`] requests.
///
/// Errors: `Unavailable` naming what is missing: libibverbs
/// ([`VerbsConfig::library`]), RDMA support in the kernel, a device, an
/// active port, a RoCE GID.
pub fn open(config: &VerbsConfig, max_qps: u32) -> GinResult<Box<dyn RcNic>> {
    config.validate()?;
    let verbs = ffi::Verbs::load(&config.library)?;
    let (mut hca, port) = open_device(&verbs, config)?;
    let caps = hca.query_device()?;
    let gid = port_gid(&hca, &port, config)?;
    let depth = config.send_queue_depth.min(caps.max_qp_wr.max(2));
    // After a failure every outstanding request completes (with an error),
    // signaled or not: the CQ holds every queue pair's depth.
    let cqe = (u64::from(depth) * u64::from(max_qps.max(1))).clamp(1, u64::from(caps.max_cqe.max(1))) as u32;
    hca.create_cq(cqe)?;
    let max_msg = if port.max_msg_sz == 0 { 1 << 30 } else { u64::from(port.max_msg_sz) };
    Ok(Box::new(HcaNic {
        port: PortAddr {
            lid: port.lid,
            gid,
            port: config.port,
            link_layer: port.link_layer,
            mtu: port.active_mtu.clamp(1, 5),
        },
        limits: DeviceLimits {
            max_msg,
            depth,
            max_rd_atomic: caps.max_qp_init_rd_atom.clamp(1, 16),
            max_dest_rd_atomic: caps.max_qp_rd_atom.clamp(1, 16),
        },
        hca,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let r = QpRecord {
            addr: PortAddr { lid: 7, gid: [3; 16], port: 1, link_layer: 2, mtu: 4 },
            qpn: 0x12_3456,
            psn: 0xab_cdef,
        };
        assert_eq!(QpRecord::decode(&r.encode()).unwrap(), r);
        assert!(QpRecord::decode(&r.encode()[..40]).is_err());
        let mut b = r.encode();
        b[8] = 2; // another version
        assert!(matches!(QpRecord::decode(&b), Err(GinHostError::Invalid(m)) if m.contains("version 2")));
        let mut b = r.encode();
        b[24] = 9; // no such MTU
        assert!(QpRecord::decode(&b).is_err());
    }

    #[test]
    fn opening_without_the_library_is_unavailable() {
        let c = VerbsConfig { library: "libdevcomm-no-such-ibverbs.so.1".into(), ..VerbsConfig::default() };
        match open(&c, 4) {
            Err(GinHostError::Unavailable(m)) => assert!(m.contains("libdevcomm-no-such-ibverbs.so.1"), "{m}"),
            r => panic!("{:?}", r.map(|n| n.name().to_string())),
        }
    }
}
