//! The CUDA runtime: a thin layer over cudarc's driver bindings.
//!
//! cudarc is built with `dynamic-loading`: nothing links against libcuda, and
//! [`device_count`] checks the library is loadable before any driver call, so
//! a binary on a machine without CUDA gets [`Error::CudaError`], not a panic.
//!
//! `unsafe` here is confined to driver calls on raw handles. The invariants:
//! every handle (`CUmodule`, `CUfunction`, `CUevent`, device pointer) is
//! created by this module, owned by exactly one wrapper that frees it once on
//! drop, and used only while the primary context it was created in is bound
//! to the calling thread (`bind_to_thread` before each call sequence).

use super::LaunchConfig;
use crate::error::{Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use devcomm_device::KernelArgs;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

fn cuda_err(what: &str) -> impl FnOnce(result::DriverError) -> Error + '_ {
    move |e| Error::CudaError(format!("{what}: {e}"))
}

/// Loads the driver (once) and returns the number of GPUs.
pub(crate) fn device_count() -> Result<usize> {
    static INIT: OnceLock<Result<usize>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries to dlopen the driver library; no other effect.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::CudaError(
                "the CUDA driver library (libcuda.so.1) was not found: no NVIDIA driver on this machine \
                 (use DEVCOMM_RUNTIME=emulated to run on the emulated runtime)"
                    .into(),
            ));
        }
        result::init().map_err(cuda_err("cuInit"))?;
        let n = result::device::get_count().map_err(cuda_err("cuDeviceGetCount"))?;
        Ok(n.max(0) as usize)
    })
    .clone()
}

/// One GPU: its primary context and what we cache about it.
pub(crate) struct CudaDevice {
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    pub(crate) uuid: [u8; 16],
    pub(crate) sm_count: u32,
    ctx: Arc<CudaContext>,
    library: OnceLock<Result<Arc<CudaModule>>>,
}

