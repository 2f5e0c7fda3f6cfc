//! Passing allocation file descriptors between processes of one host:
//! Unix stream sockets in the abstract namespace, descriptors as `SCM_RIGHTS`.
//!
//! Socket names are `devcomm-<magic>-<seq>-<rank>`: the communicator's unique
//! id magic, its registration sequence number and the receiving rank, so
//! concurrent communicators and registrations never collide; abstract
//! sockets vanish with their descriptor, so nothing is left behind.
//!
//! Every step is bounded by a deadline ([`Error::Timeout`]) and gives up
//! early when the communicator's abort flag goes up ([`Error::RemoteError`]).

use crate::error::{Error, Result};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What travels with each descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The communicator's unique id magic.
    pub(crate) magic: u128,
    /// The registration sequence number.
    pub(crate) seq: u64,
    /// The sender's world rank.
    pub(crate) from_rank: u64,
    /// Size of the allocation behind the descriptor.
    pub(crate) alloc_size: u64,
}

const HEADER_BYTES: usize = 40;

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..16].copy_from_slice(&self.magic.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.from_rank.to_le_bytes());
        b[32..40].copy_from_slice(&self.alloc_size.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_BYTES]) -> Header {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Header {
            magic: u128::from_le_bytes(b[..16].try_into().unwrap_or([0; 16])),
            seq: u64_at(16),
            from_rank: u64_at(24),
            alloc_size: u64_at(32),
        }
    }
}

/// The abstract socket name of `rank` for registration `seq` of the communicator with `magic`.
pub(crate) fn socket_name(magic: u128, seq: u64, rank: usize) -> String {
    format!("devcomm-{magic:032x}-{seq}-{rank}")
}

fn left(deadline: Instant, what: &str) -> Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(Error::Timeout(format!("{what}: the communicator's op timeout passed")));
    }
    Ok(d)
}

fn check_abort(abort: &AtomicBool, what: &str) -> Result<()> {
    if abort.load(Ordering::SeqCst) {
        return Err(Error::remote(format!("{what}: the communicator was aborted or a peer failed")));
    }
    Ok(())
}

/// Binds the listening socket `name`.
pub(crate) fn bind(name: &str) -> Result<UnixListener> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| Error::system(format!("abstract socket name {name}"), e))?;
    let l = UnixListener::bind_addr(&addr).map_err(|e| Error::system(format!("binding socket @{name}"), e))?;
    l.set_nonblocking(true).map_err(|e| Error::system("making a socket non-blocking", e))?;
    Ok(l)
}

/// Connects to `name` and sends `header` with `fd`.
pub(crate) fn send_fd(
    name: &str,
    header: &Header,
    fd: BorrowedFd<'_>,
    deadline: Instant,
    abort: &AtomicBool,
) -> Result<()> {
    let what = format!("sending an allocation handle to @{name}");
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| Error::system(&what, e))?;
    let stream = loop {
        check_abort(abort, &what)?;
        match UnixStream::connect_addr(&addr) {
            Ok(s) => break s,
            // The peer's listener is bound before the preceding allgather, so
            // a refusal is transient (or the peer died, which the timeout covers).
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound) => {
                left(deadline, &what)?;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(Error::system(&what, e)),
        }
    };
    stream.set_write_timeout(Some(left(deadline, &what)?)).map_err(|e| Error::system(&what, e))?;
    let bytes = header.encode();
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        // The descriptor rides on the first chunk only.
        let c: &[ControlMessage<'_>] = if sent == 0 { &cmsg } else { &[] };
        match sendmsg::<()>(stream.as_raw_fd(), &iov, c, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => {
                return Err(Error::Timeout(format!("{what}: the peer did not take it within the op timeout")))
            }
            Err(e) => return Err(Error::system(&what, e)),
        }
    }
    Ok(())
}

/// Accepts `count` connections on `listener` and returns each sender's
/// header and descriptor.
pub(crate) fn accept_fds(
    listener: &UnixListener,
    count: usize,
    deadline: Instant,
    abort: &AtomicBool,
) -> Result<Vec<(Header, OwnedFd)>> {
    let what = "receiving allocation handles from LSA peers";
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        check_abort(abort, what)?;
        match listener.accept() {
            Ok((s, _)) => got.push(receive_one(s, deadline)?),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                left(deadline, &format!("{what} ({} of {count} arrived)", got.len()))?;
                std::thread::sleep(Duration::from_micros(500));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::system(what, e)),
        }
    }
    Ok(got)
}

/// Receives one header and descriptor from an accepted `stream`, by `deadline`.
pub(crate) fn receive_one(stream: UnixStream, deadline: Instant) -> Result<(Header, OwnedFd)> {
    let what = "receiving an allocation handle";
    stream.set_nonblocking(false).map_err(|e| Error::system(what, e))?;
    stream.set_read_timeout(Some(left(deadline, what)?)).map_err(|e| Error::system(what, e))?;
    let mut buf = [0u8; HEADER_BYTES];
    let mut have = 0;
    let mut fd: Option<OwnedFd> = None;
    while have < HEADER_BYTES {
        let mut cmsg_buf = nix::cmsg_space!([RawFd; 4]);
        let (n, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf[have..])];
            let msg = match recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg_buf), MsgFlags::MSG_CMSG_CLOEXEC)
            {
                Ok(m) => m,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => {
                    return Err(Error::Timeout(format!("{what}: the peer sent nothing within the op timeout")))
                }
                Err(e) => return Err(Error::system(what, e)),
            };
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(|e| Error::system(what, e))? {
                if let ControlMessageOwned::ScmRights(v) = c {
                    fds.extend(v);
                }
            }
            (msg.bytes, fds)
        };
        for raw in fds {
            // SAFETY: the kernel just installed this descriptor for us; we own it.
            let owned = unsafe { OwnedFd::from_raw_fd(raw) };
            if fd.is_none() {
                fd = Some(owned);
            } // extra descriptors are closed on drop
        }
        if n == 0 {
            return Err(Error::remote(format!("{what}: the peer closed the connection after {have} bytes")));
        }
        have += n;
    }
    let fd = fd.ok_or_else(|| Error::remote(format!("{what}: the message carried no descriptor")))?;
    Ok((Header::decode(&buf), fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn passes_a_descriptor_in_process() {
        let name = socket_name(0xfeed, 7, std::process::id() as usize);
        let l = bind(&name).unwrap();
        let abort = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(5);
        let f = nix::sys::memfd::memfd_create(c"fdtest", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&f, 12345).unwrap();
        let h = Header { magic: 0xfeed, seq: 7, from_rank: 3, alloc_size: 12345 };
        send_fd(&name, &h, f.as_fd(), deadline, &abort).unwrap();
        let got = accept_fds(&l, 1, deadline, &abort).unwrap();
        assert_eq!(got[0].0, h);
        let st = nix::sys::stat::fstat(got[0].1.as_raw_fd()).unwrap();
        assert_eq!(st.st_size, 12345);
        // Nobody else sends: bounded wait.
        let short = Instant::now() + Duration::from_millis(50);
        assert!(matches!(accept_fds(&l, 1, short, &abort), Err(Error::Timeout(_))));
        abort.store(true, Ordering::SeqCst);
        assert!(matches!(accept_fds(&l, 1, deadline, &abort), Err(Error::RemoteError(_))));
    }
}
