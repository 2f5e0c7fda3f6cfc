//! Connection information of the verbs transport, exchanged with
//! [`crate::Bootstrap::allgather`].
//!
//! Every rank sends one record, explicit little-endian bytes:
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `DCGINIBV` |
//! | 8 | 4 | version ([`VERSION`]) |
//! | 12 | 4 | status: 0 ready, 1 failed |
//!
//! A failed rank (no device, registration refused, ...) follows with the
//! message length (u32) and its UTF-8 text, so that every rank learns why
//! the collective connect fails instead of waiting for it. A ready rank
//! follows with:
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 16 | 4 | rank |
//! | 20 | 4 | nranks |
//! | 24 | 2 | LID |
//! | 26 | 1 | port number |
//! | 27 | 1 | link layer (0 unspecified, 1 InfiniBand, 2 Ethernet) |
//! | 28 | 1 | active MTU (`ibv_mtu`, 1..=5) |
//! | 29 | 1 | GID index |
//! | 30 | 2 | reserved, 0 |
//! | 32 | 16 | GID |
//! | 48 | 8 | signal array address |
//! | 56 | 4 | signal array rkey |
//! | 60 | 4 | signals |
//! | 64 | 8 | control words address (one u64 per rank) |
//! | 72 | 4 | control words rkey |
//! | 76 | 4 | windows |
//! | 80 | 8 × nranks | per peer: QP number (u32), first PSN (u32) of this rank's QP to that peer |
//! | ... | 24 × windows | per window: id (u32), rkey (u32), address (u64), length (u64) |
//!
//! [`decode`] checks all of it: magic, version, exact length, ranges (24-bit
//! QP numbers and PSNs, MTU, link layer), 8-byte alignment of the atomic
//! targets, address ranges that do not wrap, distinct window ids. Anything
//! else is [`GinHostError::Invalid`].

use super::plan::{RemotePeer, RemoteWindow};
use crate::{GinHostError, GinResult};

/// First 8 bytes of every record.
pub const MAGIC: [u8; 8] = *b"DCGINIBV";
/// Version of the record layout.
pub const VERSION: u32 = 1;
/// Most ranks a record may describe.
pub const MAX_RANKS: u32 = 1 << 20;
/// Most windows a record may describe.
pub const MAX_WINDOWS: u32 = 1 << 16;
/// Longest failure message.
pub const MAX_MESSAGE: u32 = 4096;

const STATUS_READY: u32 = 0;
const STATUS_FAILED: u32 = 1;
const HEADER: usize = 80;
const QP_BYTES: usize = 8;
const WINDOW_BYTES: usize = 24;

/// The queue pair a rank created for one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpEndpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number it sends (24 bits).
    pub psn: u32,
}

/// A registered window, as advertised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowInfo {
    /// Window id.
    pub id: u32,
    /// Remote key.
    pub rkey: u32,
    /// Address peers write to (the registration's iova).
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// What one rank tells the others to connect to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnInfo {
    /// Its rank.
    pub rank: u32,
    /// Ranks of the communicator.
    pub nranks: u32,
    /// LID of its port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port number.
    pub port: u8,
    /// Link layer (`IBV_LINK_LAYER_*`: 0 unspecified, 1 InfiniBand, 2 Ethernet).
    pub link_layer: u8,
    /// Active MTU (`ibv_mtu`: 1 = 256 bytes ... 5 = 4096 bytes).
    pub mtu: u8,
    /// GID index it uses.
    pub gid_index: u8,
    /// Its GID.
    pub gid: [u8; 16],
    /// Address of its signal array.
    pub signals_addr: u64,
    /// Remote key of the signal array.
    pub signals_rkey: u32,
    /// Signals in the array.
    pub total_signals: u32,
    /// Address of its control words (`nranks` u64s; peer `r` writes word `r`).
    pub control_addr: u64,
    /// Remote key of the control words.
    pub control_rkey: u32,
    /// Its queue pair to each rank (`nranks` entries, its own loopback one included).
    pub qps: Vec<QpEndpoint>,
    /// Its registered windows.
    pub windows: Vec<WindowInfo>,
}