impl CudaDevice {
    /// Opens GPU `ordinal` (one object per GPU per process).
    pub(crate) fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::invalid_argument(format!("CUDA device {ordinal} does not exist: this machine has {n}")));
        }
        let mut map =
            DEVICES.get_or_init(Default::default).lock().map_err(|_| Error::internal("device table poisoned"))?;
        if let Some(d) = map.get(&ordinal) {
            return Ok(d.clone());
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("retaining the primary context"))?;
        let name = ctx.name().map_err(cuda_err("cuDeviceGetName"))?;
        let raw_uuid = ctx.uuid().map_err(cuda_err("cuDeviceGetUuid"))?;
        let mut uuid = [0u8; 16];
        for (dst, src) in uuid.iter_mut().zip(raw_uuid.bytes.iter()) {
            *dst = *src as u8;
        }
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda_err("reading the multiprocessor count"))? as u32;
        let dev = Arc::new(CudaDevice { ordinal, name, uuid, sm_count, ctx, library: OnceLock::new() });
        map.insert(ordinal, dev.clone());
        Ok(dev)
    }

    pub(crate) fn can_access_peer(&self, peer: &CudaDevice) -> Result<bool> {
        if peer.ordinal == self.ordinal {
            return Ok(true);
        }
        let mut ok = 0;
        // SAFETY: valid out-pointer and device handles of live contexts.
        unsafe { sys::cuDeviceCanAccessPeer(&mut ok, self.ctx.cu_device(), peer.ctx.cu_device()) }
            .result()
            .map_err(cuda_err("cuDeviceCanAccessPeer"))?;
        Ok(ok != 0)
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(cuda_err("binding the CUDA context"))
    }

    pub(crate) fn default_stream(self: &Arc<Self>) -> Result<CudaStreamHandle> {
        self.new_stream()
    }

    pub(crate) fn new_stream(self: &Arc<Self>) -> Result<CudaStreamHandle> {
        let stream = self.ctx.new_stream().map_err(cuda_err("cuStreamCreate"))?;
        Ok(CudaStreamHandle { device: self.clone(), stream })
    }

    /// Whether streams of this device can run 64-bit stream memory
    /// operations (`cuStreamBatchMemOp` writes).
    pub(crate) fn can_use_mem_ops(&self) -> bool {
        self.ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS).unwrap_or(0) != 0
    }

    /// Whether allocations may ask for GPUDirect RDMA
    /// (`CUmemAllocationProp::allocFlags.gpuDirectRDMACapable`).
    pub(crate) fn gdr_with_vmm(&self) -> bool {
        self.ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)
            .unwrap_or(0)
            != 0
    }

    /// See [`Device::export_dmabuf`](super::Device::export_dmabuf).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn export_dmabuf(&self, addr: u64, len: u64) -> Result<Option<std::os::fd::OwnedFd>> {
        use std::os::fd::FromRawFd;
        if !dmabuf_export_available()
            || self.ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED).unwrap_or(0) == 0
        {
            return Ok(None);
        }
        self.bind()?;
        let mut fd: i32 = -1;
        // SAFETY: the symbol exists (checked above, so cudarc's loader does
        // not panic); for CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD the out-parameter
        // is an int; the driver validates the range (an error, not UB, when
        // it is not mapped device memory of this context).
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast::<c_void>(),
                addr,
                len as usize,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        }
        .result()
        .map_err(|e| {
            Error::CudaError(format!("cuMemGetHandleForAddressRange (dmabuf of {len} bytes at {addr:#x}): {e}"))
        })?;
        if fd < 0 {
            return Err(Error::CudaError("cuMemGetHandleForAddressRange returned no file descriptor".into()));
        }
        // SAFETY: a new descriptor the driver created for us; owned from here.
        Ok(Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// The GPU whose memory `addr` is (`Some(ordinal)`), or `None` for host
    /// memory (pinned or pageable, which the driver does not know).
    pub(crate) fn pointer_device(&self, addr: u64) -> Result<Option<usize>> {
        self.bind()?;
        let mut mem_type: u32 = 0;
        // SAFETY: for MEMORY_TYPE the out-parameter is an unsigned int; the
        // driver only inspects its tables for `addr`, it does not dereference it.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut mem_type as *mut u32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            // CUDA_ERROR_INVALID_VALUE: an address the driver does not know, i.e. pageable host memory.
            return Ok(None);
        }
        if mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Ok(None);
        }
        let mut ordinal: i32 = -1;
        // SAFETY: for DEVICE_ORDINAL the out-parameter is an int; as above.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        }
        .result()
        .map_err(cuda_err("cuPointerGetAttribute(DEVICE_ORDINAL)"))?;
        Ok(usize::try_from(ordinal).ok())
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(cuda_err("cuCtxSynchronize"))
    }

    /// Waits for the context's work before a driver call that frees or
    /// unmaps memory (`cuMemFree`, `cuMemFreeHost`, `cuMemHostUnregister`,
    /// `cuMemUnmap`). Those wait for the device themselves, but while
    /// holding the driver's context lock, so every other thread's driver
    /// call waits too — the GIN proxy's copies and reads among them — and
    /// a kernel that waits for the proxy then deadlocks with the free
    /// until its device timeout (seen on GPUs: a collective's scratch
    /// growing, an MoE output dropped on an error path; both issue 15).
    /// `cuCtxSynchronize` waits without that lock, so the proxy keeps
    /// serving; the free that follows finds the device idle. Errors are
    /// left to the free (a faulted context frees what it can).
    pub(crate) fn drain_before_free(&self) {
        if !super::drain_disabled() && self.bind().is_ok() {
            let _ = self.ctx.synchronize();
        }
    }

    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<CudaAlloc> {
        self.bind()?;
        // cuMemAlloc rejects 0 bytes; keep a valid, unique address anyway.
        // SAFETY: context bound above; the pointer is owned by CudaAlloc.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(|e| Error::CudaError(format!("cuMemAlloc of {bytes} bytes on GPU {}: {e}", self.ordinal)))?;
        Ok(CudaAlloc { device: self.clone(), ptr })
    }

    pub(crate) fn load_module(self: &Arc<Self>, ptx: &str) -> Result<Arc<CudaModule>> {
        let entries = ptx_entries(ptx);
        let image = CString::new(ptx).map_err(|_| Error::invalid_argument("PTX text contains a NUL byte"))?;
        self.bind()?;
        // An ahead-of-time image of exactly this PTX (`DEVCOMM_CUBIN_DIR`,
        // named by its hash) skips the driver's compilation.
        let aot = match crate::ptx::cubin_for(ptx)? {
            // SAFETY: `cubin` is a complete image read from the file, alive
            // across the call; the driver validates it (ELF header,
            // architecture) and fails the call on anything else.
            Some((path, cubin)) => match unsafe { result::module::load_data(cubin.as_ptr() as *const c_void) } {
                Ok(m) => {
                    tracing::info!(image = %path.display(), "loaded an ahead-of-time kernel image");
                    Some(m)
                }
                Err(e) => {
                    tracing::warn!(image = %path.display(), error = %e, "the driver refused the kernel image; loading the PTX");
                    None
                }
            },
            None => None,
        };
        let module = match aot {
            Some(m) => m,
            // SAFETY: `image` is a NUL-terminated PTX string that outlives the call.
            None => unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
                .map_err(cuda_err("cuModuleLoadData (is the PTX for sm_90 and complete?)"))?,
        };
        let m = Arc::new(CudaModule { device: self.clone(), module, entries, functions: Mutex::new(HashMap::new()) });
        // Load every kernel now (issue 13). With CUDA's lazy loading (the
        // default since CUDA 12.2) a kernel's code is loaded at its first
        // cuModuleGetFunction, and loading may synchronize the context: a
        // first launch queued behind a running kernel that waits for the GIN
        // proxy (whose copies and stream writes then cannot run) deadlocks
        // until the device wait times out.
        if !super::preload_disabled() {
            for name in m.entries.clone() {
                m.function(&name)?;
            }
        }
        Ok(m)
    }

    pub(crate) fn library(self: &Arc<Self>) -> Result<Arc<CudaModule>> {
        self.library
            .get_or_init(|| {
                let ptx = crate::ptx::kernels_ptx()?;
                self.load_module(&ptx).map_err(|e| e.context("loading devcomm's kernels"))
            })
            .clone()
    }

    pub(crate) fn new_event(self: &Arc<Self>) -> Result<CudaEventHandle> {
        self.new_event_with(sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    /// An event without timing (`CU_EVENT_DISABLE_TIMING`: cheaper to
    /// record and query), for completion only.
    pub(crate) fn new_untimed_event(self: &Arc<Self>) -> Result<CudaEventHandle> {
        self.new_event_with(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    fn new_event_with(self: &Arc<Self>, flags: sys::CUevent_flags) -> Result<CudaEventHandle> {
        self.bind()?;
        let event = result::event::create(flags).map_err(cuda_err("cuEventCreate"))?;
        Ok(CudaEventHandle { device: self.clone(), event })
    }
}

/// Entry names declared in a PTX text (`.entry name(`).
pub(crate) fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest =
                l.trim_start().strip_prefix(".visible .entry ").or_else(|| l.trim_start().strip_prefix(".entry "))?;
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$').collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// A loaded module and the functions looked up in it so far.
pub(crate) struct CudaModule {
    device: Arc<CudaDevice>,
    module: sys::CUmodule,
    entries: Vec<String>,
    functions: Mutex<HashMap<String, FunctionHandle>>,
}

#[derive(Clone, Copy)]
struct FunctionHandle(sys::CUfunction);

// SAFETY: driver handles may be used from any thread once their context is bound.
unsafe impl Send for FunctionHandle {}
// SAFETY: as above.
unsafe impl Send for CudaModule {}
// SAFETY: as above; the function cache is behind a mutex.
unsafe impl Sync for CudaModule {}

impl CudaModule {
    pub(crate) fn entry_names(&self) -> &[String] {
        &self.entries
    }

    fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let mut fns = self.functions.lock().map_err(|_| Error::internal("function cache poisoned"))?;
        if let Some(f) = fns.get(name) {
            return Ok(f.0);
        }
        if !self.entries.iter().any(|e| e == name) {
            return Err(Error::invalid_argument(format!(
                "kernel {name:?} is not in this module (entries: {})",
                self.entries.join(", ")
            )));
        }
        let cname = CString::new(name).map_err(|_| Error::invalid_argument("kernel name contains a NUL byte"))?;
        // SAFETY: module is live (owned by self); context bound by the caller.
        let f = unsafe { result::module::get_function(self.module, cname) }.map_err(cuda_err("cuModuleGetFunction"))?;
        // Allow the Hopper maximum of dynamic shared memory once per
        // function, less its static shared memory: both count against the
        // same per-block maximum, and a limit above what is left is refused
        // (CUDA_ERROR_INVALID_VALUE) — a module with a static `.shared`
        // array would not load (seen on 2 × H200: 2026-11-26-h200x2-graphs.md).
        // SAFETY: f is a valid function of a loaded module.
        let static_bytes = unsafe {
            result::function::get_function_attribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        }
        .map_err(cuda_err("reading a kernel's static shared memory"))?;
        let limit = LaunchConfig::MAX_SHARED_MEM_BYTES.saturating_sub(static_bytes.max(0) as u32);
        // SAFETY: f is a valid function of a loaded module.
        unsafe {
            result::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                limit as i32,
            )
        }
        .map_err(cuda_err("raising the dynamic shared memory limit"))?;
        fns.insert(name.to_string(), FunctionHandle(f));
        Ok(f)
    }
}

impl Drop for CudaModule {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: the module is owned by self and unloaded exactly once.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// A captured, instantiated graph.
pub(crate) struct CudaGraphHandle {
    device: Arc<CudaDevice>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread (the driver's own
// locking); this type never hands them out.
unsafe impl Send for CudaGraphHandle {}
// SAFETY: as above.
unsafe impl Sync for CudaGraphHandle {}

impl CudaGraphHandle {
    /// Whether this graph belongs to `device`.
    pub(crate) fn is_of(&self, device: &Arc<CudaDevice>) -> bool {
        Arc::ptr_eq(&self.device, device)
    }
}

impl Drop for CudaGraphHandle {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: ours; launches queued earlier keep their own reference
            // in the driver (destroying an executable graph that is running
            // is allowed).
            unsafe {
                let _ = result::graph::exec_destroy(self.exec);
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

/// A stream of one GPU.
pub(crate) struct CudaStreamHandle {
    pub(crate) device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
}

impl CudaStreamHandle {
    /// The raw stream.
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// # Safety
    /// The kernel's pointer arguments must be valid for its whole run.
    pub(crate) unsafe fn launch<A: KernelArgs>(
        &self,
        module: &CudaModule,
        name: &str,
        cfg: LaunchConfig,
        args: &A,
    ) -> Result<()> {
        self.device.bind()?;
        let f = module.function(name)?;
        let mut params: Vec<*mut c_void> = Vec::with_capacity(A::COUNT);
        args.for_each_param(&mut |p| params.push(p));
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: `params` point into `args`, alive for the call (the driver
        // copies them); the kernel's own contract is the caller's.
        unsafe {
            if cfg.co_resident {
                result::launch_cooperative_kernel(
                    f,
                    (g.x, g.y, g.z),
                    (b.x, b.y, b.z),
                    cfg.shared_mem_bytes,
                    self.stream.cu_stream(),
                    &mut params,
                )
            } else {
                result::launch_kernel(
                    f,
                    (g.x, g.y, g.z),
                    (b.x, b.y, b.z),
                    cfg.shared_mem_bytes,
                    self.stream.cu_stream(),
                    &mut params,
                )
            }
        }
        .map_err(|e| Error::CudaError(format!("launching {name} with {cfg:?}: {e}")))
    }

    pub(crate) fn write(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.device.bind()?;
        // SAFETY: dst is a live allocation of at least src.len() bytes
        // (checked by the caller); we wait before `src` can go away.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(cuda_err("cuMemcpyHtoDAsync"))?;
        self.synchronize()
    }

    pub(crate) fn read(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.device.bind()?;
        // SAFETY: as in `write`, the other way round.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(cuda_err("cuMemcpyDtoHAsync"))?;
        self.synchronize()
    }

    /// As [`CudaStreamHandle::write`], waiting for the stream at most `limit`.
    /// Only for pageable `src` (never pinned or registered): the driver has
    /// then staged it before `cuMemcpyHtoDAsync` returns, so giving up
    /// leaves nothing of it in use.
    pub(crate) fn write_within(&self, dst: u64, src: &[u8], limit: std::time::Duration) -> Result<()> {
        self.device.bind()?;
        // SAFETY: dst is a live allocation of at least src.len() bytes
        // (checked by the caller); `src` is pageable (our contract), so the
        // driver is done with it when the call returns.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(cuda_err("cuMemcpyHtoDAsync"))?;
        self.synchronize_within(limit)
    }

    /// As [`CudaStreamHandle::read`], waiting for the stream at most `limit`.
    /// Only for pageable `dst`: `cuMemcpyDtoHAsync` to pageable memory
    /// returns once the copy is complete, so giving up afterwards leaves
    /// nothing writing to it.
    pub(crate) fn read_within(&self, src: u64, dst: &mut [u8], limit: std::time::Duration) -> Result<()> {
        self.device.bind()?;
        // SAFETY: as in `write_within`, the other way round.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(cuda_err("cuMemcpyDtoHAsync"))?;
        self.synchronize_within(limit)
    }

    /// Polls the stream ([`CudaStreamHandle::is_idle`]) until it has run
    /// everything, at most `limit`; then `Timeout`.
    pub(crate) fn synchronize_within(&self, limit: std::time::Duration) -> Result<()> {
        let start = std::time::Instant::now();
        let mut polls = 0u32;
        while !self.is_idle()? {
            if start.elapsed() > limit {
                return Err(Error::Timeout(format!("the stream has not run its work within {limit:?}")));
            }
            polls += 1;
            if polls < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        Ok(())
    }

    /// # Safety
    /// Both ranges are device memory accessible from this context.
    pub(crate) unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.device.bind()?;
        // SAFETY: forwarded from the caller.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(cuda_err("cuMemcpyDtoDAsync"))
    }

    /// Queues `copies` (dst, src, bytes) with one `cuMemcpyBatchAsync` where
    /// the driver has it (CUDA 12.8+), else one `cuMemcpyDtoDAsync` each.
    /// The copies of one batch may run in any order and at once.
    ///
    /// # Safety
    /// As for [`Stream::memcpy_raw`](crate::Stream::memcpy_raw), for each
    /// copy; no copy's destination overlaps another copy's source or destination.
    pub(crate) unsafe fn memcpy_batch(&self, copies: &[(u64, u64, usize)]) -> Result<()> {
        if copies.len() < 2 || !batch_copies_available() {
            for &(d, s, n) in copies {
                // SAFETY: forwarded from the caller.
                unsafe { self.memcpy(d, s, n) }?;
            }
            return Ok(());
        }
        self.device.bind()?;
        let mut dsts: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.0).collect();
        let mut srcs: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.1).collect();
        let mut sizes: Vec<usize> = copies.iter().map(|c| c.2).collect();
        // One attribute set for all: sources are read in stream order; no
        // location hints (they only matter for managed memory).
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, id: 0 },
            dstLocHint: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, id: 0 },
            flags: 0,
        }];
        let mut attr_idx = [0usize];
        let mut fail_idx = usize::MAX;
        // SAFETY: the three arrays hold `copies.len()` entries and the
        // attribute arrays one, all alive for the call (the driver reads
        // them before returning); the symbol exists (checked above); the
        // ranges are the caller's contract.
        unsafe {
            sys::cuMemcpyBatchAsync(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                copies.len(),
                attrs.as_mut_ptr(),
                attr_idx.as_mut_ptr(),
                1,
                &mut fail_idx,
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| {
            Error::CudaError(format!("cuMemcpyBatchAsync ({} copies, failed at {fail_idx}): {e:?}", copies.len()))
        })
    }

    pub(crate) fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.device.bind()?;
        // SAFETY: dst is a live allocation of `bytes` bytes (the caller's buffer).
        unsafe { result::memset_d8_async(dst, value, bytes, self.stream.cu_stream()) }
            .map_err(cuda_err("cuMemsetD8Async"))
    }

    pub(crate) fn record(&self, event: &CudaEventHandle) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live and of this context.
        unsafe { result::event::record(event.event, self.stream.cu_stream()) }.map_err(cuda_err("cuEventRecord"))
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err("cuStreamSynchronize"))
    }

    /// Starts capturing the stream into a graph (`cuStreamBeginCapture`,
    /// thread-local mode: other threads, the GIN proxy's among them, go on
    /// calling CUDA as they please).
    pub(crate) fn begin_capture(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: a live stream of the bound context.
        unsafe {
            result::stream::begin_capture(
                self.stream.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(cuda_err("cuStreamBeginCapture"))
    }

    /// Ends the capture and instantiates what it recorded.
    pub(crate) fn end_capture(&self) -> Result<CudaGraphHandle> {
        self.device.bind()?;
        // SAFETY: a live stream of the bound context.
        let graph =
            unsafe { result::stream::end_capture(self.stream.cu_stream()) }.map_err(cuda_err("cuStreamEndCapture"))?;
        if graph.is_null() {
            return Err(Error::invalid_usage("end_capture: the stream was not capturing"));
        }
        // SAFETY: `graph` was just made by the capture.
        match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(exec) => Ok(CudaGraphHandle { device: self.device.clone(), graph, exec }),
            Err(e) => {
                // SAFETY: ours, used by nothing else.
                let _ = unsafe { result::graph::destroy(graph) };
                Err(cuda_err("cuGraphInstantiate")(e))
            }
        }
    }

    /// Whether the stream is capturing.
    pub(crate) fn is_capturing(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: a live stream of the bound context.
        let status = unsafe { result::stream::is_capturing(self.stream.cu_stream()) }
            .map_err(cuda_err("cuStreamIsCapturing"))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Queues one run of `graph`.
    ///
    /// # Safety
    /// Whatever the captured work touches is alive until the stream passes
    /// this point.
    pub(crate) unsafe fn launch_graph(&self, graph: &CudaGraphHandle) -> Result<()> {
        self.device.bind()?;
        // SAFETY: a live executable graph and stream of this context; the
        // memory it uses is the caller's contract.
        unsafe { result::graph::launch(graph.exec, self.stream.cu_stream()) }.map_err(cuda_err("cuGraphLaunch"))
    }

    /// Whether the stream has finished all its work (`cuStreamQuery`);
    /// an error of that work is returned.
    pub(crate) fn is_idle(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: a live stream of the bound context.
        match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Error::CudaError(format!("cuStreamQuery: {e:?}"))),
        }
    }

    /// Queues 64-bit stores `(address, value, barrier)` in order, as stream
    /// memory operations (`cuStreamBatchMemOp`, at most
    /// [`MAX_MEM_OPS`] per call). `barrier`: the store is ordered after
    /// (and made visible after) every earlier operation of the stream, as
    /// `__threadfence_system()`; without it, stores may pass earlier stores
    /// of the same batch.
    ///
    /// # Safety
    /// Every address is 8-aligned memory the device can write (its own, a
    /// peer's mapped into it, or host memory mapped into it), alive until
    /// the stream passes this point.
    pub(crate) unsafe fn write_values(&self, ops: &[(u64, u64, bool)]) -> Result<()> {
        self.device.bind()?;
        for chunk in ops.chunks(MAX_MEM_OPS) {
            let mut params: Vec<sys::CUstreamBatchMemOpParams> = chunk
                .iter()
                .map(|&(address, value, barrier)| {
                    let flags = if barrier {
                        0
                    } else {
                        sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER as u32
                    };
                    sys::CUstreamBatchMemOpParams {
                        writeValue: sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
                            operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_64,
                            address,
                            __bindgen_anon_1:
                                sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                                    value64: value,
                                },
                            flags,
                            alias: 0,
                        },
                    }
                })
                .collect();
            // SAFETY: `params` holds `chunk.len()` (< 256) initialised
            // operations, alive for the call (the driver copies them); the
            // addresses are the caller's contract.
            unsafe { sys::cuStreamBatchMemOp_v2(self.stream.cu_stream(), params.len() as u32, params.as_mut_ptr(), 0) }
                .result()
                .map_err(cuda_err("cuStreamBatchMemOp (64-bit stream writes)"))?;
        }
        Ok(())
    }
}

