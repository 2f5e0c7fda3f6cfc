//! The point-to-point engine's wire format: the hello that opens every TCP
//! connection, the control frames, and the headers of data frames. All
//! integers are little-endian.
//!
//! * **Hello** (256 bytes, both ways): magic `DCP2PHI\0`, version, kind
//!   (control, data, answer), the sender endpoint's token and host id, GPUs,
//!   threads, flags, connection id and nonce, stripe, status, and a short
//!   message (an answer's error). Anything else on a listening port is
//!   rejected before a connection exists.
//! * **Control frame** (48 bytes): kind, status, five words; a frame with a
//!   non-zero status carries a UTF-8 message of `e` bytes after it.
//! * **Queue pair record** (48 bytes, RDMA connections only, once each way
//!   on the control socket during the handshake): `devcomm-gin`'s
//!   `rc::QpRecord` (magic `DCRCQP`, version, QP number, first PSN, LID,
//!   port, link layer, MTU, GID).
//! * **Data frame** (40-byte header, then the payload): kind (send, write,
//!   read), sequence number, region id, address or offset, length.

use crate::error::{Error, ErrorCode, Result};
use std::io::{Read, Write};

pub(crate) const MAGIC: [u8; 8] = *b"DCP2PHI\0";
pub(crate) const VERSION: u32 = 1;
pub(crate) const HELLO_BYTES: usize = 256;
const HELLO_MSG_AT: usize = 100;
const HELLO_MSG_MAX: usize = HELLO_BYTES - HELLO_MSG_AT;

pub(crate) const HELLO_CONTROL: u32 = 1;
pub(crate) const HELLO_DATA: u32 = 2;
pub(crate) const HELLO_ANSWER: u32 = 3;

/// Flag: the sender runs on CUDA (else the emulated runtime).
pub(crate) const FLAG_CUDA: u32 = 1;
/// Flag: the sender wants TCP even on one host.
pub(crate) const FLAG_FORCE_TCP: u32 = 2;
/// Flag: the sender can use the shared-memory control path (a hello of a
/// connection); it sent the connection's control page (a data hello).
pub(crate) const FLAG_SHM: u32 = 4;
/// Flag: the sender's endpoint uses the RDMA (verbs) transport for every
/// connection; both sides must (else the acceptor refuses with
/// [`STATUS_TRANSPORT`]).
pub(crate) const FLAG_VERBS: u32 = 8;

/// Answer status: accepted.
pub(crate) const STATUS_OK: u32 = 0;
/// Answer status: the endpoint serves another GPU than the one asked for.
pub(crate) const STATUS_WRONG_GPU: u32 = 1;
/// Answer status: refused for another reason (the message says).
pub(crate) const STATUS_REFUSED: u32 = 2;
/// Answer status: one side uses the RDMA (verbs) transport and the other does not.
pub(crate) const STATUS_TRANSPORT: u32 = 3;

/// The hello that opens every connection (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) kind: u32,
    pub(crate) token: u128,
    pub(crate) host_id: u128,
    pub(crate) gpu: u32,
    pub(crate) want_gpu: u32,
    pub(crate) threads: u32,
    pub(crate) flags: u32,
    pub(crate) conn_id: u64,
    pub(crate) nonce: u64,
    pub(crate) stripe: u32,
    pub(crate) status: u32,
    pub(crate) message: String,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn u128_at(b: &[u8], at: usize) -> u128 {
    let mut w = [0u8; 16];
    w.copy_from_slice(&b[at..at + 16]);
    u128::from_le_bytes(w)
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.to_le_bytes());
        b[16..32].copy_from_slice(&self.token.to_le_bytes());
        b[32..48].copy_from_slice(&self.host_id.to_le_bytes());
        b[48..52].copy_from_slice(&self.gpu.to_le_bytes());
        b[52..56].copy_from_slice(&self.want_gpu.to_le_bytes());
        b[56..60].copy_from_slice(&self.threads.to_le_bytes());
        b[60..64].copy_from_slice(&self.flags.to_le_bytes());
        b[64..72].copy_from_slice(&self.conn_id.to_le_bytes());
        b[72..80].copy_from_slice(&self.nonce.to_le_bytes());
        b[80..84].copy_from_slice(&self.stripe.to_le_bytes());
        b[84..88].copy_from_slice(&self.status.to_le_bytes());
        let msg = self.message.as_bytes();
        let n = msg.len().min(HELLO_MSG_MAX);
        b[88..92].copy_from_slice(&(n as u32).to_le_bytes());
        b[HELLO_MSG_AT..HELLO_MSG_AT + n].copy_from_slice(&msg[..n]);
        b
    }

    /// Decodes a hello, or says why the bytes are not one.
    pub(crate) fn decode(b: &[u8; HELLO_BYTES]) -> Result<Hello> {
        if b[0..8] != MAGIC {
            return Err(Error::remote(format!(
                "not a devcomm point-to-point hello (first bytes {:02x?}, expected {:02x?})",
                &b[0..8],
                MAGIC
            )));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(Error::remote(format!(
                "devcomm point-to-point protocol version {version}, this build speaks {VERSION}"
            )));
        }
        let kind = u32_at(b, 12);
        if !(HELLO_CONTROL..=HELLO_ANSWER).contains(&kind) {
            return Err(Error::remote(format!("unknown hello kind {kind}")));
        }
        let n = (u32_at(b, 88) as usize).min(HELLO_MSG_MAX);
        Ok(Hello {
            kind,
            token: u128_at(b, 16),
            host_id: u128_at(b, 32),
            gpu: u32_at(b, 48),
            want_gpu: u32_at(b, 52),
            threads: u32_at(b, 56),
            flags: u32_at(b, 60),
            conn_id: u64_at(b, 64),
            nonce: u64_at(b, 72),
            stripe: u32_at(b, 80),
            status: u32_at(b, 84),
            message: String::from_utf8_lossy(&b[HELLO_MSG_AT..HELLO_MSG_AT + n]).into_owned(),
        })
    }

    pub(crate) fn read_from(r: &mut impl Read) -> Result<Hello> {
        let mut b = [0u8; HELLO_BYTES];
        r.read_exact(&mut b).map_err(|e| io_err("reading the hello", e))?;
        Hello::decode(&b)
    }

    pub(crate) fn write_to(&self, w: &mut impl Write) -> Result<()> {
        w.write_all(&self.encode()).map_err(|e| io_err("writing the hello", e))
    }
}