impl ConnInfo {
    /// Its port's address.
    pub fn port_addr(&self) -> super::rc::PortAddr {
        super::rc::PortAddr {
            lid: self.lid,
            gid: self.gid,
            port: self.port,
            link_layer: self.link_layer,
            mtu: self.mtu,
        }
    }

    /// The peer as the planning layer sees it.
    pub fn remote_peer(&self) -> RemotePeer {
        RemotePeer {
            rank: self.rank as usize,
            windows: self
                .windows
                .iter()
                .map(|w| (w.id, RemoteWindow { addr: w.addr, len: w.len, rkey: w.rkey }))
                .collect(),
            signals_addr: self.signals_addr,
            signals_rkey: self.signals_rkey,
            total_signals: self.total_signals,
        }
    }
}

/// One rank's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnRecord {
    /// Ready to connect.
    Ready(ConnInfo),
    /// This rank could not set up its side; the message says why.
    Failed(String),
}

/// Encodes `r` (see the module docs for the layout). A failure message is
/// cut to [`MAX_MESSAGE`] bytes (at a character boundary).
pub fn encode(r: &ConnRecord) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    match r {
        ConnRecord::Failed(msg) => {
            let mut end = msg.len().min(MAX_MESSAGE as usize);
            while !msg.is_char_boundary(end) {
                end -= 1;
            }
            b.extend_from_slice(&STATUS_FAILED.to_le_bytes());
            b.extend_from_slice(&(end as u32).to_le_bytes());
            b.extend_from_slice(&msg.as_bytes()[..end]);
        }
        ConnRecord::Ready(c) => {
            b.extend_from_slice(&STATUS_READY.to_le_bytes());
            b.extend_from_slice(&c.rank.to_le_bytes());
            b.extend_from_slice(&c.nranks.to_le_bytes());
            b.extend_from_slice(&c.lid.to_le_bytes());
            b.extend_from_slice(&[c.port, c.link_layer, c.mtu, c.gid_index]);
            b.extend_from_slice(&0u16.to_le_bytes());
            b.extend_from_slice(&c.gid);
            b.extend_from_slice(&c.signals_addr.to_le_bytes());
            b.extend_from_slice(&c.signals_rkey.to_le_bytes());
            b.extend_from_slice(&c.total_signals.to_le_bytes());
            b.extend_from_slice(&c.control_addr.to_le_bytes());
            b.extend_from_slice(&c.control_rkey.to_le_bytes());
            b.extend_from_slice(&(c.windows.len() as u32).to_le_bytes());
            debug_assert_eq!(b.len(), HEADER);
            for q in &c.qps {
                b.extend_from_slice(&q.qpn.to_le_bytes());
                b.extend_from_slice(&q.psn.to_le_bytes());
            }
            for w in &c.windows {
                b.extend_from_slice(&w.id.to_le_bytes());
                b.extend_from_slice(&w.rkey.to_le_bytes());
                b.extend_from_slice(&w.addr.to_le_bytes());
                b.extend_from_slice(&w.len.to_le_bytes());
            }
        }
    }
    b
}

/// Little-endian reader over a record.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> GinResult<[u8; N]> {
        let s = self.at.checked_add(N).and_then(|end| self.b.get(self.at..end)).ok_or_else(|| {
            GinHostError::Invalid(format!("verbs connection record truncated at byte {} of {}", self.at, self.b.len()))
        })?;
        self.at += N;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> GinResult<u8> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> GinResult<u16> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> GinResult<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> GinResult<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

fn bad<T>(what: String) -> GinResult<T> {
    Err(GinHostError::Invalid(format!("bad verbs connection record: {what}")))
}

