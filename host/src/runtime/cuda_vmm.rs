//! CUDA virtual memory management: physical allocations exportable as POSIX
//! file descriptors, and reserved address ranges that peers' allocations are
//! mapped into.
//!
//! `unsafe` invariants: every `CUmemGenericAllocationHandle` is owned by one
//! wrapper and released once; every mapping is unmapped before its range is
//! freed; every call runs with the device's context bound.

use super::cuda::CudaDevice;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD: sys::CUmemAllocationHandleType = sys::CUmemAllocationHandleType_enum(1);

fn check(what: &str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| Error::CudaError(format!("{what}: {e}")))
}

/// Pinned device memory exportable as a POSIX fd; GPUDirect RDMA capable
/// where the device supports that for VMM allocations (as NCCL asks), so
/// that an RDMA NIC can register windows (the GIN verbs transport).
fn prop(dev: &CudaDevice) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all-zero is a valid value.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = POSIX_FD;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev.ordinal as i32;
    p.allocFlags.gpuDirectRDMACapable = u8::from(dev.gdr_with_vmm());
    p
}

fn access(ordinal: usize) -> sys::CUmemAccessDesc {
    // SAFETY: as in `prop`.
    let mut a: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    a.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = ordinal as i32;
    a.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    a
}

/// The allocation granularity of `dev` for shareable memory.
pub(crate) fn granularity(dev: &CudaDevice) -> Result<usize> {
    dev.bind()?;
    let p = prop(dev);
    let mut g = 0usize;
    // SAFETY: valid out-pointer and property struct.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    })?;
    Ok(g.max(1))
}

/// A physical allocation mapped at its own address on its device.
pub(crate) struct VmmAlloc {
    dev: Arc<CudaDevice>,
    handle: sys::CUmemGenericAllocationHandle,
    range: VmmRange,
    size: usize,
}

// SAFETY: driver handles are usable from any thread with the context bound.
unsafe impl Send for VmmAlloc {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for VmmAlloc {}

impl VmmAlloc {
    /// Allocates `size` bytes (a multiple of the granularity) on `dev`.
    pub(crate) fn new(dev: &Arc<CudaDevice>, size: usize) -> Result<VmmAlloc> {
        dev.bind()?;
        let p = prop(dev);
        let mut handle = 0;
        // SAFETY: valid out-pointer and property struct.
        check(&format!("cuMemCreate of {size} bytes"), unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) })?;
        let mut range = match VmmRange::reserve(dev, size) {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: handle just created, released once.
                unsafe { sys::cuMemRelease(handle) };
                return Err(e);
            }
        };
        // On failure `range` drops (unmapping nothing) and we release the handle.
        if let Err(e) = range.map_handle(0, handle, size) {
            drop(range);
            // SAFETY: as above.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        Ok(VmmAlloc { dev: dev.clone(), handle, range, size })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.range.base
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// A new file descriptor for the allocation, to send to a peer process.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd> {
        self.dev.bind()?;
        let mut fd: i32 = -1;
        // SAFETY: for POSIX_FD the out-parameter is an int.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, self.handle, POSIX_FD, 0)
        })?;
        // SAFETY: the driver returned a new descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for VmmAlloc {
    fn drop(&mut self) {
        self.range.unmap_all();
        if self.dev.bind().is_ok() {
            // SAFETY: owned handle, no mapping left, released once.
            unsafe { sys::cuMemRelease(self.handle) };
        }
    }
}

/// A reserved device address range with allocations mapped into it.
pub(crate) struct VmmRange {
    dev: Arc<CudaDevice>,
    base: u64,
    size: usize,
    /// (offset, length, imported handle to release or 0 when not owned)
    mapped: Vec<(usize, usize, sys::CUmemGenericAllocationHandle)>,
}

// SAFETY: as for VmmAlloc.
unsafe impl Send for VmmRange {}
// SAFETY: as above.
unsafe impl Sync for VmmRange {}

impl VmmRange {
    /// Reserves `size` bytes of device address space.
    pub(crate) fn reserve(dev: &Arc<CudaDevice>, size: usize) -> Result<VmmRange> {
        dev.bind()?;
        let mut base = 0;
        let align = granularity(dev)?;
        // SAFETY: valid out-pointer.
        check(&format!("cuMemAddressReserve of {size} bytes"), unsafe {
            sys::cuMemAddressReserve(&mut base, size, align, 0, 0)
        })?;
        Ok(VmmRange { dev: dev.clone(), base, size, mapped: Vec::new() })
    }

    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    fn check_span(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::internal(format!(
                "mapping {len} bytes at offset {offset} overflows a range of {}",
                self.size
            )));
        }
        Ok(())
    }

    fn map_handle(&mut self, offset: usize, handle: sys::CUmemGenericAllocationHandle, len: usize) -> Result<()> {
        self.check_span(offset, len)?;
        let at = self.base + offset as u64;
        // SAFETY: `at..at+len` lies in our reservation and is not mapped yet.
        check("cuMemMap", unsafe { sys::cuMemMap(at, len, 0, handle, 0) })?;
        let desc = access(self.dev.ordinal);
        // SAFETY: the span was just mapped.
        if let Err(e) = check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(at, len, &desc, 1) }) {
            // SAFETY: undo the mapping we made.
            unsafe { sys::cuMemUnmap(at, len) };
            return Err(e);
        }
        self.mapped.push((offset, len, 0));
        Ok(())
    }

    /// Imports a peer's allocation from `fd` and maps `len` bytes of it at `offset`.
    pub(crate) fn map_fd(&mut self, offset: usize, fd: BorrowedFd<'_>, len: usize) -> Result<()> {
        self.dev.bind()?;
        let mut handle = 0;
        // SAFETY: for POSIX_FD the OS handle is the descriptor's value cast to a pointer.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(&mut handle, fd.as_raw_fd() as usize as *mut c_void, POSIX_FD)
        })?;
        if let Err(e) = self.map_handle(offset, handle, len) {
            // SAFETY: imported above, not mapped.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        if let Some(last) = self.mapped.last_mut() {
            last.2 = handle;
        }
        Ok(())
    }

    fn unmap_all(&mut self) {
        if self.mapped.is_empty() {
            return;
        }
        self.dev.drain_before_free();
        if self.dev.bind().is_err() {
            return;
        }
        for (offset, len, handle) in self.mapped.drain(..) {
            // SAFETY: mapped by us, unmapped once; imported handles released once.
            unsafe {
                sys::cuMemUnmap(self.base + offset as u64, len);
                if handle != 0 {
                    sys::cuMemRelease(handle);
                }
            }
        }
    }
}

impl Drop for VmmRange {
    fn drop(&mut self) {
        self.unmap_all();
        if self.dev.bind().is_ok() {
            // SAFETY: reserved by us, nothing mapped any more, freed once.
            unsafe { sys::cuMemAddressFree(self.base, self.size) };
        }
    }
}
