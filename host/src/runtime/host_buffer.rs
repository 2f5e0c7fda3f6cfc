//! [`HostMappedBuffer`]: host memory that kernels can read and write.
//!
//! On CUDA: pinned memory mapped into the device's address space
//! (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`, device address from
//! `cuMemHostGetDevicePointer_v2`). On the emulated runtime kernels run in
//! this process, so page-aligned heap memory serves, its host address
//! doubling as the "device" address. Used for the GIN proxy's rings, tails,
//! signals and counters, which the GPU and a CPU thread share.
//!
//! `unsafe` invariants: the allocation is owned by one wrapper, zeroed at
//! creation, freed once on drop; concurrent access to its words goes through
//! atomics (the users' business, as with device memory).

use super::{cuda::CudaDevice, Device, DeviceInner};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::alloc::Layout;
use std::ffi::c_void;
use std::sync::Arc;

enum Backing {
    Cuda { dev: Arc<CudaDevice> },
    Emulated { layout: Layout },
}

/// Zeroed host memory visible to a device at [`HostMappedBuffer::device_addr`].
pub(crate) struct HostMappedBuffer {
    backing: Backing,
    host: *mut u8,
    len: usize,
    device_addr: u64,
}

// SAFETY: plain memory owned by the wrapper; concurrent access is atomic.
unsafe impl Send for HostMappedBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostMappedBuffer {}

impl HostMappedBuffer {
    /// `len` zeroed bytes (page aligned) visible to `device`.
    pub(crate) fn new(device: &Device, len: usize) -> Result<HostMappedBuffer> {
        let len = len.max(1);
        match &device.inner {
            DeviceInner::Emulated(_) => {
                let layout = Layout::from_size_align(len, 4096)
                    .map_err(|e| Error::invalid_argument(format!("host buffer of {len} bytes: {e}")))?;
                // SAFETY: non-zero size.
                let host = unsafe { std::alloc::alloc_zeroed(layout) };
                if host.is_null() {
                    return Err(Error::SystemError(format!("out of host memory allocating {len} bytes")));
                }
                Ok(HostMappedBuffer { backing: Backing::Emulated { layout }, host, len, device_addr: host as u64 })
            }
            DeviceInner::Cuda(d) => {
                d.bind()?;
                let mut host: *mut c_void = std::ptr::null_mut();
                let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
                // SAFETY: valid out-pointer; context bound above.
                unsafe { sys::cuMemHostAlloc(&mut host, len, flags) }
                    .result()
                    .map_err(|e| Error::CudaError(format!("cuMemHostAlloc of {len} bytes: {e}")))?;
                // SAFETY: `host` is `len` fresh bytes.
                unsafe { std::ptr::write_bytes(host as *mut u8, 0, len) };
                let mut dptr = 0;
                // SAFETY: `host` was allocated with DEVICEMAP; valid out-pointer.
                if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) }.result() {
                    // SAFETY: allocated above, freed once.
                    unsafe { sys::cuMemFreeHost(host) };
                    return Err(Error::CudaError(format!("cuMemHostGetDevicePointer: {e}")));
                }
                Ok(HostMappedBuffer {
                    backing: Backing::Cuda { dev: d.clone() },
                    host: host as *mut u8,
                    len,
                    device_addr: dptr,
                })
            }
        }
    }

    /// Host address of byte 0.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Device address of byte 0.
    pub(crate) fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Length in bytes.
    #[allow(dead_code)] // part of the type's contract; used by tests
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HostMappedBuffer {
    fn drop(&mut self) {
        match &self.backing {
            Backing::Emulated { layout } => {
                // SAFETY: allocated in `new` with this layout, freed once.
                unsafe { std::alloc::dealloc(self.host, *layout) }
            }
            Backing::Cuda { dev } => {
                dev.drain_before_free();
                if dev.bind().is_ok() {
                    // SAFETY: allocated with cuMemHostAlloc, freed once.
                    unsafe { sys::cuMemFreeHost(self.host as *mut c_void) };
                }
            }
        }
    }
}
