//! Devices, streams, memory and kernel launches on two runtimes.
//!
//! * [`RuntimeKind::Cuda`]: real GPUs through the CUDA driver API (cudarc,
//!   loaded dynamically, so a binary starts on a machine without CUDA and
//!   reports that as [`Error::CudaError`]). Kernels come from PTX: the
//!   library's own, embedded at build time, or a user's [`Module`].
//! * [`RuntimeKind::Emulated`]: each device is host memory and a launch runs
//!   the same Rust kernel function on CPU threads, one per GPU thread, with
//!   working block barriers and per-block shared memory.
//!
//! [`RuntimeSelection`] picks one: explicitly, or `Auto` (CUDA when a GPU is
//! present, else emulated), overridable with `DEVCOMM_RUNTIME=cuda|emulated|auto`.
//!
//! # Which launch
//!
//! Both runtimes accept and refuse the same launches, so a program that
//! passes on the emulator does not fail on a GPU for being launched the
//! wrong way:
//!
//! * [`Stream::launch::<K>`](Stream::launch) runs the library's own kernels
//!   (those of `devcomm-kernels`, whose PTX is embedded in this crate). A
//!   kernel of any other crate is an [`Error::InvalidUsage`] that names
//!   `launch_in`, on both runtimes: the kernel's crate is known from its
//!   [`Kernel::MODULE_PATH`].
//! * [`Stream::launch_in::<K>(&module, ..)`](Stream::launch_in) runs `K`
//!   from a [`Module`]: a user's kernel crate built to PTX with
//!   `devcomm-build` and loaded with [`Device::load_module`] (once per
//!   device; keep the `Module`), or [`Device::library`]. A kernel that the
//!   module does not hold is an [`Error::InvalidArgument`] on both runtimes:
//!   the emulated runtime does not compile the PTX, but reads its `.entry`
//!   names. `devcomm_device::kernel` shows a whole user kernel crate, its
//!   `build.rs`, and the embedding of its PTX.
//!
//! A module has no global registry to search: a kernel's name alone does
//! not say which PTX holds it (two crates may both export an `axpy`), and
//! a launch that names its module cannot pick the wrong one.
//!
//! ```no_run
//! use devcomm::runtime::{Device, LaunchConfig, RuntimeSelection};
//! use devcomm_kernels::util::axpy_f32;
//!
//! # fn main() -> devcomm::Result<()> {
//! let dev = Device::open(RuntimeSelection::from_env()?, 0)?;
//! let stream = dev.stream();
//! let n = 1000;
//! let x = dev.alloc_from(&vec![1.0f32; n])?;
//! let y = dev.alloc_from(&vec![2.0f32; n])?;
//! let out = dev.alloc::<f32>(n)?;
//! // SAFETY: x, y and out hold n elements and outlive the launch (we synchronize below).
//! unsafe {
//!     stream.launch::<axpy_f32>(
//!         LaunchConfig::for_elements(n as u32, 256),
//!         (3.0, x.as_ptr(), y.as_ptr(), out.as_mut_ptr(), n as u32),
//!     )?;
//! }
//! assert_eq!(stream.read_vec(&out)?, vec![5.0f32; n]);
//! # Ok(())
//! # }
//! ```

mod cuda;
mod cuda_vmm;
mod emulated;
mod host_buffer;
mod host_word;
mod peer_access;
mod shared_host;

pub(crate) use host_buffer::HostMappedBuffer;
pub(crate) use host_word::HostMappedWord;
pub(crate) use peer_access::cuda_can_access_uuid;
pub(crate) use shared_host::{SharedHostBuffer, SharedHostMapping};

use crate::error::{Error, Result};
use bytemuck::Pod;
use devcomm_device::{Dim3, Kernel};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// Which runtime a [`Device`] belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeKind {
    /// Real GPUs through the CUDA driver.
    Cuda,
    /// Host memory and CPU threads standing in for GPUs.
    Emulated,
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuntimeKind::Cuda => "cuda",
            RuntimeKind::Emulated => "emulated",
        })
    }
}

/// How to choose a runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RuntimeSelection {
    /// CUDA when the driver loads and reports at least one GPU, else emulated.
    #[default]
    Auto,
    /// CUDA, or an error if it is not available.
    Cuda,
    /// The emulated runtime.
    Emulated,
}

impl RuntimeSelection {
    /// The environment variable that overrides the selection.
    pub const ENV: &'static str = "DEVCOMM_RUNTIME";

    /// Reads [`Self::ENV`] (`auto`, `cuda` or `emulated`; unset means `auto`).
    pub fn from_env() -> Result<Self> {
        match std::env::var(Self::ENV) {
            Ok(v) => v.parse(),
            Err(std::env::VarError::NotPresent) => Ok(RuntimeSelection::Auto),
            Err(e) => Err(Error::invalid_argument(format!("{}: {e}", Self::ENV))),
        }
    }

    /// Resolves `Auto` to a concrete kind.
    pub fn resolve(self) -> Result<RuntimeKind> {
        match self {
            RuntimeSelection::Cuda => {
                cuda::device_count()?;
                Ok(RuntimeKind::Cuda)
            }
            RuntimeSelection::Emulated => Ok(RuntimeKind::Emulated),
            RuntimeSelection::Auto => Ok(match cuda::device_count() {
                Ok(n) if n > 0 => RuntimeKind::Cuda,
                _ => RuntimeKind::Emulated,
            }),
        }
    }
}

impl std::str::FromStr for RuntimeSelection {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(RuntimeSelection::Auto),
            "cuda" | "gpu" => Ok(RuntimeSelection::Cuda),
            "emulated" | "emu" | "cpu" => Ok(RuntimeSelection::Emulated),
            other => {
                Err(Error::invalid_argument(format!("unknown runtime {other:?}: expected auto, cuda or emulated")))
            }
        }
    }
}

/// Number of devices of the runtime `sel` resolves to.
pub fn device_count(sel: RuntimeSelection) -> Result<(RuntimeKind, usize)> {
    let kind = sel.resolve()?;
    let n = match kind {
        RuntimeKind::Cuda => cuda::device_count()?,
        RuntimeKind::Emulated => emulated::device_count(),
    };
    Ok((kind, n))
}

