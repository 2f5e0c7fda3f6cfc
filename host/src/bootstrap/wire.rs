//! The bootstrap wire format: length-prefixed frames with a magic/version
//! header, and the messages they carry.
//!
//! A frame is a 12-byte header — `b"DVCM"`, protocol version (`u16` LE),
//! message kind (`u16` LE), payload length (`u32` LE) — followed by the
//! payload. Payloads larger than [`MAX_FRAME_LEN`] are refused before any
//! allocation, and decoding never trusts a length it has not checked against
//! the bytes actually present, so garbage on the socket is an error, never a
//! panic or a huge allocation.

use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};

/// The four bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 4] = *b"DVCM";
/// Version of the bootstrap protocol; peers with another version are refused.
pub const PROTOCOL_VERSION: u16 = 1;
/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 12;
/// The largest payload a frame may carry (64 MiB).
pub const MAX_FRAME_LEN: usize = 64 << 20;

/// Which collective a [`Msg::Coll`] contribution belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollOp {
    /// Everybody receives everybody's bytes.
    Allgather,
    /// Everybody receives the bytes of rank `root`.
    Broadcast {
        /// The rank whose bytes are delivered.
        root: u32,
    },
}

/// How the root refuses a rank's `Hello`; mapped onto an [`Error`] variant on the rank side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectCode {
    /// The rank's arguments do not fit this root's job ([`Error::InvalidArgument`]).
    InvalidArgument = 1,
    /// The rank is used twice, or a message came in the wrong state ([`Error::InvalidUsage`]).
    InvalidUsage = 2,
    /// The job already failed ([`Error::RemoteError`]).
    Remote = 3,
}

impl RejectCode {
    fn from_u8(v: u8) -> RejectCode {
        match v {
            1 => RejectCode::InvalidArgument,
            2 => RejectCode::InvalidUsage,
            _ => RejectCode::Remote,
        }
    }

    /// The error a rank returns for this rejection.
    pub fn to_error(self, msg: &str) -> Error {
        let msg = format!("bootstrap root refused this rank: {msg}");
        match self {
            RejectCode::InvalidArgument => Error::InvalidArgument(msg),
            RejectCode::InvalidUsage => Error::InvalidUsage(msg),
            RejectCode::Remote => Error::RemoteError(msg),
        }
    }
}

/// A bootstrap message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Rank → root: the first message on a connection.
    Hello {
        /// The unique id's magic, proving the rank belongs to this root's job.
        magic: u128,
        /// The job's size as the rank sees it.
        nranks: u32,
        /// The rank's index.
        rank: u32,
        /// The rank's process id (the root answers its own process last).
        pid: u32,
        /// Opaque rank information, gathered and handed to every rank.
        info: Vec<u8>,
    },
    /// Root → rank: the `Hello` was refused; the connection closes.
    Reject {
        /// Which kind of error.
        code: RejectCode,
        /// What was wrong.
        msg: String,
    },
    /// Root → rank: every rank has joined; their infos, by rank.
    Ready {
        /// `infos[r]` is rank r's `Hello::info`.
        infos: Vec<Vec<u8>>,
    },
    /// Rank → root: a contribution to collective number `seq`.
    Coll {
        /// Sequence number of the collective on this communicator.
        seq: u64,
        /// Which collective.
        op: CollOp,
        /// The contribution.
        data: Vec<u8>,
    },
    /// Root → rank: collective `seq` completed.
    CollResult {
        /// Sequence number.
        seq: u64,
        /// All contributions (allgather) or the root's alone (broadcast).
        data: Vec<Vec<u8>>,
    },
    /// Root → rank: collective `seq` cannot complete (ranks disagree, or too large).
    CollError {
        /// Sequence number.
        seq: u64,
        /// Why.
        msg: String,
    },
    /// Rank → root: this rank aborts.
    Abort {
        /// Why.
        reason: String,
    },
    /// Root → rank: rank `rank` aborted.
    PeerAborted {
        /// The rank that aborted.
        rank: u32,
        /// Its reason.
        reason: String,
    },
    /// Root → rank: rank `rank`'s connection dropped before it finalized.
    PeerFailed {
        /// The rank that failed.
        rank: u32,
        /// What the root saw.
        reason: String,
    },
    /// Rank → root: this rank finalizes.
    Finalize,
    /// Root → rank: every rank finalized.
    FinalizeDone,
}

impl Msg {
    fn kind(&self) -> u16 {
        match self {
            Msg::Hello { .. } => 1,
            Msg::Reject { .. } => 2,
            Msg::Ready { .. } => 3,
            Msg::Coll { .. } => 4,
            Msg::CollResult { .. } => 5,
            Msg::CollError { .. } => 6,
            Msg::Abort { .. } => 7,
            Msg::PeerAborted { .. } => 8,
            Msg::PeerFailed { .. } => 9,
            Msg::Finalize => 10,
            Msg::FinalizeDone => 11,
        }
    }

