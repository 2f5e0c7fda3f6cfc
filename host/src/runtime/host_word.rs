//! [`HostMappedWord`]: one `u32` in host memory that kernels can read.
//!
//! On CUDA it is pinned host memory mapped into the device's address space
//! (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`, device address from
//! `cuMemHostGetDevicePointer_v2`); on the emulated runtime kernels run in
//! this process, so a plain heap word serves, its host address doubling as
//! the "device" address.
//!
//! `unsafe` invariants: the pinned allocation is owned by one wrapper, freed
//! once on drop, and only accessed as an `AtomicU32` (4-byte aligned: the
//! driver returns page-aligned memory).

use super::{cuda::CudaDevice, Device, DeviceInner};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

enum Backing {
    Cuda { dev: Arc<CudaDevice>, host: *mut c_void },
    Emulated(Box<AtomicU32>),
}

/// A host word the device can read (and the host can set at any time).
pub(crate) struct HostMappedWord {
    backing: Backing,
    device_addr: u64,
}

// SAFETY: the word is only accessed atomically; the pinned pointer is owned.
unsafe impl Send for HostMappedWord {}
// SAFETY: as above.
unsafe impl Sync for HostMappedWord {}

impl HostMappedWord {
    /// A new word, zero, visible to `device`.
    pub(crate) fn new(device: &Device) -> Result<HostMappedWord> {
        match &device.inner {
            DeviceInner::Emulated(_) => {
                let b = Box::new(AtomicU32::new(0));
                let device_addr = &*b as *const AtomicU32 as u64;
                Ok(HostMappedWord { backing: Backing::Emulated(b), device_addr })
            }
            DeviceInner::Cuda(d) => {
                d.bind()?;
                let mut host: *mut c_void = std::ptr::null_mut();
                let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
                // SAFETY: valid out-pointer; context bound above.
                unsafe { sys::cuMemHostAlloc(&mut host, 64, flags) }
                    .result()
                    .map_err(|e| Error::CudaError(format!("cuMemHostAlloc of the abort flag: {e}")))?;
                // SAFETY: `host` is 64 fresh bytes, page aligned.
                unsafe { (*(host as *const AtomicU32)).store(0, Ordering::SeqCst) };
                let mut dptr = 0;
                // SAFETY: `host` was allocated with DEVICEMAP; valid out-pointer.
                let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) }.result();
                if let Err(e) = r {
                    // SAFETY: allocated above, freed once.
                    unsafe { sys::cuMemFreeHost(host) };
                    return Err(Error::CudaError(format!("cuMemHostGetDevicePointer of the abort flag: {e}")));
                }
                Ok(HostMappedWord { backing: Backing::Cuda { dev: d.clone(), host }, device_addr: dptr })
            }
        }
    }

    fn word(&self) -> &AtomicU32 {
        match &self.backing {
            // SAFETY: `host` is a live, aligned allocation of 64 bytes owned by self.
            Backing::Cuda { host, .. } => unsafe { &*(*host as *const AtomicU32) },
            Backing::Emulated(b) => b,
        }
    }

    /// Sets the word (sequentially consistent store).
    pub(crate) fn set(&self, v: u32) {
        self.word().store(v, Ordering::SeqCst);
    }

    /// Reads the word.
    pub(crate) fn get(&self) -> u32 {
        self.word().load(Ordering::SeqCst)
    }

    /// The address kernels read the word at.
    pub(crate) fn device_addr(&self) -> u64 {
        self.device_addr
    }
}

impl Drop for HostMappedWord {
    fn drop(&mut self) {
        if let Backing::Cuda { dev, host } = &self.backing {
            dev.drain_before_free();
            if dev.bind().is_ok() {
                // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
                unsafe { sys::cuMemFreeHost(*host) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeSelection;

    #[test]
    fn emulated_word_is_readable_at_its_device_address() {
        let dev = Device::open(RuntimeSelection::Emulated, 0).unwrap();
        let w = HostMappedWord::new(&dev).unwrap();
        assert_eq!(w.get(), 0);
        w.set(1);
        // SAFETY: on the emulator the device address is this process's address of the word.
        let seen = unsafe { (*(w.device_addr() as *const AtomicU32)).load(Ordering::SeqCst) };
        assert_eq!(seen, 1);
    }
}