/// Grid, block and dynamic shared memory of a launch, and whether its
/// blocks must all be resident at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks per grid.
    pub grid: Dim3,
    /// Threads per block.
    pub block: Dim3,
    /// Bytes of dynamic shared memory per block.
    pub shared_mem_bytes: u32,
    /// Every block resident at the same time ([`LaunchConfig::co_resident`]).
    pub co_resident: bool,
}

impl LaunchConfig {
    /// Most threads in one block.
    pub const MAX_THREADS_PER_BLOCK: u64 = 1024;
    /// Most dynamic shared memory per block (Hopper: 227 KiB).
    pub const MAX_SHARED_MEM_BYTES: u32 = 227 * 1024;

    /// A launch of `grid` blocks of `block` threads, no shared memory.
    pub fn new(grid: impl Into<Dim3>, block: impl Into<Dim3>) -> Self {
        LaunchConfig { grid: grid.into(), block: block.into(), shared_mem_bytes: 0, co_resident: false }
    }

    /// One thread per element, `block` threads per block (1-D).
    pub fn for_elements(n: u32, block: u32) -> Self {
        let block = block.max(1);
        LaunchConfig::new(n.div_ceil(block).max(1), block)
    }

    /// The same launch with `bytes` of dynamic shared memory per block.
    pub fn with_shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem_bytes = bytes;
        self
    }

    /// The same launch with every block resident at the same time: a
    /// cooperative launch on CUDA (`cuLaunchCooperativeKernel`, which fails
    /// when the grid cannot be resident at once), one wave of the whole
    /// grid on the emulator (which fails when it exceeds
    /// `DEVCOMM_EMU_MAX_THREADS`).
    ///
    /// A kernel whose blocks wait for each other — one block spins on what
    /// another block of the same grid writes, a grid-wide barrier, or
    /// blocks of several ranks that wait for each other pairwise — needs it:
    /// without it a GPU may run part of the grid first (when other work
    /// holds some SMs), and the emulator's strict mode
    /// (`DEVCOMM_EMU_STRICT=1`) does so on purpose, so such a kernel hangs
    /// there until its device timeout.
    pub fn co_resident(mut self) -> Self {
        self.co_resident = true;
        self
    }

    /// Checks the limits every CUDA GPU of compute capability 9.0 enforces.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::invalid_argument(format!("launch config {self:?}: {what}")));
        let (g, b) = (self.grid, self.block);
        if g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0 {
            return bad("every grid and block dimension must be at least 1".into());
        }
        if b.volume() > Self::MAX_THREADS_PER_BLOCK {
            return bad(format!("{} threads per block, at most {}", b.volume(), Self::MAX_THREADS_PER_BLOCK));
        }
        if b.z > 64 {
            return bad("block.z is at most 64".into());
        }
        if g.x > i32::MAX as u32 || g.y > 65535 || g.z > 65535 {
            return bad("grid is at most 2^31-1 x 65535 x 65535".into());
        }
        if self.shared_mem_bytes > Self::MAX_SHARED_MEM_BYTES {
            return bad(format!(
                "{} bytes of dynamic shared memory, at most {}",
                self.shared_mem_bytes,
                Self::MAX_SHARED_MEM_BYTES
            ));
        }
        Ok(())
    }
}

#[derive(Clone)]
enum DeviceInner {
    Cuda(Arc<cuda::CudaDevice>),
    Emulated(Arc<emulated::EmuDevice>),
}

/// One GPU (or one emulated GPU). Cheap to clone.
#[derive(Clone)]
pub struct Device {
    inner: DeviceInner,
    default_stream: Stream,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("kind", &self.kind())
            .field("ordinal", &self.ordinal())
            .field("name", &self.name())
            .finish()
    }
}

impl Device {
    /// Opens device `ordinal` of the runtime `sel` resolves to.
    ///
    /// Errors: [`Error::CudaError`] when CUDA is asked for and absent or
    /// failing; [`Error::InvalidArgument`] when `ordinal` is out of range.
    pub fn open(sel: RuntimeSelection, ordinal: usize) -> Result<Device> {
        let inner = match sel.resolve()? {
            RuntimeKind::Cuda => DeviceInner::Cuda(cuda::CudaDevice::open(ordinal)?),
            RuntimeKind::Emulated => DeviceInner::Emulated(emulated::EmuDevice::open(ordinal)?),
        };
        let stream_inner = match &inner {
            DeviceInner::Cuda(d) => StreamInner::Cuda(Arc::new(d.default_stream()?)),
            DeviceInner::Emulated(d) => StreamInner::Emulated(d.new_stream()),
        };
        let owner = device_key(&inner);
        Ok(Device { inner, default_stream: Stream { inner: stream_inner, owner } })
    }

    /// The runtime this device belongs to.
    pub fn kind(&self) -> RuntimeKind {
        match &self.inner {
            DeviceInner::Cuda(_) => RuntimeKind::Cuda,
            DeviceInner::Emulated(_) => RuntimeKind::Emulated,
        }
    }

    /// The device's ordinal within its runtime.
    pub fn ordinal(&self) -> usize {
        match &self.inner {
            DeviceInner::Cuda(d) => d.ordinal,
            DeviceInner::Emulated(d) => d.ordinal,
        }
    }

    /// A human-readable name ("NVIDIA H200", "emulated device 3").
    pub fn name(&self) -> String {
        match &self.inner {
            DeviceInner::Cuda(d) => d.name.clone(),
            DeviceInner::Emulated(d) => format!("emulated device {}", d.ordinal),
        }
    }

    /// A 16-byte identifier: the GPU's UUID, or a stable one per emulated ordinal.
    pub fn uuid(&self) -> [u8; 16] {
        match &self.inner {
            DeviceInner::Cuda(d) => d.uuid,
            DeviceInner::Emulated(d) => d.uuid(),
        }
    }

    /// Number of streaming multiprocessors (CPU threads' stand-in on the emulator).
    pub fn multiprocessor_count(&self) -> u32 {
        match &self.inner {
            DeviceInner::Cuda(d) => d.sm_count,
            DeviceInner::Emulated(_) => emulated::EMULATED_SM_COUNT,
        }
    }

    /// The device's default stream (a stream of its own, not CUDA's legacy stream 0).
    pub fn stream(&self) -> &Stream {
        &self.default_stream
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        let inner = match &self.inner {
            DeviceInner::Cuda(d) => StreamInner::Cuda(Arc::new(d.new_stream()?)),
            DeviceInner::Emulated(d) => StreamInner::Emulated(d.new_stream()),
        };
        Ok(Stream { inner, owner: device_key(&self.inner) })
    }

