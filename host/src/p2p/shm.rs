//! The shared-memory control path of same-host connections: one sealed
//! `memfd` per connection, mapped by both processes, holding two
//! single-producer byte rings of control frames (the same encoding as the
//! control socket's, [`Control`]), one per direction.
//!
//! Layout ([`SHM_BYTES`] bytes, little-endian, native atomics):
//!
//! * bytes 0..32: magic `DCP2PSH\0`, version, ring size, the connection's nonce;
//! * per ring `d` (0: connector → acceptor, 1: acceptor → connector), each
//!   on its own cache line: the producer's `tail` at `1024 + 256 d` and the
//!   consumer's `head` at `1024 + 256 d + 128` (bytes produced / consumed
//!   since the start, never wrapping);
//! * ring `d`'s [`RING_BYTES`] bytes at `4096 + d · RING_BYTES`.
//!
//! A frame is a control frame's bytes padded to a multiple of 8 (error
//! messages cut to [`MSG_MAX`] bytes); the producer stores its words, then
//! publishes them by advancing `tail` (release); the consumer reads them
//! after loading `tail` (acquire) and frees them by advancing `head`
//! (release). All accesses to the mapping are atomic, so the other process
//! cannot make this one's reads undefined behaviour; what it writes is
//! data, and every counter and length read from it is checked (a corrupt
//! page is an [`Error::RemoteError`], never an out-of-range access). The
//! file is sealed against shrinking before it is shared, so a peer cannot
//! truncate it under the mapping (`SIGBUS`).
//!
//! `unsafe` lies only in [`ShmPage`]: mapping, unmapping, and the atomic
//! views of its words.

use super::wire::{self, Control};
use crate::error::{Error, Result};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of each ring (a power of two, a multiple of 8).
pub(crate) const RING_BYTES: usize = 8192;
const HEADER_BYTES: usize = 4096;
/// Bytes of the shared file: a header page and two rings.
pub(crate) const SHM_BYTES: usize = HEADER_BYTES + 2 * RING_BYTES;
/// Error messages travel cut to this many bytes.
pub(crate) const MSG_MAX: usize = 1024;
const MAGIC: u64 = u64::from_le_bytes(*b"DCP2PSH\0");
const VERSION: u64 = 1;

const AT_MAGIC: usize = 0;
const AT_VERSION: usize = 8;
const AT_RING: usize = 16;
const AT_NONCE: usize = 24;

pub(crate) fn tail_at(dir: usize) -> usize {
    1024 + 256 * dir
}

fn head_at(dir: usize) -> usize {
    1024 + 256 * dir + 128
}

fn data_at(dir: usize) -> usize {
    HEADER_BYTES + dir * RING_BYTES
}

/// Ring 0 carries the connector's frames, ring 1 the acceptor's.
pub(crate) fn out_ring(initiator: bool) -> usize {
    usize::from(!initiator)
}

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::remote(format!("the peer's shared control page is corrupt: {what}"))
}

/// The shared file mapped here (see the module docs).
pub(crate) struct ShmPage {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory that this process only
// accesses through atomics (`word`); the pointer is valid from any thread
// until `Drop` unmaps it, which needs `&mut self`.
unsafe impl Send for ShmPage {}
// SAFETY: as above: every access through `&self` is an atomic operation.
unsafe impl Sync for ShmPage {}

impl ShmPage {
    /// A new sealed file for the connection with `nonce`, mapped here, its
    /// header written; the descriptor is for the peer.
    pub(crate) fn create(nonce: u64) -> Result<(ShmPage, OwnedFd)> {
        let sys = |what: &'static str| move |e: nix::errno::Errno| Error::system(what, e);
        let fd =
            memfd_create(c"devcomm-p2p-control", MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)
                .map_err(sys("memfd_create (p2p control page)"))?;
        nix::unistd::ftruncate(&fd, SHM_BYTES as i64).map_err(sys("ftruncate (p2p control page)"))?;
        fcntl(
            fd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL),
        )
        .map_err(sys("sealing the p2p control page"))?;
        let page = ShmPage::map(&fd)?;
        page.word(AT_VERSION).store(VERSION, Ordering::Relaxed);
        page.word(AT_RING).store(RING_BYTES as u64, Ordering::Relaxed);
        page.word(AT_NONCE).store(nonce, Ordering::Relaxed);
        page.word(AT_MAGIC).store(MAGIC, Ordering::Release);
        Ok((page, fd))
    }