/// Most operations handed to one `cuStreamBatchMemOp` call (the driver's limit is 255).
pub(crate) const MAX_MEM_OPS: usize = 128;

/// Whether the driver exports `cuMemcpyBatchAsync` (12.8 ABI). Asked once;
/// cudarc's loader panics on a missing symbol, so it is looked up here first.
fn batch_copies_available() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        // SAFETY: looking a symbol up runs no code of the library.
        let lib = unsafe { sys::culib() };
        // SAFETY: as above; the symbol is only checked for presence.
        unsafe { lib.get::<unsafe extern "C" fn()>(b"cuMemcpyBatchAsync\0") }.is_ok()
    })
}

/// Whether the driver exports `cuMemGetHandleForAddressRange` (CUDA 11.7).
/// Asked once, as in [`batch_copies_available`].
fn dmabuf_export_available() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        // SAFETY: looking a symbol up runs no code of the library.
        let lib = unsafe { sys::culib() };
        // SAFETY: as above; the symbol is only checked for presence.
        unsafe { lib.get::<unsafe extern "C" fn()>(b"cuMemGetHandleForAddressRange\0") }.is_ok()
    })
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub(crate) struct CudaAlloc {
    device: Arc<CudaDevice>,
    ptr: sys::CUdeviceptr,
}