    /// Waits for all work on all of this device's streams.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            DeviceInner::Cuda(d) => d.synchronize(),
            DeviceInner::Emulated(d) => d.synchronize(),
        }
    }

    /// Allocates `len` elements of device memory. The contents are undefined
    /// (the emulator fills them with a poison pattern).
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::invalid_argument(format!("allocation of {len} elements overflows")))?;
        let raw = match &self.inner {
            DeviceInner::Cuda(d) => RawAlloc::Cuda(d.alloc(bytes)?),
            DeviceInner::Emulated(_) => RawAlloc::Emulated(emulated::HostAlloc::new(bytes)?),
        };
        Ok(DeviceBuffer { raw, len, device: self.clone(), _t: PhantomData })
    }

    /// Allocates device memory and copies `data` into it (waits for the copy).
    pub fn alloc_from<T: Pod>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut buf = self.alloc(data.len())?;
        self.stream().write(&mut buf, data)?;
        Ok(buf)
    }

    /// Granularity of shareable (symmetric) allocations: 2 MiB on current
    /// GPUs, 4096 bytes on the emulator.
    pub fn shareable_granularity(&self) -> Result<usize> {
        match &self.inner {
            DeviceInner::Cuda(d) => cuda_vmm::granularity(d),
            DeviceInner::Emulated(_) => Ok(emulated::shm::GRANULARITY),
        }
    }

    /// Whether this device can load and store `peer`'s memory directly
    /// (CUDA peer access; always true between emulated devices).
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        match (&self.inner, &peer.inner) {
            (DeviceInner::Cuda(a), DeviceInner::Cuda(b)) => a.can_access_peer(b),
            (DeviceInner::Emulated(_), DeviceInner::Emulated(_)) => Ok(true),
            _ => Ok(false),
        }
    }

    /// A dmabuf file descriptor for `len` bytes of this device's memory at
    /// `addr` (both multiples of the host page size), for an RDMA NIC to
    /// register (GPUDirect RDMA without `nvidia-peermem`): CUDA's
    /// `cuMemGetHandleForAddressRange(..., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)`.
    /// `Ok(None)` where there is no such thing: the emulated runtime (its
    /// device memory is host memory, registered by address), or a driver
    /// without the call or without dmabuf support on this device.
    ///
    /// Errors: [`Error::CudaError`] when the driver refuses the range.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn export_dmabuf(&self, addr: u64, len: u64) -> Result<Option<std::os::fd::OwnedFd>> {
        match &self.inner {
            DeviceInner::Cuda(d) => d.export_dmabuf(addr, len),
            DeviceInner::Emulated(_) => Ok(None),
        }
    }

    /// Where `addr` lives: `Some(ordinal)` for memory of CUDA GPU `ordinal`,
    /// `None` for host memory. On the emulated runtime every address is
    /// this device's (its device memory is host memory).
    pub(crate) fn pointer_device(&self, addr: u64) -> Result<Option<usize>> {
        match &self.inner {
            DeviceInner::Cuda(d) => d.pointer_device(addr),
            DeviceInner::Emulated(d) => Ok(Some(d.ordinal)),
        }
    }

    /// Loads a PTX module (a user's kernel crate built with `devcomm-build`),
    /// whose kernels [`Stream::launch_in`] launches. Load it once per device
    /// and keep the [`Module`]: each call loads the PTX again.
    ///
    /// On the emulated runtime the PTX is not compiled (kernels run from
    /// their host form), but its `.entry` names are read, so that launching
    /// a kernel the module does not hold fails there as on a GPU.
    ///
    /// Errors: [`Error::InvalidArgument`] for text with a NUL byte;
    /// [`Error::CudaError`] when the driver rejects the PTX (not for sm_90,
    /// incomplete).
    pub fn load_module(&self, ptx: &str) -> Result<Module> {
        match &self.inner {
            DeviceInner::Cuda(d) => Ok(Module { inner: ModuleInner::Cuda(d.load_module(ptx)?), library: false }),
            DeviceInner::Emulated(_) => {
                if ptx.contains('\0') {
                    return Err(Error::invalid_argument("PTX text contains a NUL byte"));
                }
                Ok(Module { inner: ModuleInner::Emulated(Arc::new(cuda::ptx_entries(ptx))), library: false })
            }
        }
    }

    /// The library's own kernels (`devcomm-kernels`), loaded once per device
    /// (every kernel at once: see [`NO_PRELOAD_ENV`]): what [`Stream::launch`]
    /// launches from. `create_dev_comm` loads it when GIN is asked for, so
    /// that no library kernel loads while a kernel waits for the GIN proxy.
    pub fn library(&self) -> Result<Module> {
        match &self.inner {
            DeviceInner::Cuda(d) => Ok(Module { inner: ModuleInner::Cuda(d.library()?), library: true }),
            DeviceInner::Emulated(d) => {
                emulated::load_modules(d.ordinal)?;
                // The same entry names as on a GPU, where the PTX is there
                // (none with DEVCOMM_SKIP_PTX: the launches still run).
                static ENTRIES: std::sync::OnceLock<Arc<Vec<String>>> = std::sync::OnceLock::new();
                let entries = ENTRIES.get_or_init(|| {
                    Arc::new(crate::ptx::kernels_ptx().map(|p| cuda::ptx_entries(&p)).unwrap_or_default())
                });
                Ok(Module { inner: ModuleInner::Emulated(entries.clone()), library: true })
            }
        }
    }
}

/// Identity of a device object, to tell whether a buffer and a stream match.
fn device_key(inner: &DeviceInner) -> usize {
    match inner {
        DeviceInner::Cuda(d) => Arc::as_ptr(d) as *const () as usize,
        DeviceInner::Emulated(d) => Arc::as_ptr(d) as *const () as usize,
    }
}

/// Physical memory that other processes on the host can map: CUDA VMM
/// memory exported as a POSIX file descriptor, or an emulated memfd.
pub(crate) enum ShareableAlloc {
    Cuda(cuda_vmm::VmmAlloc),
    Emulated(emulated::shm::ShmAlloc),
}

