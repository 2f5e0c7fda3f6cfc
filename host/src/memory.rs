//! Symmetric memory (`ncclMemAlloc` / `ncclMemFree`): device memory that
//! peers on the same host can map, the raw material of [windows](crate::window).
//!
//! ```no_run
//! use devcomm::comm::Communicator;
//! # fn main() -> devcomm::Result<()> {
//! let comm = Communicator::init_from_env()?;
//! let mem = comm.mem_alloc(1 << 20)?; // freed on drop
//! mem.write(comm.device().stream(), 0, &[1u32, 2, 3])?;
//! let mut back = [0u32; 3];
//! mem.read(comm.device().stream(), 0, &mut back)?;
//! assert_eq!(back, [1, 2, 3]);
//! # Ok(()) }
//! ```

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::runtime::{Device, ShareableAlloc, Stream};
use bytemuck::Pod;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_ALLOC_ID: AtomicU64 = AtomicU64::new(1);

/// The live shareable allocations of this process (address, size, the
/// allocation), so that the point-to-point engine can tell whether a
/// pointer it is handed lies in memory a same-host peer can map.
type LiveAllocs = std::sync::Mutex<Vec<(u64, usize, std::sync::Weak<ShareableAlloc>)>>;
static LIVE_SHAREABLE: LiveAllocs = std::sync::Mutex::new(Vec::new());

fn remember_shareable(alloc: &Arc<ShareableAlloc>) {
    let mut live = LIVE_SHAREABLE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|(_, _, w)| w.strong_count() > 0);
    live.push((alloc.addr(), alloc.size(), Arc::downgrade(alloc)));
}

/// The live shareable allocation (made by [`SymmetricMemory::alloc`]) that
/// holds all of `addr .. addr + len`, if any.
pub(crate) fn find_shareable(addr: u64, len: usize) -> Option<Arc<ShareableAlloc>> {
    let live = LIVE_SHAREABLE.lock().unwrap_or_else(|p| p.into_inner());
    live.iter().find_map(|(a, size, w)| {
        let end = addr.checked_add(len as u64)?;
        (addr >= *a && end <= a + *size as u64).then(|| w.upgrade()).flatten()
    })
}

/// Device memory that can be registered as a symmetric [window](crate::window::Window)
/// (CUDA VMM memory with POSIX file-descriptor handles; a `memfd` on the
/// emulated runtime). Freed on drop; a window registered over it keeps the
/// physical memory alive until the window is released.
pub struct SymmetricMemory {
    pub(crate) alloc: Arc<ShareableAlloc>,
    pub(crate) id: u64,
    requested: usize,
    device: Device,
}

impl fmt::Debug for SymmetricMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SymmetricMemory")
            .field("addr", &format_args!("{:#x}", self.device_addr()))
            .field("size", &self.requested)
            .field("allocated", &self.alloc.size())
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl SymmetricMemory {
    /// Allocates `bytes` of symmetric memory on `device` (rounded up
    /// internally to [`Device::shareable_granularity`]).
    ///
    /// **The contents are undefined, not zeroed**, and registering the
    /// memory as a window does not clear it either: the emulated runtime
    /// fills fresh memory with `0xCB` bytes (so that a missing
    /// initialisation shows), a GPU hands out whatever its driver gives
    /// (often zeros, never promised). Write what kernels will read first
    /// (with [`SymmetricMemory::write`], e.g. `mem.write(stream, 0, &vec![0u8;
    /// mem.size()])`, or with a kernel), and make peers wait for it (e.g.
    /// [`Communicator::bootstrap_barrier`]) before they read this rank's
    /// window. What `create_dev_comm` allocates itself (barriers, resource
    /// buffers) does start zeroed.
    ///
    /// Errors: [`Error::InvalidArgument`] for 0 bytes or a size that overflows;
    /// [`Error::CudaError`] / [`Error::SystemError`] when the memory cannot be had.
    pub fn alloc(device: &Device, bytes: usize) -> Result<SymmetricMemory> {
        if bytes == 0 {
            return Err(Error::invalid_argument("symmetric allocation of 0 bytes"));
        }
        let alloc = Arc::new(ShareableAlloc::new(device, bytes)?);
        remember_shareable(&alloc);
        Ok(SymmetricMemory {
            alloc,
            id: NEXT_ALLOC_ID.fetch_add(1, Ordering::Relaxed),
            requested: bytes,
            device: device.clone(),
        })
    }

    /// The bytes asked for (usable by windows and the read/write helpers).
    pub fn size(&self) -> usize {
        self.requested
    }

    /// The bytes actually allocated (a multiple of the granularity, `>= size()`).
    pub fn allocated_size(&self) -> usize {
        self.alloc.size()
    }

    /// The device address of byte 0.
    pub fn device_addr(&self) -> u64 {
        self.alloc.addr()
    }

    /// The device the memory lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The region `offset .. offset + len`, for [`Communicator::register_window`].
    /// It is validated when registered.
    pub fn region(&self, offset: usize, len: usize) -> MemRegion<'_> {
        MemRegion { mem: self, offset, len }
    }

    fn check_span(&self, offset: usize, bytes: usize) -> Result<()> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.requested) {
            return Err(Error::invalid_argument(format!(
                "access of {bytes} bytes at offset {offset} is outside a symmetric allocation of {} bytes",
                self.requested
            )));
        }
        Ok(())
    }

    /// Copies `data` to byte `offset` through `stream` (a stream of this
    /// memory's device) and waits.
    ///
    /// Errors: [`Error::InvalidArgument`] when the span leaves the allocation.
    pub fn write<T: Pod>(&self, stream: &Stream, offset: usize, data: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.check_span(offset, bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        stream.write_raw(self.device_addr() + offset as u64, bytes)
    }

    /// Copies from byte `offset` into `out` through `stream` and waits.
    ///
    /// Errors: [`Error::InvalidArgument`] when the span leaves the allocation.
    pub fn read<T: Pod>(&self, stream: &Stream, offset: usize, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.check_span(offset, bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        stream.read_raw(self.device_addr() + offset as u64, bytes)
    }
}

/// A region of a [`SymmetricMemory`]: what [`Communicator::register_window`] registers.
#[derive(Clone, Copy, Debug)]
pub struct MemRegion<'a> {
    /// The allocation.
    pub mem: &'a SymmetricMemory,
    /// Byte offset of the region (must be a multiple of 4096 to register).
    pub offset: usize,
    /// Length in bytes (positive, within the allocation's [`SymmetricMemory::size`]).
    pub len: usize,
}

impl<'a> From<&'a SymmetricMemory> for MemRegion<'a> {
    fn from(mem: &'a SymmetricMemory) -> Self {
        MemRegion { mem, offset: 0, len: mem.size() }
    }
}

impl Communicator {
    /// Allocates `bytes` of symmetric memory on this rank's device
    /// (`ncclMemAlloc`); not collective. Free it by dropping it. Its
    /// contents are undefined, not zeroed (see [`SymmetricMemory::alloc`]).
    #[doc(alias = "ncclMemAlloc")]
    pub fn mem_alloc(&self, bytes: usize) -> Result<SymmetricMemory> {
        SymmetricMemory::alloc(self.device(), bytes)
    }
}
