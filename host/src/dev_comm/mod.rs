//! Device communicators (`ncclDevCommCreate`): the [`DevComm`] a kernel
//! takes by value, with its resource window (barrier state and
//! user-requested resource buffers), its teams, the windows its kernels use,
//! and a device-visible abort flag.
//!
//! Resource window layout (every region at a 256-byte aligned offset):
//!
//! | offset | contents |
//! |---|---|
//! | `lsa_barrier_offset` (0) | barrier `b`, source LSA rank `s`: `u32` at `+ (b * lsa_size + s) * 4` |
//! | `lsa_epoch_offset` | this rank's epoch of barrier `b`: `u32` at `+ b * 4` |
//! | then | resource buffers, each aligned as requested ([`DevCommHandle::resource_offset`]) |
//!
//! Barriers `0 .. lsa_barrier_count` are the LSA barriers; the world
//! barriers (allowed only while the LSA team is the world) follow them, from
//! [`DevCommHandle::world_barrier_base`]. [`DevComm::lsa_barrier_count`]
//! counts both. The whole window starts zeroed.
//!
//! ```no_run
//! use devcomm::comm::Communicator;
//! use devcomm::dev_comm::DevCommRequirements;
//! # fn main() -> devcomm::Result<()> {
//! let comm = Communicator::init_from_env()?;
//! let mut req = DevCommRequirements::new();
//! req.lsa_barrier_count = 2;
//! let scratch = req.add_resource(4096, 128);
//! let dc = comm.create_dev_comm(&req)?;
//! let dev_comm = dc.dev_comm(); // Copy: pass it to kernels
//! let scratch_offset = dc.resource_offset(scratch)?;
//! # let _ = (dev_comm, scratch_offset);
//! dc.destroy()?;
//! # Ok(()) }
//! ```

mod requirements;

pub use devcomm_device::comm::{AbortInfo, DevComm};
pub use requirements::{
    DevCommRequirements, ResourceHandle, DEFAULT_GIN_QUEUE_DEPTH, MAX_BARRIERS, MAX_GIN_CONTEXTS, MAX_GIN_IDS,
    MAX_GIN_QUEUE_DEPTH, MAX_RESOURCES, MAX_RESOURCE_ALIGN,
};

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::memory::SymmetricMemory;
use crate::runtime::HostMappedWord;
use crate::window::{self, agree, allgather_outcome, Window, WindowDesc, WindowFlags, WindowShared};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Alignment of the resource window's regions.
pub const REGION_ALIGN: u64 = 256;

/// Where everything lives in the resource window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) barrier_offset: u64,
    pub(crate) epoch_offset: u64,
    pub(crate) resource_offsets: Vec<u64>,
    pub(crate) total: u64,
}

fn align_up(v: u64, a: u64) -> Result<u64> {
    v.checked_next_multiple_of(a).ok_or_else(|| Error::invalid_argument("resource window size overflows"))
}

pub(crate) fn layout(barriers: u64, lsa_size: u64, resources: &[(u64, u64)]) -> Result<Layout> {
    let ovf = || Error::invalid_argument("resource window size overflows");
    let inbox = barriers.checked_mul(lsa_size).and_then(|v| v.checked_mul(4)).ok_or_else(ovf)?;
    let epoch_offset = align_up(inbox, REGION_ALIGN)?;
    let mut cursor = align_up(epoch_offset + barriers * 4, REGION_ALIGN)?;
    let mut resource_offsets = Vec::with_capacity(resources.len());
    for &(size, align) in resources {
        let off = align_up(cursor, align.max(1))?;
        resource_offsets.push(off);
        cursor = off.checked_add(size).ok_or_else(ovf)?;
    }
    let total = align_up(cursor.max(REGION_ALIGN), REGION_ALIGN)?;
    Ok(Layout { barrier_offset: 0, epoch_offset, resource_offsets, total })
}

/// A device communicator (`ncclDevComm` plus its host-side owner).
///
/// [`DevCommHandle::destroy`] is the collective release; dropping it
/// releases this rank's side without talking to other ranks.
pub struct DevCommHandle<'c> {
    comm: &'c Communicator,
    dev_comm: DevComm,
    resource_window: Option<Window<'c>>,
    _resource_mem: SymmetricMemory,
    resource_offsets: Vec<u64>,
    req_id: u64,
    world_barrier_base: u32,
    abort_word: Arc<HostMappedWord>,
    windows: Vec<Arc<WindowShared>>,
    gin: Option<crate::gin::resources::GinResources>,
}

