//! Emulated shareable device memory: `memfd` files mapped shared, so emulated
//! ranks in different processes really load and store the same bytes.
//!
//! `unsafe` invariants: every mapping is made by this module over a range it
//! owns (its own `mmap`, or a `PROT_NONE` reservation of its own, overlaid
//! with `MAP_FIXED`), and unmapped exactly once on drop.

use crate::error::{Error, Result};
use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

/// Page granularity of emulated shareable memory (as CUDA's 2 MiB would be
/// wasteful here, but windows still need 4096-byte alignment).
pub(crate) const GRANULARITY: usize = 4096;

fn sys_err(what: &str) -> impl FnOnce(nix::Error) -> Error + '_ {
    move |e| Error::SystemError(format!("{what}: {e}"))
}

fn nz(len: usize) -> Result<NonZeroUsize> {
    NonZeroUsize::new(len).ok_or_else(|| Error::invalid_argument("zero-length mapping"))
}

/// A memfd of `size` bytes mapped read-write in this process.
pub(crate) struct ShmAlloc {
    fd: OwnedFd,
    ptr: NonNull<c_void>,
    size: usize,
}

// SAFETY: plain shared memory; concurrent access is the kernels' business.
unsafe impl Send for ShmAlloc {}
// SAFETY: as above.
unsafe impl Sync for ShmAlloc {}

impl ShmAlloc {
    pub(crate) fn new(size: usize) -> Result<ShmAlloc> {
        let fd = nix::sys::memfd::memfd_create(c"devcomm-emu-window", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
            .map_err(sys_err("memfd_create"))?;
        nix::unistd::ftruncate(&fd, size as i64).map_err(sys_err("ftruncate of a memfd"))?;
        // SAFETY: a fresh shared mapping of our own file; no existing memory is affected.
        let ptr = unsafe {
            mmap(None, nz(size)?, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, &fd, 0)
        }
        .map_err(sys_err("mmap of a memfd"))?;
        // Fresh memory is poisoned, like the emulator's other allocations.
        // SAFETY: the mapping is `size` bytes, read-write.
        unsafe { std::ptr::write_bytes(ptr.as_ptr() as *mut u8, 0xCB, size) };
        Ok(ShmAlloc { fd, ptr, size })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// A new descriptor of the memfd, to send to a peer process.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd> {
        self.fd.as_fd().try_clone_to_owned().map_err(|e| Error::system("dup of a memfd", e))
    }
}

impl Drop for ShmAlloc {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `size` bytes, unmapped once.
        let _ = unsafe { munmap(self.ptr, self.size) };
    }
}

/// A reserved address range (`PROT_NONE`) that memfds are mapped into.
pub(crate) struct ShmRange {
    base: NonNull<c_void>,
    size: usize,
    /// Parts that map another device's memory, as the strict mode knows them.
    peers: Vec<std::ops::Range<usize>>,
}

// SAFETY: as for ShmAlloc.
unsafe impl Send for ShmRange {}
// SAFETY: as above.
unsafe impl Sync for ShmRange {}

impl ShmRange {
    pub(crate) fn reserve(size: usize) -> Result<ShmRange> {
        // SAFETY: a fresh anonymous reservation; no existing memory is affected.
        let base = unsafe {
            mmap_anonymous(None, nz(size)?, ProtFlags::PROT_NONE, MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE)
        }
        .map_err(sys_err("reserving address space"))?;
        Ok(ShmRange { base, size, peers: Vec::new() })
    }

    pub(crate) fn base(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Maps `len` bytes of the memfd `fd` at `offset` into the range.
    pub(crate) fn map_fd(&mut self, offset: usize, fd: BorrowedFd<'_>, len: usize) -> Result<()> {
        if offset % GRANULARITY != 0 || offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::internal(format!("mapping {len} bytes at {offset} in a range of {}", self.size)));
        }
        let at = NonZeroUsize::new(self.base.as_ptr() as usize + offset)
            .ok_or_else(|| Error::internal("null mapping address"))?;
        // SAFETY: `at..at+len` lies inside our own reservation; MAP_FIXED
        // replaces only our PROT_NONE pages there.
        unsafe {
            mmap(
                Some(at),
                nz(len)?,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                fd,
                0,
            )
        }
        .map_err(sys_err("mapping a peer's memfd"))?;
        Ok(())
    }

    /// Tells the strict mode that `len` bytes at `offset` map another
    /// device's memory (a barrier publishes stores there to the block only).
    pub(crate) fn mark_peer(&mut self, offset: usize, len: usize) {
        let start = self.base.as_ptr() as usize + offset;
        let r = start..start + len.min(self.size.saturating_sub(offset));
        super::strict::add_peer_range(r.clone());
        self.peers.push(r);
    }
}

impl Drop for ShmRange {
    fn drop(&mut self) {
        for r in &self.peers {
            super::strict::remove_peer_range(r);
        }
        // SAFETY: the whole range (reservation and overlays) is ours; unmapped once.
        let _ = unsafe { munmap(self.base, self.size) };
    }
}