impl CudaAlloc {
    pub(crate) fn addr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaAlloc {
    fn drop(&mut self) {
        self.device.drain_before_free();
        if self.device.bind().is_ok() {
            // SAFETY: owned pointer, freed exactly once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A CUDA event, destroyed on drop.
pub(crate) struct CudaEventHandle {
    device: Arc<CudaDevice>,
    event: sys::CUevent,
}

// SAFETY: event handles are usable from any thread with the context bound.
unsafe impl Send for CudaEventHandle {}
// SAFETY: as above.
unsafe impl Sync for CudaEventHandle {}

impl CudaEventHandle {
    /// Whether the work before the event's last record has finished
    /// (`cuEventQuery`; never recorded: finished). Does not block.
    pub(crate) fn query(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: a live event of this context.
        match unsafe { sys::cuEventQuery(self.event) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Error::CudaError(format!("cuEventQuery: {e:?}"))),
        }
    }

    pub(crate) fn elapsed_ms(&self, end: &CudaEventHandle) -> Result<f32> {
        self.device.bind()?;
        // SAFETY: live events of this context.
        unsafe {
            result::event::synchronize(end.event).map_err(cuda_err("cuEventSynchronize"))?;
            result::event::elapsed(self.event, end.event).map_err(cuda_err("cuEventElapsedTime"))
        }
    }
}

impl Drop for CudaEventHandle {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: owned event, destroyed once.
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_parsed_from_ptx() {
        let ptx = ".version 7.8\n.visible .entry axpy_f32(\n.param .f32 a\n)\n.entry other_one(\n";
        assert_eq!(ptx_entries(ptx), vec!["axpy_f32".to_string(), "other_one".to_string()]);
    }
}