/// An I/O error as a devcomm error: timeouts are [`Error::Timeout`], a
/// connection the peer closed or reset is [`Error::RemoteError`].
pub(crate) fn io_err(what: &str, e: std::io::Error) -> Error {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock | K::TimedOut => Error::Timeout(format!("{what}: the peer did not answer in time")),
        K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::NotConnected => {
            Error::remote(format!("{what}: the peer closed the connection or died ({e})"))
        }
        _ => Error::system(what, e),
    }
}

// Control frame kinds.
/// Receiver → sender: a posted receive (a = seq, b = region, c = address, d = capacity).
pub(crate) const C_CTS: u32 = 1;
/// Sender → receiver: a message for receive `a` of `b` bytes; c = 1 when already copied (IPC).
pub(crate) const C_SEND: u32 = 2;
/// Sender → receiver: the message for receive `a` (of `b` bytes) does not fit.
pub(crate) const C_TOO_LARGE: u32 = 3;
/// Initiator → target: a write `a` of `d` bytes into region `b` at address `c` follows on the data sockets.
pub(crate) const C_WRITE: u32 = 4;
/// Target → initiator: write `a` landed (status 0) or failed (message).
pub(crate) const C_WRITE_ACK: u32 = 5;
/// Initiator → target: read `a`: send `d` bytes of region `b` at address `c`.
pub(crate) const C_READ: u32 = 6;
/// Target → initiator: read `a` failed (message).
pub(crate) const C_READ_ERR: u32 = 7;
/// Initiator → target: request `a`: the file descriptor of region `b`'s allocation, please.
pub(crate) const C_FD_REQ: u32 = 8;
/// Target → initiator: request `a` cannot be served (message).
pub(crate) const C_FD_NO: u32 = 9;
/// Acceptor → connector: every data socket arrived; a = 1 when the
/// connection's control frames take the shared page from now on.
pub(crate) const C_READY: u32 = 10;
/// Either way: an orderly close.
pub(crate) const C_BYE: u32 = 11;
/// Receiver → sender on an RDMA connection: a posted receive (a = seq,
/// b = the remote key of its region, c = address, d = capacity).
pub(crate) const C_CTS_RDMA: u32 = 12;

pub(crate) const CONTROL_BYTES: usize = 48;
const CONTROL_MSG_MAX: u64 = 4096;

/// A control frame (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Control {
    pub(crate) kind: u32,
    pub(crate) a: u64,
    pub(crate) b: u64,
    pub(crate) c: u64,
    pub(crate) d: u64,
    /// An error: its [`ErrorCode`] and message (sent as a non-zero status).
    pub(crate) error: Option<(u32, String)>,
}

impl Control {
    pub(crate) fn new(kind: u32, a: u64, b: u64, c: u64, d: u64) -> Control {
        Control { kind, a, b, c, d, error: None }
    }

    /// A frame that reports `err` about operation `a`.
    pub(crate) fn failed(kind: u32, a: u64, err: &Error) -> Control {
        Control { kind, a, error: Some((err.code() as u32, err.message().to_string())), ..Control::default() }
    }