impl ShareableAlloc {
    /// Allocates at least `bytes` (rounded up to [`Device::shareable_granularity`]).
    pub(crate) fn new(device: &Device, bytes: usize) -> Result<ShareableAlloc> {
        let g = device.shareable_granularity()?;
        let size = bytes
            .max(1)
            .checked_next_multiple_of(g)
            .ok_or_else(|| Error::invalid_argument(format!("allocation of {bytes} bytes overflows")))?;
        Ok(match &device.inner {
            DeviceInner::Cuda(d) => ShareableAlloc::Cuda(cuda_vmm::VmmAlloc::new(d, size)?),
            DeviceInner::Emulated(_) => ShareableAlloc::Emulated(emulated::shm::ShmAlloc::new(size)?),
        })
    }

    pub(crate) fn addr(&self) -> u64 {
        match self {
            ShareableAlloc::Cuda(a) => a.addr(),
            ShareableAlloc::Emulated(a) => a.addr(),
        }
    }

    pub(crate) fn size(&self) -> usize {
        match self {
            ShareableAlloc::Cuda(a) => a.size(),
            ShareableAlloc::Emulated(a) => a.size(),
        }
    }

    pub(crate) fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        match self {
            ShareableAlloc::Cuda(a) => a.export_fd(),
            ShareableAlloc::Emulated(a) => a.export_fd(),
        }
    }
}

/// A reserved device address range that shareable allocations (ours and
/// peers') are mapped into.
pub(crate) enum AddressRange {
    Cuda(cuda_vmm::VmmRange),
    Emulated(emulated::shm::ShmRange),
}

impl AddressRange {
    pub(crate) fn reserve(device: &Device, bytes: usize) -> Result<AddressRange> {
        Ok(match &device.inner {
            DeviceInner::Cuda(d) => AddressRange::Cuda(cuda_vmm::VmmRange::reserve(d, bytes)?),
            DeviceInner::Emulated(_) => AddressRange::Emulated(emulated::shm::ShmRange::reserve(bytes)?),
        })
    }

    pub(crate) fn base(&self) -> u64 {
        match self {
            AddressRange::Cuda(r) => r.base(),
            AddressRange::Emulated(r) => r.base(),
        }
    }

    /// Maps `len` bytes of the allocation behind `fd` at `offset`.
    pub(crate) fn map_fd(&mut self, offset: usize, fd: std::os::fd::BorrowedFd<'_>, len: usize) -> Result<()> {
        match self {
            AddressRange::Cuda(r) => r.map_fd(offset, fd, len),
            AddressRange::Emulated(r) => r.map_fd(offset, fd, len),
        }
    }

    /// Notes that `len` bytes at `offset` map another device's memory (the
    /// emulator's strict mode treats stores there differently at barriers;
    /// nothing on CUDA).
    pub(crate) fn mark_peer(&mut self, offset: usize, len: usize) {
        if let AddressRange::Emulated(r) = self {
            r.mark_peer(offset, len);
        }
    }
}

/// A loaded kernel module: a user's PTX ([`Device::load_module`]) or the
/// library's ([`Device::library`]). Cheap to clone.
#[derive(Clone)]
pub struct Module {
    inner: ModuleInner,
    /// Whether this is the library's module (`devcomm-kernels`).
    library: bool,
}

#[derive(Clone)]
enum ModuleInner {
    Cuda(Arc<cuda::CudaModule>),
    /// The `.entry` names of the PTX (for the library's module: of its
    /// embedded PTX, which holds exactly the kernels of `devcomm-kernels`).
    Emulated(Arc<Vec<String>>),
}

impl Module {
    /// The PTX entry names (`.entry`) of the module.
    pub fn entry_names(&self) -> &[String] {
        match &self.inner {
            ModuleInner::Cuda(m) => m.entry_names(),
            ModuleInner::Emulated(e) => e,
        }
    }

    /// Whether this is the library's own module ([`Device::library`]).
    pub fn is_library(&self) -> bool {
        self.library
    }

    /// Checks, alike on both runtimes, that `K` is in this module: a
    /// library kernel for the library's module, an entry of the PTX for a
    /// user's. (The CUDA driver looks the entry up again at the launch.)
    fn check_holds<K: Kernel>(&self) -> Result<()> {
        if self.library {
            if K::crate_name() == LIBRARY_KERNEL_CRATE {
                return Ok(());
            }
            return Err(Error::invalid_argument(format!(
                "kernel `{}` (declared in `{}`) is not in devcomm's library module: load its crate's PTX with \
                 Device::load_module and launch it from that module",
                K::NAME,
                K::MODULE_PATH
            )));
        }
        if self.entry_names().iter().any(|e| e == K::NAME) {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "kernel {:?} is not in this module (entries: {}); was the PTX built from the crate that \
                 declares it ({}), and rebuilt since?",
                K::NAME,
                self.entry_names().join(", "),
                K::crate_name()
            )))
        }
    }
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runtime = match &self.inner {
            ModuleInner::Cuda(_) => RuntimeKind::Cuda,
            ModuleInner::Emulated(_) => RuntimeKind::Emulated,
        };
        f.debug_struct("Module")
            .field("runtime", &runtime)
            .field("library", &self.library)
            .field("entries", &self.entry_names())
            .finish()
    }
}

/// The crate of the library's own kernels, as `module_path!()` spells it.
pub(crate) const LIBRARY_KERNEL_CRATE: &str = "devcomm_kernels";

/// `Ok` when `K` is one of the library's kernels (declared in
/// `devcomm-kernels`), else the error that sends the caller to `launch_in`.
fn check_library_kernel<K: Kernel>() -> Result<()> {
    if K::crate_name() == LIBRARY_KERNEL_CRATE {
        return Ok(());
    }
    Err(Error::invalid_usage(format!(
        "kernel `{}` (declared in `{}`) is not one of devcomm's own kernels ({LIBRARY_KERNEL_CRATE}), the only \
         ones Stream::launch runs, on every runtime: build its crate to PTX with devcomm-build, load it once \
         with Device::load_module, and launch with Stream::launch_in::<{}>(&module, ..)",
        K::NAME,
        K::MODULE_PATH,
        K::NAME
    )))
}

#[derive(Clone)]
enum StreamInner {
    Cuda(Arc<cuda::CudaStreamHandle>),
    Emulated(Arc<emulated::EmuStream>),
}