impl fmt::Debug for DevCommHandle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevCommHandle").field("dev_comm", &self.dev_comm).finish_non_exhaustive()
    }
}

impl Communicator {
    /// Creates a device communicator (`ncclDevCommCreate`). Collective:
    /// every rank calls it with the same requirements.
    ///
    /// Errors (on every rank when any rank's input is bad):
    /// [`Error::InvalidArgument`] for a barrier count above [`MAX_BARRIERS`],
    /// a zero-sized resource, an alignment that is not a power of two up to
    /// [`MAX_RESOURCE_ALIGN`], a window of another communicator, or
    /// requirements that differ between ranks; [`Error::InvalidUsage`] for
    /// multimem teams (NVLink multicast is not supported), world barriers or
    /// world/rail teams reaching beyond the LSA team (they need GIN); the
    /// errors of [`Communicator::register_window`].
    #[doc(alias = "ncclDevCommCreate")]
    pub fn create_dev_comm(&self, req: &DevCommRequirements) -> Result<DevCommHandle<'_>> {
        let what = "create_dev_comm";
        let mut mem = None;
        let mut lay = None;
        let mut windows = Vec::new();
        let local = (|| -> Result<Vec<u8>> {
            let lsa_size = self.lsa_size()?;
            req.validate(self.count(), lsa_size, window::comm_key(self))?;
            let barriers = req.lsa_barrier_count as u64 + req.barrier_count as u64;
            let l = layout(barriers, lsa_size as u64, &req.resources)?;
            let bytes = usize::try_from(l.total).map_err(|_| Error::invalid_argument("resource window too large"))?;
            mem = Some(SymmetricMemory::alloc(self.device(), bytes)?);
            lay = Some(l);
            windows = req.live_windows()?;
            Ok(req.digest())
        })();
        let digests = allgather_outcome(self, what, local)?;
        if let Some(r) = digests.iter().position(|d| *d != digests[0]) {
            return Err(Error::invalid_argument(format!(
                "{what}: rank {r} passed different requirements than rank 0 (every rank must pass the same)"
            )));
        }
        let (Some(mem), Some(lay)) = (mem, lay) else {
            return Err(Error::internal("create_dev_comm: no resource memory after agreement"));
        };
        let win = window::register(self, &mem, 0, lay.total as usize, WindowFlags::COLL_SYMMETRIC)
            .map_err(|e| e.context("creating the resource window"))?;
        let desc = win.desc();
        // A peer-access fallback may have shrunk the LSA team during registration.
        let revalidated = req.validate(self.count(), desc.lsa_size() as usize, window::comm_key(self));
        let word = (|| -> Result<Arc<HostMappedWord>> {
            revalidated?;
            let stream = self.device().stream();
            let zeros = vec![0u8; (lay.total as usize).min(1 << 20)];
            let mut at = 0usize;
            while at < lay.total as usize {
                let n = zeros.len().min(lay.total as usize - at);
                win.write(stream, at, &zeros[..n])?;
                at += n;
            }
            Ok(Arc::new(HostMappedWord::new(self.device())?))
        })();
        // Everyone zeroed its resources before anyone's kernels may touch them.
        agree(self, what, word.as_ref().map(|_| ()).map_err(Clone::clone))?;
        let word = word?;
        self.ext.abort_sinks.add(&word);
        let timeout_ns = u64::try_from(self.config().op_timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: `desc` is the resource window just registered, laid out by
        // `lay` with `lsa_barrier_count + barrier_count` barriers; the abort
        // word is host-mapped and lives as long as the handle (`abort_word`).
        let dev_comm = unsafe {
            DevComm::from_raw_parts(
                self.rank() as u32,
                self.count() as u32,
                desc,
                req.lsa_barrier_count + req.barrier_count,
                lay.barrier_offset,
                lay.epoch_offset,
                AbortInfo::new(word.device_addr(), timeout_ns),
            )
        };
        let mut dev_comm = dev_comm;
        let gin = self.create_gin(req)?;
        // Only a device communicator that exists holds its windows (a failed
        // GIN setup must not leave them underegistrable).
        for w in &windows {
            w.users.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(g) = &gin {
            // SAFETY: the GIN resources' state, whose memory and proxy live
            // as long as the handle (`gin`).
            dev_comm = unsafe { dev_comm.with_gin(g.state) };
        }
        tracing::debug!(rank = self.rank(), ?dev_comm, "device communicator created");
        Ok(DevCommHandle {
            comm: self,
            dev_comm,
            resource_window: Some(win),
            _resource_mem: mem,
            resource_offsets: lay.resource_offsets,
            req_id: req.id,
            world_barrier_base: req.lsa_barrier_count,
            abort_word: word,
            windows,
            gin,
        })
    }

    /// The GIN part of `create_dev_comm`: picks the backend (every rank
    /// agrees, or all fail with the first rank's error) and sets it up.
    fn create_gin(&self, req: &DevCommRequirements) -> Result<Option<crate::gin::resources::GinResources>> {
        use crate::gin::GinConnectionType;
        let backend = match req.gin_connection_type {
            GinConnectionType::None => return Ok(None),
            GinConnectionType::Full => self.gin_type(),
            GinConnectionType::Rail => self.railed_gin_type(),
        };
        // Load the library's kernels now: CUDA loads a module's code at its
        // first use, and loading waits for the device to go idle, which a
        // kernel waiting on the GIN proxy never does while the load blocks
        // the proxy's own stream work (issue 13). Users' modules are loaded
        // whole by `load_module`; load them before GIN kernels run too.
        let backend = backend.and_then(|b| self.device().library().map(|_| b));
        agree(self, "create_dev_comm (GIN backend)", backend.as_ref().map(|_| ()).map_err(Clone::clone))?;
        let backend = backend?;
        let res = crate::gin::resources::GinResources::create(self, req, backend);
        agree(self, "create_dev_comm (GIN setup)", res.as_ref().map(|_| ()).map_err(Clone::clone))?;
        res.map(Some)
    }
}

impl<'c> DevCommHandle<'c> {
    /// The device communicator, to pass to kernels by value.
    pub fn dev_comm(&self) -> DevComm {
        self.dev_comm
    }

