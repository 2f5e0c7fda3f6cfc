//! Collective agreement on success: every rank contributes its local outcome
//! (and a payload); either all succeed, or all return an error, so a bad
//! argument on one rank never leaves the others waiting in a later step.

use crate::comm::Communicator;
use crate::error::{Error, ErrorCode, Result};

fn code_of(e: &Error) -> u32 {
    e.code() as u32
}

fn error_of(code: u32, msg: String) -> Error {
    match code {
        c if c == ErrorCode::InvalidArgument as u32 => Error::InvalidArgument(msg),
        c if c == ErrorCode::InvalidUsage as u32 => Error::InvalidUsage(msg),
        c if c == ErrorCode::SystemError as u32 => Error::SystemError(msg),
        c if c == ErrorCode::CudaError as u32 => Error::CudaError(msg),
        c if c == ErrorCode::Timeout as u32 => Error::Timeout(msg),
        c if c == ErrorCode::InternalError as u32 => Error::InternalError(msg),
        _ => Error::RemoteError(msg),
    }
}

/// Allgathers `local` (an error, or a payload) and returns every rank's
/// payload when all succeeded. Otherwise: this rank's own error if it
/// failed, else the first failed rank's error (same variant, message naming
/// the rank). `what` prefixes remote messages.
pub(crate) fn allgather_outcome(comm: &Communicator, what: &str, local: Result<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    let mut msg = Vec::new();
    match &local {
        Ok(payload) => {
            msg.extend_from_slice(&0u32.to_le_bytes());
            msg.extend_from_slice(payload);
        }
        Err(e) => {
            msg.extend_from_slice(&code_of(e).to_le_bytes());
            msg.extend_from_slice(e.message().as_bytes());
        }
    }
    let all = comm.bootstrap_allgather(&msg).map_err(|e| e.context(what))?;
    local?;
    let mut payloads = Vec::with_capacity(all.len());
    for (r, b) in all.into_iter().enumerate() {
        if b.len() < 4 {
            return Err(Error::remote(format!("{what}: rank {r} sent a malformed status")));
        }
        let code = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if code != 0 {
            let m = String::from_utf8_lossy(&b[4..]);
            return Err(error_of(code, format!("{what}: rank {r} failed: {m}")));
        }
        payloads.push(b[4..].to_vec());
    }
    Ok(payloads)
}

/// [`allgather_outcome`] without payloads.
pub(crate) fn agree(comm: &Communicator, what: &str, local: Result<()>) -> Result<()> {
    allgather_outcome(comm, what, local.map(|()| Vec::new())).map(|_| ())
}

/// Little-endian field reader over a payload.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    rank: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8], rank: usize) -> Self {
        Reader { b, rank }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        if self.b.len() < N {
            return Err(Error::remote(format!("rank {} sent a truncated message", self.rank)));
        }
        let (a, rest) = self.b.split_at(N);
        self.b = rest;
        Ok(a.try_into().unwrap_or([0; N]))
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}