/// Set (to anything) to stop `Device::load_module` from loading every
/// kernel of a module when it loads it: the kernels then load at their
/// first launch, as CUDA's lazy loading does. For tests of that hazard
/// only: a first launch queued behind a running kernel that waits for the
/// GIN proxy can then deadlock (issue 13; `benches/results/2026-11-23-h200-gin-lazy-loading.md`).
pub const NO_PRELOAD_ENV: &str = "DEVCOMM_NO_PRELOAD";

pub(crate) fn preload_disabled() -> bool {
    std::env::var_os(NO_PRELOAD_ENV).is_some()
}

/// Set (to anything) to free device and pinned memory without waiting for
/// the device first: the free's own wait then holds the driver's lock
/// while kernels run, as a plain `cudaFree` does. For tests of that hazard
/// only: a kernel waiting for the GIN proxy then deadlocks with the free
/// until its device wait times out (issue 15; `tests/gin.rs`).
pub const NO_DRAIN_ENV: &str = "DEVCOMM_NO_DRAIN_BEFORE_FREE";

pub(crate) fn drain_disabled() -> bool {
    std::env::var_os(NO_DRAIN_ENV).is_some()
}

/// An in-order queue of work on one device. Cheap to clone.
#[derive(Clone)]
pub struct Stream {
    inner: StreamInner,
    owner: usize,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").finish_non_exhaustive()
    }
}

impl Stream {
    /// The raw `CUstream` (as an integer), for calling other CUDA libraries
    /// (NCCL, cuBLAS) on this stream; `None` on the emulated runtime. Binds
    /// the device's context to the calling thread first, as such calls need.
    ///
    /// Errors: [`Error::CudaError`] when the context cannot be bound.
    pub fn cu_stream(&self) -> Result<Option<u64>> {
        match &self.inner {
            StreamInner::Cuda(s) => {
                s.device.bind()?;
                Ok(Some(s.cu_stream() as u64))
            }
            StreamInner::Emulated(_) => Ok(None),
        }
    }

    /// Launches the library kernel `K` (from `devcomm-kernels`), from the
    /// library's embedded PTX on a GPU.
    ///
    /// Errors, alike on both runtimes: [`Error::InvalidUsage`] when `K` is
    /// not one of the library's kernels (a kernel of your own crate: load its
    /// PTX with [`Device::load_module`] and use [`Stream::launch_in`]; see
    /// the [module docs](self)); [`Error::InvalidArgument`] for a launch
    /// configuration beyond the GPU's limits.
    ///
    /// # Safety
    ///
    /// The kernel dereferences whatever pointers `args` carries: they must
    /// be valid device memory of this device (or of peers it can reach) for
    /// the kernel's whole run, as the kernel's own contract says.
    pub unsafe fn launch<K: Kernel>(&self, cfg: LaunchConfig, args: K::Args) -> Result<()> {
        check_library_kernel::<K>()?;
        cfg.validate()?;
        match &self.inner {
            StreamInner::Cuda(s) => {
                let module = s.device.library()?;
                // SAFETY: forwarded from the caller.
                unsafe { s.launch(&module, K::NAME, cfg, &args) }
            }
            // SAFETY: forwarded from the caller.
            StreamInner::Emulated(s) => unsafe { s.launch::<K>(cfg, args) },
        }
    }

    /// Launches kernel `K` from `module`: a user's kernel crate loaded with
    /// [`Device::load_module`] (see the [module docs](self)), or the
    /// library's ([`Device::library`]).
    ///
    /// Errors, alike on both runtimes: [`Error::InvalidArgument`] when
    /// `module` does not hold `K` (not among its PTX entries; for the
    /// library's module, not a kernel of `devcomm-kernels`) or for a launch
    /// configuration beyond the GPU's limits; [`Error::InvalidUsage`] when
    /// the module and the stream belong to different runtimes.
    ///
    /// # Safety
    ///
    /// As for [`Stream::launch`]; and the PTX of `module` was built from the
    /// same source as `K` (its entry of that name takes `K::Args`).
    pub unsafe fn launch_in<K: Kernel>(&self, module: &Module, cfg: LaunchConfig, args: K::Args) -> Result<()> {
        cfg.validate()?;
        match (&self.inner, &module.inner) {
            (StreamInner::Cuda(s), ModuleInner::Cuda(m)) => {
                module.check_holds::<K>()?;
                // SAFETY: forwarded from the caller.
                unsafe { s.launch(m, K::NAME, cfg, &args) }
            }
            (StreamInner::Emulated(s), ModuleInner::Emulated(_)) => {
                module.check_holds::<K>()?;
                // SAFETY: forwarded from the caller.
                unsafe { s.launch::<K>(cfg, args) }
            }
            _ => Err(Error::invalid_usage("module and stream belong to different runtimes")),
        }
    }

    /// Copies `src` into `dst` and waits for the copy.
    pub fn write<T: Pod>(&self, dst: &mut DeviceBuffer<T>, src: &[T]) -> Result<()> {
        self.check_buffer(&dst.device)?;
        if src.len() != dst.len {
            return Err(Error::invalid_argument(format!(
                "copy of {} elements into a buffer of {}",
                src.len(),
                dst.len
            )));
        }
        let bytes: &[u8] = bytemuck::cast_slice(src);
        match &self.inner {
            StreamInner::Cuda(s) => s.write(dst.raw.addr(), bytes),
            StreamInner::Emulated(s) => s.write(dst.raw.addr(), bytes),
        }
    }