    /// Maps the file a peer sent for the connection with `nonce`, after
    /// checking that it cannot shrink, its size and its header.
    pub(crate) fn open(fd: &OwnedFd, nonce: u64) -> Result<ShmPage> {
        let seals = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS)
            .map_err(|e| Error::remote(format!("the peer's control page is not a sealable memfd ({e})")))?;
        let need = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW;
        if !SealFlag::from_bits_truncate(seals).contains(need) {
            return Err(Error::remote("the peer's control page is not sealed against resizing"));
        }
        let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| Error::system("fstat (p2p control page)", e))?;
        if st.st_size != SHM_BYTES as i64 {
            return Err(corrupt(format!("{} bytes, expected {SHM_BYTES}", st.st_size)));
        }
        let page = ShmPage::map(fd)?;
        let (magic, version, ring, n) = (
            page.word(AT_MAGIC).load(Ordering::Acquire),
            page.word(AT_VERSION).load(Ordering::Relaxed),
            page.word(AT_RING).load(Ordering::Relaxed),
            page.word(AT_NONCE).load(Ordering::Relaxed),
        );
        if magic != MAGIC || version != VERSION || ring != RING_BYTES as u64 {
            return Err(corrupt(format!(
                "header magic {magic:#x}, version {version}, ring {ring} (expected {MAGIC:#x}, {VERSION}, {RING_BYTES})"
            )));
        }
        if n != nonce {
            return Err(corrupt("it names another connection"));
        }
        Ok(page)
    }

    fn map(fd: &OwnedFd) -> Result<ShmPage> {
        let len = NonZeroUsize::new(SHM_BYTES).ok_or_else(|| Error::internal("empty control page"))?;
        // SAFETY: a new shared mapping at an address the kernel picks
        // (overlapping nothing of this process) of a file of at least
        // `SHM_BYTES` bytes that cannot shrink (sealed: checked by `open`,
        // done by `create`), so every byte stays backed until `Drop`.
        let p = unsafe { mmap(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd, 0) }
            .map_err(|e| Error::system("mmap (p2p control page)", e))?;
        Ok(ShmPage { base: p.cast() })
    }

    /// The 8-byte word at byte `at`.
    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(at % 8 == 0 && at + 8 <= SHM_BYTES, "control page word {at} out of range");
        // SAFETY: `at .. at + 8` lies inside the mapping (asserted), which
        // is page aligned, so the word is 8-aligned; the mapping lives as
        // long as `self`. `AtomicU64` has `u64`'s layout, and this process
        // touches the page only through such atomics; the peer's stores
        // only change the values read, which callers check.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    #[cfg(test)]
    pub(crate) fn scribble(&self, at: usize, v: u64) {
        self.word(at).store(v, Ordering::SeqCst);
    }
}

impl Drop for ShmPage {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `map`, of `SHM_BYTES` bytes, unmapped
        // once; no reference from `word` outlives `&self`.
        let _ = unsafe { munmap(self.base.cast(), SHM_BYTES) };
    }
}

/// The bytes of frame `c` on a ring: its control-frame encoding, the error
/// message cut to [`MSG_MAX`] bytes, padded to a multiple of 8.
pub(crate) fn frame(c: &Control) -> Vec<u8> {
    let mut b = match &c.error {
        Some((code, m)) if m.len() > MSG_MAX => {
            let mut cut = MSG_MAX;
            while !m.is_char_boundary(cut) {
                cut -= 1;
            }
            Control { error: Some((*code, m[..cut].to_string())), ..c.clone() }.encode()
        }
        _ => c.encode(),
    };
    b.resize(b.len().next_multiple_of(8), 0);
    b
}

/// This side's end of the ring it produces into.
pub(crate) struct RingTx {
    page: Arc<ShmPage>,
    dir: usize,
    tail: u64,
    head_seen: u64,
}

impl RingTx {
    pub(crate) fn new(page: Arc<ShmPage>, dir: usize) -> RingTx {
        RingTx { page, dir, tail: 0, head_seen: 0 }
    }

    /// Writes `frame` (a multiple of 8 bytes) if it fits: `Ok(false)` when
    /// the ring is too full now.
    fn try_push(&mut self, frame: &[u8]) -> Result<bool> {
        if frame.len() % 8 != 0 || frame.len() > RING_BYTES {
            return Err(Error::internal(format!("a control frame of {} bytes", frame.len())));
        }
        let head = self.page.word(head_at(self.dir)).load(Ordering::Acquire);
        if head < self.head_seen || head > self.tail {
            return Err(corrupt(format!(
                "ring {} consumed up to {head}, produced {}, seen consumed {}",
                self.dir, self.tail, self.head_seen
            )));
        }
        self.head_seen = head;
        let free = RING_BYTES as u64 - (self.tail - head);
        if frame.len() as u64 > free {
            return Ok(false);
        }
        let base = data_at(self.dir);
        for (i, w) in frame.chunks_exact(8).enumerate() {
            let pos = (self.tail as usize + 8 * i) % RING_BYTES;
            let mut v = [0u8; 8];
            v.copy_from_slice(w);
            self.page.word(base + pos).store(u64::from_le_bytes(v), Ordering::Relaxed);
        }
        self.tail += frame.len() as u64;
        self.page.word(tail_at(self.dir)).store(self.tail, Ordering::Release);
        Ok(true)
    }
}