    /// Encodes the message as one complete frame (header + payload).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut w = Writer { buf: vec![0u8; HEADER_LEN] };
        match self {
            Msg::Hello { magic, nranks, rank, pid, info } => {
                w.u128(*magic);
                w.u32(*nranks);
                w.u32(*rank);
                w.u32(*pid);
                w.bytes(info)?;
            }
            Msg::Reject { code, msg } => {
                w.u8(*code as u8);
                w.bytes(msg.as_bytes())?;
            }
            Msg::Ready { infos } => w.list(infos)?,
            Msg::Coll { seq, op, data } => {
                w.u64(*seq);
                match op {
                    CollOp::Allgather => {
                        w.u8(0);
                        w.u32(0);
                    }
                    CollOp::Broadcast { root } => {
                        w.u8(1);
                        w.u32(*root);
                    }
                }
                w.bytes(data)?;
            }
            Msg::CollResult { seq, data } => {
                w.u64(*seq);
                w.list(data)?;
            }
            Msg::CollError { seq, msg } => {
                w.u64(*seq);
                w.bytes(msg.as_bytes())?;
            }
            Msg::Abort { reason } => w.bytes(reason.as_bytes())?,
            Msg::PeerAborted { rank, reason } | Msg::PeerFailed { rank, reason } => {
                w.u32(*rank);
                w.bytes(reason.as_bytes())?;
            }
            Msg::Finalize | Msg::FinalizeDone => {}
        }
        let len = w.buf.len() - HEADER_LEN;
        if len > MAX_FRAME_LEN {
            return Err(Error::invalid_argument(format!(
                "bootstrap message of {len} bytes exceeds the {MAX_FRAME_LEN}-byte frame limit"
            )));
        }
        let header = encode_header(self.kind(), len as u32);
        w.buf[..HEADER_LEN].copy_from_slice(&header);
        Ok(w.buf)
    }

    /// Decodes a payload of message kind `kind`.
    ///
    /// Errors: [`Error::RemoteError`] when the payload is malformed (unknown
    /// kind, truncated, trailing bytes, lengths that do not fit).
    pub fn decode(kind: u16, payload: &[u8]) -> Result<Msg> {
        let mut r = Reader { buf: payload };
        let msg = match kind {
            1 => Msg::Hello { magic: r.u128()?, nranks: r.u32()?, rank: r.u32()?, pid: r.u32()?, info: r.bytes()? },
            2 => Msg::Reject { code: RejectCode::from_u8(r.u8()?), msg: r.string()? },
            3 => Msg::Ready { infos: r.list()? },
            4 => {
                let seq = r.u64()?;
                let tag = r.u8()?;
                let root = r.u32()?;
                let op = match tag {
                    0 => CollOp::Allgather,
                    1 => CollOp::Broadcast { root },
                    t => return Err(malformed(format!("unknown collective tag {t}"))),
                };
                Msg::Coll { seq, op, data: r.bytes()? }
            }
            5 => Msg::CollResult { seq: r.u64()?, data: r.list()? },
            6 => Msg::CollError { seq: r.u64()?, msg: r.string()? },
            7 => Msg::Abort { reason: r.string()? },
            8 => Msg::PeerAborted { rank: r.u32()?, reason: r.string()? },
            9 => Msg::PeerFailed { rank: r.u32()?, reason: r.string()? },
            10 => Msg::Finalize,
            11 => Msg::FinalizeDone,
            k => return Err(malformed(format!("unknown message kind {k}"))),
        };
        if !r.buf.is_empty() {
            return Err(malformed(format!("{} trailing bytes after message kind {kind}", r.buf.len())));
        }
        Ok(msg)
    }
}

fn malformed(what: impl std::fmt::Display) -> Error {
    Error::remote(format!("malformed bootstrap frame: {what}"))
}

/// Encodes a frame header.
pub fn encode_header(kind: u16, len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&FRAME_MAGIC);
    h[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&kind.to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h
}

/// Checks a frame header; returns `(kind, payload length)`.
///
/// Errors: [`Error::RemoteError`] for a wrong magic, another protocol version,
/// or a length over [`MAX_FRAME_LEN`].
pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<(u16, usize)> {
    if h[..4] != FRAME_MAGIC {
        return Err(malformed("bad frame magic (not a devcomm bootstrap peer)"));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != PROTOCOL_VERSION {
        return Err(malformed(format!("protocol version {version}, this build speaks {PROTOCOL_VERSION}")));
    }
    let kind = u16::from_le_bytes([h[6], h[7]]);
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
    if len > MAX_FRAME_LEN {
        return Err(malformed(format!("frame of {len} bytes exceeds the {MAX_FRAME_LEN}-byte limit")));
    }
    Ok((kind, len))
}

/// Maps an I/O error of a bootstrap socket onto an [`Error`]: timeouts become
/// [`Error::Timeout`], everything else [`Error::RemoteError`] (the peer is gone).
pub fn io_error(what: &str, e: std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Timeout(format!("{what}: {e}")),
        _ => Error::remote(format!("{what}: {e}")),
    }
}