    /// Copies `src` into `dst` and waits for the copy.
    pub fn read<T: Pod>(&self, src: &DeviceBuffer<T>, dst: &mut [T]) -> Result<()> {
        self.check_buffer(&src.device)?;
        if src.len != dst.len() {
            return Err(Error::invalid_argument(format!(
                "copy of a buffer of {} elements into {}",
                src.len,
                dst.len()
            )));
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        match &self.inner {
            StreamInner::Cuda(s) => s.read(src.raw.addr(), bytes),
            StreamInner::Emulated(s) => s.read(src.raw.addr(), bytes),
        }
    }

    /// Copies `src` to device address `dst` and waits. The caller guarantees
    /// `dst..dst + src.len()` is device memory of this stream's device (or
    /// mapped into it).
    pub(crate) fn write_raw(&self, dst: u64, src: &[u8]) -> Result<()> {
        match &self.inner {
            StreamInner::Cuda(s) => s.write(dst, src),
            StreamInner::Emulated(s) => s.write(dst, src),
        }
    }

    /// Copies from device address `src` into `dst` and waits (as [`Self::write_raw`]).
    pub(crate) fn read_raw(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        match &self.inner {
            StreamInner::Cuda(s) => s.read(src, dst),
            StreamInner::Emulated(s) => s.read(src, dst),
        }
    }

    /// As [`Self::write_raw`], but gives up with [`Error::Timeout`] once the
    /// stream has not run the copy within `limit` (a wedged device must not
    /// hang the GIN proxy). `src` must be pageable memory (a `Vec`, never
    /// pinned or registered): it is no longer in use when this returns,
    /// also on a timeout.
    pub(crate) fn write_raw_within(&self, dst: u64, src: &[u8], limit: std::time::Duration) -> Result<()> {
        match &self.inner {
            StreamInner::Cuda(s) => s.write_within(dst, src, limit),
            StreamInner::Emulated(s) => s.write_within(dst, src, limit),
        }
    }

    /// As [`Self::read_raw`], bounded as [`Self::write_raw_within`] (`dst`
    /// pageable; not written to after this returns, also on a timeout).
    pub(crate) fn read_raw_within(&self, src: u64, dst: &mut [u8], limit: std::time::Duration) -> Result<()> {
        match &self.inner {
            StreamInner::Cuda(s) => s.read_within(src, dst, limit),
            StreamInner::Emulated(s) => s.read_within(src, dst, limit),
        }
    }

    /// Reads a whole buffer into a new vector.
    pub fn read_vec<T: Pod>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); src.len];
        self.read(src, &mut v)?;
        Ok(v)
    }

    /// Sets every byte of `dst` to `value` (asynchronously, in stream order).
    pub fn memset<T: Pod>(&self, dst: &mut DeviceBuffer<T>, value: u8) -> Result<()> {
        self.check_buffer(&dst.device)?;
        let n = dst.num_bytes();
        match &self.inner {
            StreamInner::Cuda(s) => s.memset(dst.raw.addr(), value, n),
            StreamInner::Emulated(s) => s.memset(dst.raw.addr(), value, n),
        }
    }

    /// Queues a copy of `bytes` between two device addresses (the copy engine
    /// on a GPU; peer mappings included). Asynchronous: returns once queued.
    ///
    /// # Safety
    ///
    /// `src..src+bytes` and `dst..dst+bytes` are device memory this device can
    /// access (its own, or a peer's mapped into it), alive until the stream
    /// passes this point, and do not overlap.
    pub unsafe fn memcpy_raw(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        match &self.inner {
            // SAFETY: forwarded from the caller.
            StreamInner::Cuda(s) => unsafe { s.memcpy(dst, src, bytes) },
            // SAFETY: forwarded from the caller.
            StreamInner::Emulated(s) => unsafe { s.memcpy(dst, src, bytes) },
        }
    }

    /// Queues `copies` (dst, src, bytes) as one batch (`cuMemcpyBatchAsync`
    /// where the driver has it: one driver call for all). The copies of a
    /// batch may run in any order and concurrently; the batch as a whole is
    /// ordered in the stream.
    ///
    /// # Safety
    ///
    /// As for [`Stream::memcpy_raw`], for each copy; and no copy's
    /// destination overlaps another copy's source or destination.
    pub unsafe fn memcpy_batch_raw(&self, copies: &[(u64, u64, usize)]) -> Result<()> {
        match &self.inner {
            // SAFETY: forwarded from the caller.
            StreamInner::Cuda(s) => unsafe { s.memcpy_batch(copies) },
            // SAFETY: forwarded from the caller.
            StreamInner::Emulated(s) => unsafe { s.memcpy_batch(copies) },
        }
    }

    /// Queues 64-bit stores `(address, value, barrier)`, in order, executed
    /// by the stream itself (CUDA stream memory operations): `barrier`
    /// makes the store visible only after everything queued before it.
    /// Check [`Stream::supports_write_values`] first.
    ///
    /// # Safety
    ///
    /// Every address is an 8-aligned word the device can write (its own
    /// memory, a peer's mapped into it, or host memory mapped into it),
    /// alive until the stream passes this point, and accessed atomically by
    /// everyone else.
    pub(crate) unsafe fn write_values(&self, ops: &[(u64, u64, bool)]) -> Result<()> {
        match &self.inner {
            // SAFETY: forwarded from the caller.
            StreamInner::Cuda(s) => unsafe { s.write_values(ops) },
            // SAFETY: forwarded from the caller.
            StreamInner::Emulated(s) => unsafe { s.write_values(ops) },
        }
    }

    /// Whether [`Stream::write_values`] works on this device.
    pub(crate) fn supports_write_values(&self) -> bool {
        match &self.inner {
            StreamInner::Cuda(s) => s.device.can_use_mem_ops(),
            StreamInner::Emulated(_) => true,
        }
    }

    /// Whether everything queued so far has finished; the error of queued
    /// work that failed (sticky, as [`Stream::synchronize`] reports it).
    pub fn is_idle(&self) -> Result<bool> {
        match &self.inner {
            StreamInner::Cuda(s) => s.is_idle(),
            StreamInner::Emulated(s) => s.is_idle(),
        }
    }

    /// Records `event` at this point of the stream.
    pub fn record(&self, event: &Event) -> Result<()> {
        match (&self.inner, &event.inner) {
            (StreamInner::Cuda(s), EventInner::Cuda(e)) => s.record(e),
            (StreamInner::Emulated(s), EventInner::Emulated(e)) => s.record(e),
            _ => Err(Error::invalid_usage("event and stream belong to different runtimes")),
        }
    }

    /// Waits until all work queued so far has finished. Returns the first
    /// error a kernel raised (a trap, a fault), which is sticky as in CUDA.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            StreamInner::Cuda(s) => s.synchronize(),
            StreamInner::Emulated(s) => s.synchronize(),
        }
    }

    /// Starts recording this stream's work into a graph instead of running
    /// it (`cudaStreamBeginCapture`, in thread-local mode): launches,
    /// copies, memsets and event records queued from now on are recorded;
    /// [`Stream::end_capture`] returns them as a [`Graph`]. Work that waits
    /// for the stream (a synchronize, a synchronous read or write, a query)
    /// is an [`Error::InvalidUsage`] until the capture ends, on both
    /// runtimes.
    ///
    /// Which of devcomm's own calls can be captured says where they are
    /// documented (`Collectives`: the collectives within one LSA team; not
    /// yet sends, receives, or collectives across LSA teams, which refuse).
    ///
    /// Errors: [`Error::InvalidUsage`] when the stream is capturing already.
    #[doc(alias = "cudaStreamBeginCapture")]
    pub fn begin_capture(&self) -> Result<()> {
        if self.is_capturing()? {
            return Err(Error::invalid_usage("begin_capture: the stream is capturing already"));
        }
        match &self.inner {
            StreamInner::Cuda(s) => s.begin_capture(),
            StreamInner::Emulated(s) => s.begin_capture(),
        }
    }

    /// Ends the capture [`Stream::begin_capture`] started and returns what it
    /// recorded, ready to launch.
    ///
    /// Errors: [`Error::InvalidUsage`] when the stream was not capturing;
    /// [`Error::CudaError`] when CUDA invalidated the capture (an operation
    /// it does not allow while capturing).
    #[doc(alias = "cudaStreamEndCapture")]
    pub fn end_capture(&self) -> Result<Graph> {
        if !self.is_capturing()? {
            return Err(Error::invalid_usage("end_capture: the stream is not capturing"));
        }
        let inner = match &self.inner {
            StreamInner::Cuda(s) => GraphInner::Cuda(s.end_capture()?),
            StreamInner::Emulated(s) => GraphInner::Emulated(s.end_capture()?),
        };
        Ok(Graph { inner })
    }

    /// Captures what `record` queues on this stream into a [`Graph`]: a
    /// [`Stream::begin_capture`], `record(self)`, then a
    /// [`Stream::end_capture`], which also runs when `record` fails (its
    /// error is returned, the capture dropped).
    ///
    /// ```
    /// use devcomm::runtime::{Device, LaunchConfig, RuntimeSelection};
    /// use devcomm_kernels::util::axpy_f32;
    ///
    /// # fn main() -> devcomm::Result<()> {
    /// let dev = Device::open(RuntimeSelection::from_env()?, 0)?;
    /// let stream = dev.new_stream()?;
    /// let n = 1000;
    /// let x = dev.alloc_from(&vec![1.0f32; n])?;
    /// let y = dev.alloc_from(&vec![0.0f32; n])?;
    /// // y = 2 x + y, captured once...
    /// let graph = stream.capture(|s| {
    ///     // SAFETY: x and y hold n elements and outlive every run (we
    ///     // synchronize below, before they are dropped).
    ///     unsafe { s.launch::<axpy_f32>(LaunchConfig::for_elements(n as u32, 256), (2.0, x.as_ptr(), y.as_ptr(), y.as_mut_ptr(), n as u32)) }
    /// })?;
    /// // ... and run three times.
    /// for _ in 0..3 {
    ///     // SAFETY: the buffers the graph uses are alive.
    ///     unsafe { graph.launch(&stream)? };
    /// }
    /// assert_eq!(stream.read_vec(&y)?, vec![6.0f32; n]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn capture(&self, record: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        self.begin_capture()?;
        let recorded = record(self);
        let graph = self.end_capture();
        recorded?;
        graph
    }

    /// Whether this stream is capturing a graph.
    #[doc(alias = "cudaStreamIsCapturing")]
    pub fn is_capturing(&self) -> Result<bool> {
        match &self.inner {
            StreamInner::Cuda(s) => s.is_capturing(),
            StreamInner::Emulated(s) => s.is_capturing(),
        }
    }

    pub(crate) fn check_buffer(&self, dev: &Device) -> Result<()> {
        if device_key(&dev.inner) == self.owner {
            Ok(())
        } else {
            Err(Error::invalid_argument("buffer belongs to another device than the stream"))
        }
    }
}