/// The producing side with its backlog: frames that did not fit wait here,
/// in order, so no thread ever blocks on a full ring.
pub(crate) struct Outbox {
    ring: RingTx,
    queued: VecDeque<Vec<u8>>,
}

impl Outbox {
    pub(crate) fn new(ring: RingTx) -> Outbox {
        Outbox { ring, queued: VecDeque::new() }
    }

    /// Puts `frame` on the ring, or behind the backlog.
    pub(crate) fn send(&mut self, frame: Vec<u8>) -> Result<()> {
        if self.queued.is_empty() && self.ring.try_push(&frame)? {
            return Ok(());
        }
        self.queued.push_back(frame);
        Ok(())
    }

    /// Moves as much of the backlog to the ring as fits; `true` once it is empty.
    pub(crate) fn flush(&mut self) -> Result<bool> {
        while let Some(f) = self.queued.front() {
            if !self.ring.try_push(f)? {
                return Ok(false);
            }
            self.queued.pop_front();
        }
        Ok(true)
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

/// This side's end of the ring it consumes.
pub(crate) struct RingRx {
    page: Arc<ShmPage>,
    dir: usize,
    head: u64,
}

impl RingRx {
    pub(crate) fn new(page: Arc<ShmPage>, dir: usize) -> RingRx {
        RingRx { page, dir, head: 0 }
    }

    fn read(&self, at: u64, out: &mut Vec<u8>, words: usize) {
        let base = data_at(self.dir);
        for i in 0..words {
            let pos = (at as usize + 8 * i) % RING_BYTES;
            out.extend_from_slice(&self.page.word(base + pos).load(Ordering::Relaxed).to_le_bytes());
        }
    }

    /// The next frame, if the peer published one.
    ///
    /// Errors: [`Error::RemoteError`] for counters out of range, a frame
    /// longer than what was published, or one that does not decode.
    pub(crate) fn pop(&mut self) -> Result<Option<Control>> {
        let tail = self.page.word(tail_at(self.dir)).load(Ordering::Acquire);
        if tail < self.head || tail - self.head > RING_BYTES as u64 {
            return Err(corrupt(format!("ring {} produced up to {tail}, consumed {}", self.dir, self.head)));
        }
        let avail = tail - self.head;
        if avail == 0 {
            return Ok(None);
        }
        if avail < wire::CONTROL_BYTES as u64 || avail % 8 != 0 {
            return Err(corrupt(format!("ring {} holds {avail} bytes, not whole frames", self.dir)));
        }
        let mut b = Vec::with_capacity(wire::CONTROL_BYTES);
        self.read(self.head, &mut b, wire::CONTROL_BYTES / 8);
        let code = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[40..48]);
        let n = u64::from_le_bytes(n);
        if (code == 0 && n != 0) || n > MSG_MAX as u64 {
            return Err(corrupt(format!("a frame with status {code} and a message of {n} bytes")));
        }
        let len = (wire::CONTROL_BYTES as u64 + n).next_multiple_of(8);
        if len > avail {
            return Err(corrupt(format!("a frame of {len} bytes where {avail} were published")));
        }
        let rest = (len as usize - wire::CONTROL_BYTES) / 8;
        self.read(self.head + wire::CONTROL_BYTES as u64, &mut b, rest);
        let c = Control::read_from(&mut &b[..]).map_err(|e| corrupt(e.message()))?;
        self.head += len;
        self.page.word(head_at(self.dir)).store(self.head, Ordering::Release);
        Ok(Some(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Arc<ShmPage>, Arc<ShmPage>) {
        let (a, fd) = ShmPage::create(77).unwrap();
        let b = ShmPage::open(&fd, 77).unwrap();
        (Arc::new(a), Arc::new(b))
    }

    #[test]
    fn frames_cross_the_rings_in_order_and_wrap() {
        let (a, b) = pair();
        let mut tx = Outbox::new(RingTx::new(a.clone(), 0));
        let mut rx = RingRx::new(b.clone(), 0);
        let long = "x".repeat(5000);
        let mut want = Vec::new();
        for i in 0..2000u64 {
            let c = if i % 7 == 0 {
                Control::failed(wire::C_WRITE_ACK, i, &Error::invalid_argument(long[..(i as usize % 1500)].to_string()))
            } else {
                Control::new(wire::C_CTS, i, i * 2, i * 3, i * 4)
            };
            tx.send(frame(&c)).unwrap();
            want.push(c);
            if i % 3 == 0 {
                while let Some(c) = rx.pop().unwrap() {
                    let w = want.remove(0);
                    assert_eq!(c.kind, w.kind);
                    assert_eq!(c.a, w.a);
                    if let Some((_, m)) = &w.error {
                        assert_eq!(c.error.as_ref().unwrap().1, m[..m.len().min(MSG_MAX)]);
                    }
                }
                tx.flush().unwrap();
            }
        }
        while !want.is_empty() {
            tx.flush().unwrap();
            while let Some(c) = rx.pop().unwrap() {
                assert_eq!(c.a, want.remove(0).a);
            }
        }
        assert!(tx.flush().unwrap() && tx.is_empty());
        // The other direction is independent.
        let mut tx1 = Outbox::new(RingTx::new(b, 1));
        let mut rx1 = RingRx::new(a, 1);
        assert!(rx1.pop().unwrap().is_none());
        tx1.send(frame(&Control::new(wire::C_BYE, 0, 0, 0, 0))).unwrap();
        assert_eq!(rx1.pop().unwrap().unwrap().kind, wire::C_BYE);
    }

    #[test]
    fn a_corrupt_page_is_a_typed_error() {
        let is_corrupt = |r: Result<Option<Control>>| matches!(r, Err(Error::RemoteError(m)) if m.contains("corrupt"));
        // Tail past a whole ring, behind the head, mid-frame; bad lengths and kinds.
        let cases: [&dyn Fn(&ShmPage); 6] = [
            &|p| p.scribble(tail_at(0), RING_BYTES as u64 + 8),
            &|p| p.scribble(tail_at(0), u64::MAX),
            &|p| p.scribble(tail_at(0), 16),
            &|p| {
                p.scribble(data_at(0), 0x0000_0001_0000_0001);
                p.scribble(data_at(0) + 40, 1 << 40);
                p.scribble(tail_at(0), 48);
            },
            &|p| {
                p.scribble(data_at(0), 999);
                p.scribble(tail_at(0), 48);
            },
            &|p| {
                p.scribble(data_at(0), 0x0000_0001_0000_0002);
                p.scribble(data_at(0) + 40, 100);
                p.scribble(tail_at(0), 48);
            },
        ];
        for (i, f) in cases.iter().enumerate() {
            let (a, b) = pair();
            f(&a);
            assert!(is_corrupt(RingRx::new(b, 0).pop()), "case {i}");
        }
        // A consumer head the producer never reached.
        let (a, b) = pair();
        b.scribble(head_at(1), 4096);
        let mut tx = Outbox::new(RingTx::new(a, 1));
        assert!(matches!(tx.send(frame(&Control::new(wire::C_BYE, 0, 0, 0, 0))), Err(Error::RemoteError(_))));
        // Files that are not the peer's page for this connection.
        let (_, fd) = ShmPage::create(5).unwrap();
        assert!(matches!(ShmPage::open(&fd, 6), Err(Error::RemoteError(m)) if m.contains("another connection")));
        let plain = memfd_create(c"plain", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&plain, SHM_BYTES as i64).unwrap();
        assert!(matches!(ShmPage::open(&plain, 5), Err(Error::RemoteError(m)) if m.contains("sealed")));
        let unsized_ =
            memfd_create(c"small", MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING).unwrap();
        nix::unistd::ftruncate(&unsized_, 4096).unwrap();
        fcntl(unsized_.as_raw_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW)).unwrap();
        assert!(matches!(ShmPage::open(&unsized_, 5), Err(Error::RemoteError(m)) if m.contains("4096 bytes")));
    }

    #[test]
    fn a_full_ring_backs_up_in_order() {
        let (a, b) = pair();
        let mut tx = Outbox::new(RingTx::new(a, 0));
        let mut rx = RingRx::new(b, 0);
        let n = RING_BYTES / 48 + 50;
        for i in 0..n as u64 {
            tx.send(frame(&Control::new(wire::C_CTS, i, 0, 0, 0))).unwrap();
        }
        assert!(!tx.is_empty(), "the ring holds fewer frames than were sent");
        let mut got = 0u64;
        while got < n as u64 {
            while let Some(c) = rx.pop().unwrap() {
                assert_eq!(c.a, got);
                got += 1;
            }
            tx.flush().unwrap();
        }
    }
}