    /// The communicator it belongs to.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The resource window's descriptor (also `dev_comm().resources`).
    pub fn resource_window(&self) -> WindowDesc {
        self.dev_comm.resources()
    }

    /// Offset in the resource window of a buffer asked for with
    /// [`DevCommRequirements::add_resource`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a handle of other requirements.
    pub fn resource_offset(&self, handle: ResourceHandle) -> Result<u64> {
        if handle.req_id != self.req_id {
            return Err(Error::invalid_argument("the resource handle belongs to other requirements"));
        }
        self.resource_offsets
            .get(handle.index)
            .copied()
            .ok_or_else(|| Error::invalid_argument(format!("no resource buffer {}", handle.index)))
    }

    /// Index of world barrier 0 among the LSA barriers.
    pub fn world_barrier_base(&self) -> u32 {
        self.world_barrier_base
    }

    /// The descriptor of `window`, one the requirements declared with
    /// [`DevCommRequirements::use_window`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a window not declared.
    pub fn window(&self, window: &Window<'_>) -> Result<WindowDesc> {
        if self.windows.iter().any(|w| Arc::ptr_eq(w, &window.shared)) {
            Ok(window.desc())
        } else {
            Err(Error::invalid_argument(format!(
                "window {} was not declared with use_window for this device communicator",
                window.id()
            )))
        }
    }

    /// Raises this device communicator's abort flag (what the communicator's
    /// abort or a peer's failure does): every device-side wait returns.
    pub fn set_abort(&self) {
        self.abort_word.set(1);
    }

    /// Whether the abort flag is raised.
    pub fn is_aborted(&self) -> bool {
        self.abort_word.get() != 0
    }

    /// Collective release (`ncclDevCommDestroy`): the windows it used may be
    /// deregistered afterwards. Kernels using it must have finished.
    ///
    /// Errors: the first error its GIN proxy met ([`DevCommHandle::gin_error`],
    /// e.g. a failed peer or an operation it could not carry out), which the
    /// communicator's `get_async_error` then no longer reports; a failed
    /// bootstrap barrier (the proxy's error, if any, stays with the
    /// communicator's `get_async_error`); a window deregistration error.
    /// Dropping the handle instead stops the proxy too and leaves its error
    /// to `get_async_error`.
    #[doc(alias = "ncclDevCommDestroy")]
    pub fn destroy(mut self) -> Result<()> {
        // Every rank has stopped posting before any proxy stops serving.
        let mut r = Ok(());
        if self.gin.is_some() {
            r = self.comm.bootstrap_barrier();
            if let Some(mut g) = self.gin.take() {
                let stopped = g.stop();
                if let (Err(_), Err(e)) = (&r, &stopped) {
                    // The caller gets the barrier's error: the communicator keeps the proxy's.
                    self.comm.ext.gin_errors.unclaimed(e.clone());
                }
                r = r.and(stopped);
            }
        }
        self.release_windows();
        let r2 = match self.resource_window.take() {
            Some(w) => w.deregister(),
            None => Ok(()),
        };
        drop(self);
        r.and(r2)
    }