/// Work captured from a stream ([`Stream::begin_capture`] …
/// [`Stream::end_capture`], or [`Stream::capture`]), launched as a whole as
/// often as wanted (`cudaGraphExec_t`): one launch call for all of it,
/// which is what small collectives in a loop spend most of their time on.
#[doc(alias = "cudaGraphExec_t")]
pub struct Graph {
    inner: GraphInner,
}

enum GraphInner {
    Cuda(cuda::CudaGraphHandle),
    Emulated(emulated::EmuGraph),
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph").finish_non_exhaustive()
    }
}

impl Graph {
    /// Queues one run of the captured work on `stream` (of the device it
    /// was captured on; `cudaGraphLaunch`). While `stream` is capturing,
    /// the work is recorded into that capture instead.
    ///
    /// Errors: [`Error::InvalidUsage`] for a stream of another device or
    /// runtime.
    ///
    /// # Safety
    ///
    /// Every pointer the captured work uses (the kernels' arguments, the
    /// copies' ranges) is valid again for this run, until `stream` passes
    /// it: the graph holds addresses, not the buffers.
    #[doc(alias = "cudaGraphLaunch")]
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        match (&self.inner, &stream.inner) {
            (GraphInner::Cuda(g), StreamInner::Cuda(s)) if g.is_of(&s.device) => {
                // SAFETY: forwarded from the caller.
                unsafe { s.launch_graph(g) }
            }
            (GraphInner::Emulated(g), StreamInner::Emulated(s)) if g.is_of(s.ordinal()) => {
                // SAFETY: forwarded from the caller.
                unsafe { s.launch_graph(g) }
            }
            _ => Err(Error::invalid_usage("Graph::launch: the stream belongs to another device than the graph")),
        }
    }
}

/// A point in a stream, for timing (as `cudaEvent_t`).
pub struct Event {
    inner: EventInner,
}

enum EventInner {
    Cuda(cuda::CudaEventHandle),
    Emulated(Arc<emulated::EmuEvent>),
}

impl Event {
    /// A new event on `device`.
    pub fn new(device: &Device) -> Result<Event> {
        let inner = match &device.inner {
            DeviceInner::Cuda(d) => EventInner::Cuda(d.new_event()?),
            DeviceInner::Emulated(_) => EventInner::Emulated(Arc::new(emulated::EmuEvent::default())),
        };
        Ok(Event { inner })
    }

