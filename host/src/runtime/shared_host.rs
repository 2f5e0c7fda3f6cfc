//! Host memory shared between the processes of one host and visible to a
//! device: a `memfd` mapped `MAP_SHARED` (so peers can map it from a file
//! descriptor) and, on CUDA, registered with `cuMemHostRegister` so kernels
//! read it through a device address. GIN signals live here, so a same-host
//! peer's proxy can add to them directly.
//!
//! `unsafe` invariants: each mapping is made and unmapped once by its
//! owner; registration is undone before unmapping; shared words are only
//! accessed atomically (the users' business).

use super::{cuda::CudaDevice, Device, DeviceInner};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

fn map_shared(fd: BorrowedFd<'_>, len: usize) -> Result<NonNull<c_void>> {
    let n = NonZeroUsize::new(len).ok_or_else(|| Error::invalid_argument("zero-length shared mapping"))?;
    // SAFETY: a fresh shared mapping of a file we hold; no existing memory is affected.
    unsafe { mmap(None, n, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd, 0) }
        .map_err(|e| Error::SystemError(format!("mapping shared host memory: {e}")))
}

/// Zeroed shared host memory, owned by this rank and visible to its device.
pub(crate) struct SharedHostBuffer {
    fd: OwnedFd,
    host: NonNull<c_void>,
    len: usize,
    device_addr: u64,
    registered: Option<Arc<CudaDevice>>,
}

// SAFETY: plain shared memory; concurrent access is atomic.
unsafe impl Send for SharedHostBuffer {}
// SAFETY: as above.
unsafe impl Sync for SharedHostBuffer {}

impl SharedHostBuffer {
    /// `len` bytes (rounded up to pages), zeroed.
    pub(crate) fn new(device: &Device, len: usize) -> Result<SharedHostBuffer> {
        let len = len.max(1).next_multiple_of(4096);
        let fd = nix::sys::memfd::memfd_create(c"devcomm-gin-shared", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
            .map_err(|e| Error::SystemError(format!("memfd_create: {e}")))?;
        nix::unistd::ftruncate(&fd, len as i64).map_err(|e| Error::SystemError(format!("ftruncate: {e}")))?;
        let host = map_shared(fd.as_fd(), len)?;
        let mut buf = SharedHostBuffer { fd, host, len, device_addr: host.as_ptr() as u64, registered: None };
        if let DeviceInner::Cuda(d) = &device.inner {
            d.bind()?;
            let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
            // SAFETY: a page-aligned mapping of `len` bytes owned by `buf`.
            unsafe { sys::cuMemHostRegister_v2(host.as_ptr(), len, flags) }
                .result()
                .map_err(|e| Error::CudaError(format!("cuMemHostRegister of {len} shared bytes: {e}")))?;
            buf.registered = Some(d.clone());
            let mut dptr = 0;
            // SAFETY: registered with DEVICEMAP above; valid out-pointer.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.as_ptr(), 0) }
                .result()
                .map_err(|e| Error::CudaError(format!("cuMemHostGetDevicePointer of shared memory: {e}")))?;
            buf.device_addr = dptr;
        }
        Ok(buf)
    }

    /// Host address of byte 0.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host.as_ptr() as *mut u8
    }

    /// Device address of byte 0.
    pub(crate) fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Length in bytes (whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A new descriptor of the memory, for a same-host peer.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd> {
        self.fd.as_fd().try_clone_to_owned().map_err(|e| Error::system("dup of a memfd", e))
    }
}

impl Drop for SharedHostBuffer {
    fn drop(&mut self) {
        if let Some(d) = &self.registered {
            d.drain_before_free();
            if d.bind().is_ok() {
                // SAFETY: registered in `new`, unregistered once.
                unsafe { sys::cuMemHostUnregister(self.host.as_ptr()) };
            }
        }
        // SAFETY: our own mapping, unmapped once.
        let _ = unsafe { munmap(self.host, self.len) };
    }
}

/// A same-host peer's [`SharedHostBuffer`] mapped into this process (host access only).
pub(crate) struct SharedHostMapping {
    host: NonNull<c_void>,
    len: usize,
}

// SAFETY: as for SharedHostBuffer.
unsafe impl Send for SharedHostMapping {}
// SAFETY: as above.
unsafe impl Sync for SharedHostMapping {}

impl SharedHostMapping {
    /// Maps `len` bytes of the memory behind `fd`.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> Result<SharedHostMapping> {
        Ok(SharedHostMapping { host: map_shared(fd, len)?, len })
    }

    /// Host address of byte 0.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host.as_ptr() as *mut u8
    }
}

impl Drop for SharedHostMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        let _ = unsafe { munmap(self.host, self.len) };
    }
}