/// Reads one frame. `Ok(None)` is a clean end of stream at a frame boundary.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Msg>> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(Error::remote("bootstrap connection closed in the middle of a frame")),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error("reading a bootstrap frame", e)),
        }
    }
    let (kind, len) = decode_header(&h)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            Error::remote("bootstrap connection closed in the middle of a frame")
        } else {
            io_error("reading a bootstrap frame", e)
        }
    })?;
    Msg::decode(kind, &payload).map(Some)
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, msg: &Msg) -> Result<()> {
    let buf = msg.encode()?;
    w.write_all(&buf).map_err(|e| io_error("writing a bootstrap frame", e))?;
    w.flush().map_err(|e| io_error("writing a bootstrap frame", e))
}

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u128(&mut self, v: u128) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) -> Result<()> {
        let n = u32::try_from(n)
            .ok()
            .filter(|&n| n as usize <= MAX_FRAME_LEN)
            .ok_or_else(|| Error::invalid_argument(format!("bootstrap field of {n} bytes is too large")))?;
        self.u32(n);
        Ok(())
    }
    fn bytes(&mut self, b: &[u8]) -> Result<()> {
        self.len(b.len())?;
        self.buf.extend_from_slice(b);
        Ok(())
    }
    fn list(&mut self, items: &[Vec<u8>]) -> Result<()> {
        self.len(items.len())?;
        for i in items {
            self.bytes(i)?;
        }
        Ok(())
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.buf.len() < n {
            return Err(malformed(format!("needs {n} more bytes, {} left", self.buf.len())));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_le_bytes(self.array()?))
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| malformed("string is not UTF-8"))
    }
    fn list(&mut self) -> Result<Vec<Vec<u8>>> {
        let n = self.u32()? as usize;
        // Every item takes at least its 4-byte length: bound the allocation by what is present.
        if n > self.buf.len() / 4 {
            return Err(malformed(format!("list of {n} items in {} bytes", self.buf.len())));
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.bytes()?);
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(m: &Msg) -> Msg {
        let buf = m.encode().unwrap();
        read_frame(&mut &buf[..]).unwrap().unwrap()
    }

    #[test]
    fn every_message_roundtrips() {
        let msgs = vec![
            Msg::Hello { magic: u128::MAX - 7, nranks: 8, rank: 3, pid: 4242, info: b"info".to_vec() },
            Msg::Reject { code: RejectCode::InvalidUsage, msg: "dup".into() },
            Msg::Ready { infos: vec![vec![], vec![1, 2, 3]] },
            Msg::Coll { seq: 9, op: CollOp::Allgather, data: vec![7; 100] },
            Msg::Coll { seq: 10, op: CollOp::Broadcast { root: 2 }, data: vec![] },
            Msg::CollResult { seq: 11, data: vec![vec![1], vec![]] },
            Msg::CollError { seq: 12, msg: "mismatch".into() },
            Msg::Abort { reason: "bye".into() },
            Msg::PeerAborted { rank: 1, reason: "bye".into() },
            Msg::PeerFailed { rank: 2, reason: "eof".into() },
            Msg::Finalize,
            Msg::FinalizeDone,
        ];
        for m in &msgs {
            assert_eq!(&roundtrip(m), m);
        }
    }

    #[test]
    fn clean_eof_and_truncation() {
        assert_eq!(read_frame(&mut &[][..]).unwrap(), None);
        let buf = Msg::Abort { reason: "x".into() }.encode().unwrap();
        for cut in 1..buf.len() {
            let e = read_frame(&mut &buf[..cut]).unwrap_err();
            assert!(matches!(e, Error::RemoteError(_)), "{e}");
        }
    }

    #[test]
    fn bad_headers_are_rejected() {
        let mut h = encode_header(1, 0);
        h[0] = b'X';
        assert!(matches!(decode_header(&h), Err(Error::RemoteError(_))));
        let mut h = encode_header(1, 0);
        h[4] = 99;
        assert!(decode_header(&h).unwrap_err().message().contains("version"));
        let h = encode_header(1, (MAX_FRAME_LEN + 1) as u32);
        assert!(decode_header(&h).unwrap_err().message().contains("limit"));
        assert!(Msg::decode(77, &[]).is_err());
        assert!(Msg::decode(10, &[1]).unwrap_err().message().contains("trailing"));
    }

    #[test]
    fn huge_list_count_does_not_allocate() {
        let mut p = Vec::new();
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Msg::decode(3, &p).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(kind in 0u16..16, payload in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Msg::decode(kind, &payload);
        }

        #[test]
        fn read_frame_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read_frame(&mut &bytes[..]);
        }

        #[test]
        fn coll_roundtrips(seq: u64, root: u32, data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let m = Msg::Coll { seq, op: CollOp::Broadcast { root }, data };
            prop_assert_eq!(roundtrip(&m), m);
        }

        #[test]
        fn ready_roundtrips(infos in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..32), 0..16)) {
            let m = Msg::Ready { infos };
            prop_assert_eq!(roundtrip(&m), m);
        }
    }
}