    /// A new event for completion only (`CU_EVENT_DISABLE_TIMING` on CUDA:
    /// cheaper to record and query; [`Event::elapsed_ms`] refuses it there).
    pub(crate) fn new_untimed(device: &Device) -> Result<Event> {
        let inner = match &device.inner {
            DeviceInner::Cuda(d) => EventInner::Cuda(d.new_untimed_event()?),
            DeviceInner::Emulated(_) => EventInner::Emulated(Arc::new(emulated::EmuEvent::default())),
        };
        Ok(Event { inner })
    }

    /// Whether the stream passed the event's last [`Stream::record`]
    /// (`cuEventQuery`): `true` once everything queued before the record
    /// has finished, and for an event never recorded. Does not block.
    ///
    /// Errors: [`Error::CudaError`] when the work before it failed.
    pub fn query(&self) -> Result<bool> {
        match &self.inner {
            EventInner::Cuda(e) => e.query(),
            EventInner::Emulated(e) => e.query(),
        }
    }

    /// Waits for the event, then returns milliseconds from `self` to `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        match (&self.inner, &end.inner) {
            (EventInner::Cuda(a), EventInner::Cuda(b)) => a.elapsed_ms(b),
            (EventInner::Emulated(a), EventInner::Emulated(b)) => a.elapsed_ms(b),
            _ => Err(Error::invalid_usage("events belong to different runtimes")),
        }
    }
}

enum RawAlloc {
    Cuda(cuda::CudaAlloc),
    Emulated(emulated::HostAlloc),
}

impl RawAlloc {
    fn addr(&self) -> u64 {
        match self {
            RawAlloc::Cuda(a) => a.addr(),
            RawAlloc::Emulated(a) => a.addr(),
        }
    }
}

/// `len` elements of `T` in a device's memory, freed on drop.
pub struct DeviceBuffer<T> {
    raw: RawAlloc,
    len: usize,
    device: Device,
    _t: PhantomData<T>,
}

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("addr", &format_args!("{:#x}", self.raw.addr()))
            .field("len", &self.len)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl<T> Drop for DeviceBuffer<T> {
    /// Waits for the device, then frees: work queued before the drop that
    /// reads the buffer finishes before the memory goes. On CUDA the wait
    /// comes first on its own (`cuCtxSynchronize`), because `cuMemFree`'s
    /// own wait holds the driver's lock, which would stall the GIN proxy
    /// and with it any kernel waiting on the proxy (see
    /// `CudaDevice::drain_before_free`); the emulator does the same, and
    /// models that lock under `DEVCOMM_EMU_DRIVER_LOCK=1`.
    fn drop(&mut self) {
        if let RawAlloc::Emulated(_) = self.raw {
            if !drain_disabled() {
                let _ = self.device.synchronize();
            }
            let _ = emulated::free_waits(self.device.ordinal());
        }
    }
}

impl<T> DeviceBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The device address, as an integer.
    pub fn device_addr(&self) -> u64 {
        self.raw.addr()
    }

    /// The device address as a pointer, for kernel arguments. Dereferencing
    /// it on the host is only meaningful on the emulated runtime.
    pub fn as_ptr(&self) -> *const T {
        self.raw.addr() as *const T
    }

    /// The device address as a mutable pointer, for kernel arguments.
    pub fn as_mut_ptr(&self) -> *mut T {
        self.raw.addr() as *mut T
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounded synchronous copies on a stream held up by work that does
    /// not finish (emulated: an op that waits for the test): they give up
    /// with `Timeout` after their limit, and leave the caller's buffers
    /// alone — also once the stream moves again.
    #[test]
    fn bounded_copies_give_up_on_a_stuck_stream() {
        let dev = Device::open(RuntimeSelection::Emulated, 0).unwrap();
        let stream = dev.new_stream().unwrap();
        let StreamInner::Emulated(emu) = &stream.inner else { unreachable!("emulated device") };
        let buf = dev.alloc_from(&[0x5au8; 24]).unwrap();
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let held = gate.clone();
        emu.submit_for_test(Box::new(move || {
            let (m, cv) = &*held;
            drop(cv.wait_while(m.lock().unwrap(), |open| !*open).unwrap());
            Ok(())
        }))
        .unwrap();
        let limit = std::time::Duration::from_millis(100);
        let t = std::time::Instant::now();
        let mut out = vec![0xeeu8; 24];
        let r = stream.read_raw_within(buf.device_addr(), &mut out, limit);
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert!(t.elapsed() >= limit);
        let data: Vec<u8> = (0..24u8).map(|i| i * 7 + 3).collect();
        let r = stream.write_raw_within(buf.device_addr(), &data, limit);
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        drop(data);
        // The stream moves again: the queued read lands in its own buffer,
        // not in `out`; the queued write (of its own copy) lands.
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        stream.synchronize().unwrap();
        assert_eq!(out, vec![0xeeu8; 24]);
        let want: Vec<u8> = (0..24u8).map(|i| i * 7 + 3).collect();
        assert_eq!(stream.read_vec(&buf).unwrap(), want);
        // A stream that runs: the bounded copies are plain copies.
        let mut back = vec![0u8; 24];
        stream.write_raw_within(buf.device_addr(), &[9u8; 24], limit).unwrap();
        stream.read_raw_within(buf.device_addr(), &mut back, limit).unwrap();
        assert_eq!(back, vec![9u8; 24]);
    }

    /// A dmabuf of shareable memory: none on the emulated runtime; on CUDA
    /// an open fd where the driver and device support dmabufs.
    #[test]
    fn dmabuf_of_shareable_memory() {
        let dev = Device::open(RuntimeSelection::from_env().unwrap(), 0).unwrap();
        let alloc = ShareableAlloc::new(&dev, 1).unwrap();
        let r = dev.export_dmabuf(alloc.addr(), alloc.size() as u64);
        eprintln!("{}: dmabuf of {} bytes: {r:?}", dev.name(), alloc.size());
        match (dev.kind(), r) {
            (RuntimeKind::Emulated, r) => assert!(matches!(r, Ok(None)), "{r:?}"),
            (RuntimeKind::Cuda, Ok(Some(fd))) => {
                let meta = std::fs::File::from(fd).metadata().unwrap();
                eprintln!("dmabuf fd: {meta:?}");
            }
            (RuntimeKind::Cuda, r) => assert!(matches!(r, Ok(None) | Err(Error::CudaError(_))), "{r:?}"),
        }
    }
}