    /// The error the frame reports, as the same variant the peer had, the
    /// message prefixed with "peer: ".
    pub(crate) fn to_error(&self) -> Option<Error> {
        let (code, msg) = self.error.as_ref()?;
        let m = format!("peer: {msg}");
        Some(match *code {
            c if c == ErrorCode::InvalidArgument as u32 => Error::InvalidArgument(m),
            c if c == ErrorCode::InvalidUsage as u32 => Error::InvalidUsage(m),
            c if c == ErrorCode::SystemError as u32 => Error::SystemError(m),
            c if c == ErrorCode::CudaError as u32 => Error::CudaError(m),
            c if c == ErrorCode::Timeout as u32 => Error::Timeout(m),
            c if c == ErrorCode::InternalError as u32 => Error::InternalError(m),
            _ => Error::RemoteError(m),
        })
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let (code, msg) = match &self.error {
            Some((c, m)) => ((*c).max(1), m.as_bytes()),
            None => (0, &[][..]),
        };
        let msg = &msg[..msg.len().min(CONTROL_MSG_MAX as usize)];
        let mut b = vec![0u8; CONTROL_BYTES + msg.len()];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&code.to_le_bytes());
        b[8..16].copy_from_slice(&self.a.to_le_bytes());
        b[16..24].copy_from_slice(&self.b.to_le_bytes());
        b[24..32].copy_from_slice(&self.c.to_le_bytes());
        b[32..40].copy_from_slice(&self.d.to_le_bytes());
        b[40..48].copy_from_slice(&(msg.len() as u64).to_le_bytes());
        b[CONTROL_BYTES..].copy_from_slice(msg);
        b
    }

    pub(crate) fn read_from(r: &mut impl Read) -> Result<Control> {
        let mut h = [0u8; CONTROL_BYTES];
        r.read_exact(&mut h).map_err(|e| io_err("reading a control frame", e))?;
        let kind = u32_at(&h, 0);
        if !(C_CTS..=C_CTS_RDMA).contains(&kind) {
            return Err(Error::remote(format!("malformed control frame (kind {kind})")));
        }
        let code = u32_at(&h, 4);
        let n = u64_at(&h, 40);
        if n > CONTROL_MSG_MAX {
            return Err(Error::remote(format!("malformed control frame (message of {n} bytes)")));
        }
        let error = if code != 0 {
            let mut m = vec![0u8; n as usize];
            r.read_exact(&mut m).map_err(|e| io_err("reading a control frame", e))?;
            Some((code, String::from_utf8_lossy(&m).into_owned()))
        } else {
            None
        };
        Ok(Control { kind, a: u64_at(&h, 8), b: u64_at(&h, 16), c: u64_at(&h, 24), d: u64_at(&h, 32), error })
    }
}

// Data frame kinds.
/// Payload of a message for receive `seq`, at byte `addr` of it.
pub(crate) const D_SEND: u32 = 1;
/// Payload of write `seq` into region `mr` at address `addr`.
pub(crate) const D_WRITE: u32 = 2;
/// Payload of read `seq`, at byte `addr` of the reader's buffer.
pub(crate) const D_READ: u32 = 3;

pub(crate) const DATA_BYTES: usize = 40;

/// The header of a data frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DataHeader {
    pub(crate) kind: u32,
    pub(crate) seq: u64,
    pub(crate) mr: u64,
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

impl DataHeader {
    pub(crate) fn encode(&self) -> [u8; DATA_BYTES] {
        let mut b = [0u8; DATA_BYTES];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.mr.to_le_bytes());
        b[24..32].copy_from_slice(&self.addr.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; DATA_BYTES]) -> Result<DataHeader> {
        let kind = u32_at(b, 0);
        if !(D_SEND..=D_READ).contains(&kind) {
            return Err(Error::remote(format!("malformed data frame (kind {kind})")));
        }
        Ok(DataHeader { kind, seq: u64_at(b, 8), mr: u64_at(b, 16), addr: u64_at(b, 24), len: u64_at(b, 32) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let h = Hello {
            kind: HELLO_DATA,
            token: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            host_id: 99,
            gpu: 3,
            want_gpu: 1,
            threads: 4,
            flags: FLAG_CUDA,
            conn_id: 17,
            nonce: 0xdead_beef,
            stripe: 2,
            status: STATUS_WRONG_GPU,
            message: "no such GPU here".into(),
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut junk = [0x5au8; HELLO_BYTES];
        assert!(matches!(Hello::decode(&junk), Err(Error::RemoteError(m)) if m.contains("not a devcomm")));
        junk[..8].copy_from_slice(&MAGIC);
        assert!(matches!(Hello::decode(&junk), Err(Error::RemoteError(m)) if m.contains("version")));

        let c = Control::failed(C_WRITE_ACK, 5, &Error::invalid_argument("region 3 is not registered"));
        let back = Control::read_from(&mut &c.encode()[..]).unwrap();
        assert_eq!(back, c);
        assert!(matches!(back.to_error(), Some(Error::InvalidArgument(m)) if m.contains("region 3")));
        let c = Control::new(C_CTS, 1, 2, 3, 4);
        assert_eq!(Control::read_from(&mut &c.encode()[..]).unwrap(), c);
        assert!(Control::read_from(&mut &[0xffu8; 60][..]).is_err());

        let d = DataHeader { kind: D_WRITE, seq: 9, mr: 4, addr: 0x1000, len: 77 };
        assert_eq!(DataHeader::decode(&d.encode()).unwrap(), d);
        assert!(DataHeader::decode(&[7u8; DATA_BYTES]).is_err());
    }
}