    /// Host view of GIN signal `id` (user signals and barrier signals).
    fn gin_signal_word(&self, id: u32) -> Result<&std::sync::atomic::AtomicU64> {
        let g = self.gin.as_ref().ok_or_else(|| Error::invalid_usage("this device communicator has no GIN"))?;
        if id >= g.mem.total_signals {
            return Err(Error::invalid_argument(format!(
                "GIN signal {id} does not exist: the device communicator has {}",
                g.mem.total_signals
            )));
        }
        // SAFETY: the signal array holds total_signals aligned u64s, alive as
        // long as self (GinResources owns the buffer); accessed atomically.
        Ok(unsafe { std::sync::atomic::AtomicU64::from_ptr(g.mem.signals.add(id as usize)) })
    }

    /// Reads GIN signal `id` on this rank from the host.
    pub fn read_gin_signal(&self, id: u32) -> Result<u64> {
        Ok(self.gin_signal_word(id)?.load(Ordering::SeqCst))
    }

    /// Sets GIN signal `id` on this rank to 0 from the host. Only when no
    /// operation that signals it is in flight (e.g. between kernels, after a
    /// barrier); the device-side shadow is not touched.
    pub fn reset_gin_signal(&self, id: u32) -> Result<()> {
        self.gin_signal_word(id)?.store(0, Ordering::SeqCst);
        Ok(())
    }

    /// The GIN backend of this device communicator ([`GinType::None`](crate::gin::GinType) without GIN).
    pub fn gin_type(&self) -> crate::gin::GinType {
        self.gin.as_ref().map_or(crate::gin::GinType::None, |g| g.backend)
    }

    /// The first error the GIN proxy met while serving this device
    /// communicator (a malformed request, a failed peer, a device fault), if
    /// any — what a kernel sees as a failed ring (`GinError::Queue`), in
    /// words. `None` without GIN. Like `ncclCommGetAsyncError`, it does not
    /// block; [`DevCommHandle::destroy`] returns the same error.
    pub fn gin_error(&self) -> Option<Error> {
        self.gin.as_ref().and_then(|g| g.error())
    }

    /// Where this device communicator's GIN rings stand, in words, for
    /// diagnosing a stalled kernel; `None` without GIN. Per ring with
    /// traffic, `ring (context, peer): posted P, completed C` (tickets the
    /// device took, tickets the proxy completed), then `failed`, `next
    /// ready` (the proxy has not served a published descriptor) or `next
    /// unpublished` (it waits for the producer); and, when the proxy's
    /// thread has been inside one call for more than about 100 ms, for how
    /// long (usually another thread of the process in `cudaFree` or another
    /// driver call that waits for the device while holding the driver's
    /// lock). Reads the device's ticket counters on the device's stream.
    pub fn gin_progress(&self) -> Option<Result<String>> {
        self.gin.as_ref().map(|g| g.progress(self.comm.device()))
    }

    fn release_windows(&mut self) {
        for w in self.windows.drain(..) {
            w.users.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for DevCommHandle<'_> {
    fn drop(&mut self) {
        // The proxy (and its transport, which may copy into the windows or
        // have them registered with a NIC) stops before the windows go.
        drop(self.gin.take());
        self.release_windows();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_regions_are_aligned_and_disjoint() {
        let l = layout(3, 4, &[(100, 8), (5000, 4096), (1, 1)]).unwrap();
        assert_eq!(l.barrier_offset, 0);
        assert_eq!(l.epoch_offset, 256); // 3*4*4 = 48 bytes of inboxes
        assert_eq!(l.resource_offsets, vec![512, 4096, 9096]);
        assert_eq!(l.total, 9216);
        let e = layout(0, 1, &[]).unwrap();
        assert_eq!((e.epoch_offset, e.total), (0, 256));
        assert!(matches!(layout(1, 1, &[(u64::MAX, 1)]), Err(Error::InvalidArgument(_))));
    }
}