/// Decodes and validates a record (see the module docs).
pub fn decode(b: &[u8]) -> GinResult<ConnRecord> {
    let mut r = Reader { b, at: 0 };
    if r.take::<8>()? != MAGIC {
        return bad("wrong magic (not a devcomm verbs record)".into());
    }
    let version = r.u32()?;
    if version != VERSION {
        return bad(format!("version {version}, this build speaks {VERSION}"));
    }
    let record = match r.u32()? {
        STATUS_FAILED => {
            let n = r.u32()?;
            if n > MAX_MESSAGE {
                return bad(format!("failure message of {n} bytes"));
            }
            let text = r.b.get(r.at..).unwrap_or_default();
            if text.len() != n as usize {
                return bad(format!("failure message of {} bytes, {n} announced", text.len()));
            }
            r.at += text.len();
            match std::str::from_utf8(text) {
                Ok(s) => ConnRecord::Failed(s.to_owned()),
                Err(_) => return bad("failure message is not UTF-8".into()),
            }
        }
        STATUS_READY => ConnRecord::Ready(decode_ready(&mut r)?),
        s => return bad(format!("status {s}")),
    };
    if r.at != b.len() {
        return bad(format!("{} bytes past the end", b.len() - r.at));
    }
    Ok(record)
}

fn decode_ready(r: &mut Reader<'_>) -> GinResult<ConnInfo> {
    let rank = r.u32()?;
    let nranks = r.u32()?;
    if nranks == 0 || nranks > MAX_RANKS || rank >= nranks {
        return bad(format!("rank {rank} of {nranks}"));
    }
    let lid = r.u16()?;
    let (port, link_layer, mtu, gid_index) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?);
    if port == 0 {
        return bad("port 0".into());
    }
    if link_layer > 2 {
        return bad(format!("link layer {link_layer}"));
    }
    if !(1..=5).contains(&mtu) {
        return bad(format!("MTU code {mtu}"));
    }
    if r.u16()? != 0 {
        return bad("reserved bytes are not zero".into());
    }
    let gid = r.take::<16>()?;
    let signals_addr = r.u64()?;
    let signals_rkey = r.u32()?;
    let total_signals = r.u32()?;
    if signals_addr % 8 != 0 || signals_addr.checked_add(8 * total_signals as u64).is_none() {
        return bad(format!("signal array at {signals_addr:#x} ({total_signals} signals)"));
    }
    let control_addr = r.u64()?;
    let control_rkey = r.u32()?;
    if control_addr % 8 != 0 || control_addr.checked_add(8 * nranks as u64).is_none() {
        return bad(format!("control words at {control_addr:#x}"));
    }
    let nwindows = r.u32()?;
    if nwindows > MAX_WINDOWS {
        return bad(format!("{nwindows} windows"));
    }
    let expect = HEADER + nranks as usize * QP_BYTES + nwindows as usize * WINDOW_BYTES;
    if r.b.len() != expect {
        return bad(format!("{} bytes for {nranks} ranks and {nwindows} windows ({expect} expected)", r.b.len()));
    }
    let mut qps = Vec::with_capacity(nranks as usize);
    for peer in 0..nranks {
        let (qpn, psn) = (r.u32()?, r.u32()?);
        if qpn >= 1 << 24 || psn >= 1 << 24 {
            return bad(format!("QP number {qpn:#x} / PSN {psn:#x} for rank {peer} exceeds 24 bits"));
        }
        qps.push(QpEndpoint { qpn, psn });
    }
    let mut windows: Vec<WindowInfo> = Vec::with_capacity(nwindows as usize);
    for _ in 0..nwindows {
        let w = WindowInfo { id: r.u32()?, rkey: r.u32()?, addr: r.u64()?, len: r.u64()? };
        if w.addr.checked_add(w.len).is_none() {
            return bad(format!("window {} at {:#x} of {} bytes wraps", w.id, w.addr, w.len));
        }
        if windows.iter().any(|o| o.id == w.id) {
            return bad(format!("window {} twice", w.id));
        }
        windows.push(w);
    }
    Ok(ConnInfo {
        rank,
        nranks,
        lid,
        port,
        link_layer,
        mtu,
        gid_index,
        gid,
        signals_addr,
        signals_rkey,
        total_signals,
        control_addr,
        control_rkey,
        qps,
        windows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn info() -> impl Strategy<Value = ConnInfo> {
        (1u32..9)
            .prop_flat_map(|nranks| {
                (
                    (0..nranks, Just(nranks), any::<u16>(), 1u8..=2, 0u8..=2, 1u8..=5, any::<u8>(), any::<[u8; 16]>()),
                    (
                        (0..1u64 << 60).prop_map(|a| a & !7),
                        any::<u32>(),
                        0u32..1 << 20,
                        (0..1u64 << 60).prop_map(|a| a & !7),
                        any::<u32>(),
                    ),
                    proptest::collection::vec((0u32..1 << 24, 0u32..1 << 24), nranks as usize),
                    proptest::collection::btree_map(any::<u32>(), (any::<u32>(), 0..1u64 << 62, 0..1u64 << 40), 0..5),
                )
            })
            .prop_map(
                |(
                    (rank, nranks, lid, port, link_layer, mtu, gid_index, gid),
                    (signals_addr, signals_rkey, total_signals, control_addr, control_rkey),
                    qps,
                    wins,
                )| ConnInfo {
                    rank,
                    nranks,
                    lid,
                    port,
                    link_layer,
                    mtu,
                    gid_index,
                    gid,
                    signals_addr,
                    signals_rkey,
                    total_signals,
                    control_addr,
                    control_rkey,
                    qps: qps.into_iter().map(|(qpn, psn)| QpEndpoint { qpn, psn }).collect(),
                    windows: wins
                        .into_iter()
                        .map(|(id, (rkey, addr, len))| WindowInfo { id, rkey, addr, len })
                        .collect(),
                },
            )
    }

    fn sample() -> ConnInfo {
        ConnInfo {
            rank: 1,
            nranks: 2,
            lid: 7,
            port: 1,
            link_layer: 1,
            mtu: 5,
            gid_index: 0,
            gid: [0xfe; 16],
            signals_addr: 0x1000,
            signals_rkey: 11,
            total_signals: 4,
            control_addr: 0x2000,
            control_rkey: 12,
            qps: vec![QpEndpoint { qpn: 0x11, psn: 0x22 }, QpEndpoint { qpn: 0x33, psn: 0x44 }],
            windows: vec![WindowInfo { id: 3, rkey: 13, addr: 0x7000_0000, len: 1 << 20 }],
        }
    }

    #[test]
    fn layout_is_little_endian_and_fixed() {
        let b = encode(&ConnRecord::Ready(sample()));
        assert_eq!(b.len(), HEADER + 2 * QP_BYTES + WINDOW_BYTES);
        assert_eq!(&b[0..8], b"DCGINIBV");
        assert_eq!(&b[8..12], &[1, 0, 0, 0]);
        assert_eq!(&b[12..16], &[0, 0, 0, 0]);
        assert_eq!(&b[16..20], &[1, 0, 0, 0]);
        assert_eq!(&b[20..24], &[2, 0, 0, 0]);
        assert_eq!(&b[24..26], &[7, 0]);
        assert_eq!(&b[26..30], &[1, 1, 5, 0]);
        assert_eq!(&b[48..56], &0x1000u64.to_le_bytes());
        assert_eq!(&b[80..84], &[0x11, 0, 0, 0]);
        assert_eq!(&b[96..100], &[3, 0, 0, 0]);
        assert_eq!(decode(&b).unwrap(), ConnRecord::Ready(sample()));
        let p = sample().remote_peer();
        assert_eq!(p.rank, 1);
        assert_eq!(p.windows[&3], RemoteWindow { addr: 0x7000_0000, len: 1 << 20, rkey: 13 });
        assert_eq!((p.signals_addr, p.signals_rkey, p.total_signals), (0x1000, 11, 4));
    }

    #[test]
    fn failure_records() {
        let r = ConnRecord::Failed("no RDMA device — none".into());
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        // Long messages are cut at a character boundary and still decode.
        let long = "é".repeat(3000);
        match decode(&encode(&ConnRecord::Failed(long))).unwrap() {
            ConnRecord::Failed(m) => assert!(m.len() <= MAX_MESSAGE as usize && m.chars().all(|c| c == 'é')),
            r => panic!("{r:?}"),
        }
        let mut b = encode(&ConnRecord::Failed("abc".into()));
        b[16] = 0xff; // not UTF-8
        assert!(decode(&b).is_err());
    }

    #[test]
    fn rejects_garbage() {
        let good = encode(&ConnRecord::Ready(sample()));
        type Corrupt = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(&str, Corrupt)> = vec![
            ("empty", Box::new(|b| b.clear())),
            ("magic", Box::new(|b| b[0] ^= 1)),
            ("version", Box::new(|b| b[8] = 2)),
            ("status", Box::new(|b| b[12] = 2)),
            ("rank >= nranks", Box::new(|b| b[16] = 2)),
            ("nranks 0", Box::new(|b| b[20] = 0)),
            ("port 0", Box::new(|b| b[26] = 0)),
            ("link layer", Box::new(|b| b[27] = 3)),
            ("mtu 0", Box::new(|b| b[28] = 0)),
            ("mtu 6", Box::new(|b| b[28] = 6)),
            ("reserved", Box::new(|b| b[30] = 1)),
            ("signals unaligned", Box::new(|b| b[48] |= 4)),
            ("signals wrap", Box::new(|b| b[48..56].copy_from_slice(&(u64::MAX - 7).to_le_bytes()))),
            ("control unaligned", Box::new(|b| b[64] |= 1)),
            ("qpn > 24 bits", Box::new(|b| b[83] = 1)),
            ("psn > 24 bits", Box::new(|b| b[87] = 1)),
            ("window wraps", Box::new(|b| b[104..112].copy_from_slice(&u64::MAX.to_le_bytes()))),
            ("too many windows", Box::new(|b| b[76] = 2)),
            ("trailing byte", Box::new(|b| b.push(0))),
            ("truncated", Box::new(|b| b.truncate(b.len() - 1))),
            ("header only", Box::new(|b| b.truncate(HEADER))),
        ];
        for (what, f) in cases {
            let mut b = good.clone();
            f(&mut b);
            assert!(matches!(decode(&b), Err(GinHostError::Invalid(_))), "{what} accepted");
        }
        // Duplicate window ids.
        let mut c = sample();
        c.windows.push(c.windows[0]);
        assert!(decode(&encode(&ConnRecord::Ready(c))).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(c in info()) {
            let r = ConnRecord::Ready(c);
            prop_assert_eq!(decode(&encode(&r)), Ok(r));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Err(e) = decode(&b) {
                prop_assert!(matches!(e, GinHostError::Invalid(_)));
            }
        }

        #[test]
        fn corrupted_records_never_panic(c in info(), at in any::<prop::sample::Index>(), v in any::<u8>(), cut in any::<bool>()) {
            let mut b = encode(&ConnRecord::Ready(c));
            let i = at.index(b.len());
            if cut {
                b.truncate(i);
                prop_assert!(decode(&b).is_err());
            } else {
                b[i] = v;
                match decode(&b) {
                    Ok(ConnRecord::Ready(d)) => prop_assert_eq!(encode(&ConnRecord::Ready(d)), b),
                    Ok(ConnRecord::Failed(_)) => prop_assert!(false, "a ready record decoded as failed"),
                    Err(e) => prop_assert!(matches!(e, GinHostError::Invalid(_))),
                }
            }
        }
    }
}
