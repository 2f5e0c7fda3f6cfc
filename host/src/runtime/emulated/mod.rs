//! The emulated runtime: host memory stands in for device memory, and a
//! kernel launch runs the kernel's host form on CPU threads.
//!
//! * A device is a number; its memory is ordinary host memory, so a "device
//!   pointer" is a host address that kernels dereference directly.
//! * A stream is a worker thread that executes its queue in order (copies,
//!   memsets, launches, event records); [`EmuStream::synchronize`] waits for
//!   the queue to drain and returns the first error, which stays (sticky).
//! * A launch runs on [`grid`]: one CPU thread per GPU thread, with per-block
//!   barriers and shared memory.
//!
//! The number of devices is `DEVCOMM_EMULATED_DEVICES` (default 8).
//!
//! ## Strict mode
//!
//! x86 orders memory more strongly than a GPU, and a CPU runs every block of
//! a small grid at once; a kernel that lacks a fence or a co-residency it
//! relies on would pass here and fail on a GPU. `DEVCOMM_EMU_STRICT=1` (CI
//! sets it) makes the emulator fail such kernels too ([`strict`] has the
//! details):
//!
//! * **weak memory**: the device crate's plain stores
//!   (`devcomm_device::lsa::copy`, `lsa::put_value`, `arch::store16`,
//!   `arch::store_volatile`, LSA reductions, the bulk-copy fallback ...)
//!   wait in a per-thread store buffer and reach memory — other threads,
//!   blocks, ranks, the GIN proxy — only at a release of the storing thread
//!   (a fence, a release or acq_rel atomic, a barrier it joins, the end of
//!   the kernel) or at a random later moment (up to 2 ms); a kernel that
//!   signals without a release reads wrong data, or waits until its device
//!   timeout. Plain
//!   Rust stores in a kernel (`*p = v`) are not intercepted: they land at
//!   once, as before, and should not be mixed with the library's store
//!   paths on the same bytes within one thread without a release between
//!   them. Scopes are modelled in one place: a barrier (or a CTA-scope
//!   fence or release) publishes a thread's stores to *peer* memory (other
//!   ranks' LSA windows) to its block only — they reach the peer at the
//!   next GPU- or system-scope release of any thread of the block — so "the
//!   block copies to a peer, joins a barrier, the leader signals relaxed"
//!   fails as on a GPU; stores to local memory are published by a barrier
//!   to everyone (a block-mate may read them with plain loads).
//! * **schedule**: blocks start in a random order, in waves of random size
//!   (one block to all that are left) unless the launch is
//!   [`LaunchConfig::co_resident`](super::LaunchConfig::co_resident);
//!   a block's threads are resumed in a random rotation; stream copies and
//!   stream writes — the GIN proxy's data path — start after a random delay.
//! * **races**: accesses through those store and load paths are checked
//!   for data races (two writers, or a writer and a reader, of an 8-byte
//!   word, not ordered by a release the other side acquired); the first
//!   fails the launch, naming both threads and both source locations.
//!   Only accesses within one process are compared.
//!
//! `DEVCOMM_EMU_STRICT` also takes a list of `memory`, `schedule`,
//! `races`. `DEVCOMM_EMU_SEED` fixes the random choices (the seed is
//! printed at the first strict launch and named in every strict launch
//! failure); the OS's interleaving of threads and processes stays random.

mod grid;
mod pool;
pub(crate) mod shm;
pub(crate) mod strict;

use super::LaunchConfig;
use crate::error::{Error, Result};
use devcomm_device::Kernel;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

/// Set to `1` to model CUDA's lazy loading (issue 13): a kernel's first
/// launch on a device loads it, and loading synchronizes the context —
/// it waits until every stream of the device is idle, and meanwhile every
/// other call that queues work on the device waits for it. Normally a
/// device's kernels all load together, at its first launch or at
/// `Device::library` (as `load_module` preloads them on CUDA); with
/// [`super::NO_PRELOAD_ENV`] set, each kernel loads at its own first launch
/// (what CUDA does without preloading). CI runs the tests with it on.
pub(crate) const LAZY_LOADING_ENV: &str = "DEVCOMM_EMU_LAZY_LOADING";

/// Set to `1` to model the CUDA driver's context lock around frees
/// (issue 15): freeing device memory waits until every stream of the
/// device is idle while holding the lock, so every other call that queues
/// work on the device — the GIN proxy's copies among them — waits for it,
/// as `cuMemFree` makes them on CUDA. `DeviceBuffer`'s drop waits for the
/// device first, without the lock (unless [`super::NO_DRAIN_ENV`] is set),
/// as it does on CUDA. CI runs the tests with it on.
pub(crate) const DRIVER_LOCK_ENV: &str = "DEVCOMM_EMU_DRIVER_LOCK";

fn driver_lock() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(DRIVER_LOCK_ENV).is_ok_and(|v| v.trim() == "1"))
}

/// What freeing memory of device `ordinal` does under [`DRIVER_LOCK_ENV`]:
/// waits until the device is idle, holding its context lock. Nothing
/// otherwise.
pub(crate) fn free_waits(ordinal: usize) -> Result<()> {
    if driver_lock() {
        let ls = load_state(ordinal);
        let _ctx = ls.ctx.write().unwrap_or_else(|p| p.into_inner());
        EmuDevice::open(ordinal)?.synchronize()?;
    }
    Ok(())
}

/// The context lock and loaded kernels of one emulated device (see
/// [`LAZY_LOADING_ENV`] and [`DRIVER_LOCK_ENV`]).
#[derive(Default)]
struct LoadState {
    ctx: std::sync::RwLock<()>,
    loaded: Mutex<std::collections::HashSet<&'static str>>,
}

fn lazy_loading() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(LAZY_LOADING_ENV).is_ok_and(|v| v.trim() == "1"))
}

/// The model's name for "every kernel of the device's modules", loaded at
/// once (what `load_module`'s preloading does on CUDA).
const MODULE_KEY: &str = "<module>";

/// Loads `key` on device `ordinal` if it is not loaded yet, as lazy loading
/// does: holding the context and waiting until the device is idle.
fn load_lazily(ordinal: usize, key: &'static str) -> Result<()> {
    let ls = load_state(ordinal);
    if !ls.loaded.lock().unwrap_or_else(|p| p.into_inner()).contains(key) {
        let _ctx = ls.ctx.write().unwrap_or_else(|p| p.into_inner());
        EmuDevice::open(ordinal)?.synchronize()?;
        ls.loaded.lock().unwrap_or_else(|p| p.into_inner()).insert(key);
    }
    Ok(())
}

/// Loads device `ordinal`'s modules now (under the lazy-loading model;
/// nothing otherwise), as `Device::library` does on CUDA.
pub(crate) fn load_modules(ordinal: usize) -> Result<()> {
    if lazy_loading() && !super::preload_disabled() {
        load_lazily(ordinal, MODULE_KEY)?;
    }
    Ok(())
}

fn load_state(ordinal: usize) -> Arc<LoadState> {
    static STATES: OnceLock<Mutex<HashMap<usize, Arc<LoadState>>>> = OnceLock::new();
    let mut m = STATES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    m.entry(ordinal).or_default().clone()
}

/// SM count the emulator reports (a launch-sizing hint only).
pub(crate) const EMULATED_SM_COUNT: u32 = 8;
const DEFAULT_DEVICE_COUNT: usize = 8;
/// Byte the emulator fills fresh allocations with, so unwritten memory shows.
const POISON: u8 = 0xCB;

pub(crate) fn device_count() -> usize {
    std::env::var("DEVCOMM_EMULATED_DEVICES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_DEVICE_COUNT)
}

/// An emulated GPU.
pub(crate) struct EmuDevice {
    pub(crate) ordinal: usize,
    streams: Mutex<Vec<std::sync::Weak<EmuStream>>>,
}

impl EmuDevice {
    /// Opens emulated device `ordinal` (one object per ordinal per process).
    pub(crate) fn open(ordinal: usize) -> Result<Arc<EmuDevice>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<EmuDevice>>>> = OnceLock::new();
        let n = device_count();
        if ordinal >= n {
            return Err(Error::invalid_argument(format!(
                "emulated device {ordinal} does not exist: {n} are configured (DEVCOMM_EMULATED_DEVICES)"
            )));
        }
        strict::check_config()?;
        grid::install_hooks();
        let mut map =
            DEVICES.get_or_init(Default::default).lock().map_err(|_| Error::internal("device table poisoned"))?;
        Ok(map
            .entry(ordinal)
            .or_insert_with(|| Arc::new(EmuDevice { ordinal, streams: Mutex::new(Vec::new()) }))
            .clone())
    }

    /// A stable identifier: "devcomm-emu" followed by the ordinal.
    pub(crate) fn uuid(&self) -> [u8; 16] {
        let mut u = [0u8; 16];
        u[..11].copy_from_slice(b"devcomm-emu");
        u[12..16].copy_from_slice(&(self.ordinal as u32).to_le_bytes());
        u
    }

    pub(crate) fn new_stream(&self) -> Arc<EmuStream> {
        let s = EmuStream::spawn(self.ordinal);
        if let Ok(mut v) = self.streams.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(Arc::downgrade(&s));
        }
        s
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        let streams: Vec<_> = match self.streams.lock() {
            Ok(v) => v.iter().filter_map(|w| w.upgrade()).collect(),
            Err(_) => return Err(Error::internal("stream list poisoned")),
        };
        streams.iter().try_for_each(|s| s.drain())
    }
}

/// Host memory standing in for device memory, 256-byte aligned, freed on drop.
pub(crate) struct HostAlloc {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: plain memory; concurrent access is the kernels' business, exactly
// as with device memory.
unsafe impl Send for HostAlloc {}
// SAFETY: as above.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    pub(crate) fn new(bytes: usize) -> Result<HostAlloc> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 256)
            .map_err(|e| Error::invalid_argument(format!("allocation of {bytes} bytes: {e}")))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::SystemError(format!("out of host memory allocating {bytes} bytes")));
        }
        // SAFETY: ptr is valid for layout.size() bytes.
        unsafe { std::ptr::write_bytes(ptr, POISON, layout.size()) };
        Ok(HostAlloc { ptr, layout })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

type Op = Box<dyn FnOnce() -> Result<()> + Send>;

/// Work a graph can run again.
type Replayable = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// One operation of a captured graph: an event to mark unrecorded when the
/// graph is launched (a record), and the work.
struct Captured {
    reset: Option<Arc<EmuEvent>>,
    op: Replayable,
}

/// What a stream recorded between `begin_capture` and `end_capture`.
pub(crate) struct EmuGraph {
    ordinal: usize,
    ops: Vec<Captured>,
}

impl EmuGraph {
    /// Whether this graph was captured on device `ordinal`.
    pub(crate) fn is_of(&self, ordinal: usize) -> bool {
        self.ordinal == ordinal
    }
}

#[derive(Default)]
struct StreamState {
    submitted: u64,
    completed: u64,
    error: Option<Error>,
}

/// An in-order queue served by one worker thread.
pub(crate) struct EmuStream {
    ordinal: usize,
    tx: Mutex<Option<mpsc::Sender<Op>>>,
    state: Arc<(Mutex<StreamState>, Condvar)>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    capture: Mutex<Option<Vec<Captured>>>,
}

impl EmuStream {
    fn spawn(ordinal: usize) -> Arc<EmuStream> {
        let (tx, rx) = mpsc::channel::<Op>();
        let state: Arc<(Mutex<StreamState>, Condvar)> = Arc::default();
        let st = state.clone();
        let worker = std::thread::Builder::new()
            .name(format!("devcomm-emu{ordinal}-stream"))
            .spawn(move || {
                for op in rx {
                    // After an error the stream is broken (as a CUDA context
                    // after a fault): later work is skipped, not run on bad data.
                    let failed = st.0.lock().map(|s| s.error.is_some()).unwrap_or(true);
                    let res = if failed { Ok(()) } else { op() };
                    let (lock, cv) = &*st;
                    if let Ok(mut s) = lock.lock() {
                        if let Err(e) = res {
                            s.error.get_or_insert(e);
                        }
                        s.completed += 1;
                    }
                    cv.notify_all();
                }
            })
            .expect("spawning an emulated stream thread");
        Arc::new(EmuStream {
            ordinal,
            tx: Mutex::new(Some(tx)),
            state,
            worker: Mutex::new(Some(worker)),
            capture: Mutex::new(None),
        })
    }

    fn submit(&self, op: Op) -> Result<()> {
        // A kernel being loaded or memory being freed holds the context:
        // queueing work waits.
        let ls = (lazy_loading() || driver_lock()).then(|| load_state(self.ordinal));
        let _ctx = ls.as_ref().map(|l| l.ctx.read().unwrap_or_else(|p| p.into_inner()));
        let tx = self.tx.lock().map_err(|_| Error::internal("stream poisoned"))?;
        let tx = tx.as_ref().ok_or_else(|| Error::invalid_usage("stream is destroyed"))?;
        self.state.0.lock().map_err(|_| Error::internal("stream poisoned"))?.submitted += 1;
        tx.send(op).map_err(|_| Error::internal("emulated stream worker is gone"))
    }

    /// Queues `op`, or records it while the stream captures a graph.
    fn enqueue(&self, op: Replayable, reset: Option<Arc<EmuEvent>>) -> Result<()> {
        {
            let mut capture = self.capture.lock().map_err(|_| Error::internal("stream poisoned"))?;
            if let Some(list) = capture.as_mut() {
                list.push(Captured { reset, op });
                return Ok(());
            }
        }
        if let Some(ev) = reset {
            *ev.at.lock().map_err(|_| Error::internal("event poisoned"))? = None;
            ev.recorded.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.submit(Box::new(move || op()))
    }

    /// Refuses `what` (work the caller waits for) while capturing, as CUDA
    /// refuses to synchronize with a capturing stream.
    fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.capture.lock().map_err(|_| Error::internal("stream poisoned"))?.is_some() {
            return Err(Error::invalid_usage(format!(
                "{what} on a stream that is capturing a graph (end the capture first)"
            )));
        }
        Ok(())
    }

    pub(crate) fn begin_capture(&self) -> Result<()> {
        let mut capture = self.capture.lock().map_err(|_| Error::internal("stream poisoned"))?;
        if capture.is_some() {
            return Err(Error::invalid_usage("begin_capture: the stream is capturing already"));
        }
        *capture = Some(Vec::new());
        Ok(())
    }

    pub(crate) fn end_capture(&self) -> Result<EmuGraph> {
        let ops = self.capture.lock().map_err(|_| Error::internal("stream poisoned"))?.take();
        let ops = ops.ok_or_else(|| Error::invalid_usage("end_capture: the stream was not capturing"))?;
        Ok(EmuGraph { ordinal: self.ordinal, ops })
    }

    /// The device this stream belongs to.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(crate) fn is_capturing(&self) -> Result<bool> {
        Ok(self.capture.lock().map_err(|_| Error::internal("stream poisoned"))?.is_some())
    }

    /// Queues (or, while capturing, records) one run of `graph`'s work.
    ///
    /// # Safety
    /// Whatever the captured work touches is alive until the stream passes
    /// this point.
    pub(crate) unsafe fn launch_graph(&self, graph: &EmuGraph) -> Result<()> {
        for c in &graph.ops {
            self.enqueue(c.op.clone(), c.reset.clone())?;
        }
        Ok(())
    }

    /// # Safety
    /// The kernel's pointer arguments must be valid for its whole run.
    pub(crate) unsafe fn launch<K: Kernel>(&self, cfg: LaunchConfig, args: K::Args) -> Result<()> {
        if cfg.co_resident {
            // Refused at once, as CUDA refuses a cooperative launch too large.
            grid::check_co_resident(&cfg, K::NAME)?;
        }
        if lazy_loading() {
            let key = if super::preload_disabled() { K::NAME } else { MODULE_KEY };
            load_lazily(self.ordinal, key)?;
        }
        let job = grid::GridJob::<K::Args> { func: K::emulate, args, cfg, name: K::NAME };
        let job = grid::SendJob(job);
        self.enqueue(
            Arc::new(move || {
                // SAFETY: the caller of `launch` vouched for the arguments
                // (for every run of a graph that captured it, the caller of
                // `launch_graph` did).
                unsafe { job.run() }
            }),
            None,
        )
    }

    pub(crate) fn write(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.refuse_while_capturing("a synchronous write")?;
        let (d, s, n) = (dst as usize, src.as_ptr() as usize, src.len());
        self.submit(Box::new(move || {
            // SAFETY: dst is a live allocation of at least n bytes (checked by
            // the caller) and `src` outlives the op because we wait for it
            // below; a borrowed slice does not overlap device memory.
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, n) };
            Ok(())
        }))?;
        self.synchronize()
    }

    pub(crate) fn read(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.refuse_while_capturing("a synchronous read")?;
        let (s, d, n) = (src as usize, dst.as_mut_ptr() as usize, dst.len());
        self.submit(Box::new(move || {
            // SAFETY: as in `write`, the other way round: `src` is a live
            // allocation of at least n bytes and `dst` outlives the op (we
            // wait for it below).
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, n) };
            Ok(())
        }))?;
        self.synchronize()
    }

    /// As [`EmuStream::write`], waiting at most `limit`: the op copies from
    /// a copy of `src` of its own, so giving up leaves nothing borrowed.
    pub(crate) fn write_within(&self, dst: u64, src: &[u8], limit: std::time::Duration) -> Result<()> {
        self.refuse_while_capturing("a synchronous write")?;
        let (d, data) = (dst as usize, src.to_vec());
        self.submit(Box::new(move || {
            // SAFETY: dst is a live allocation of at least data.len() bytes
            // (checked by the caller); `data` is owned by the op.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), d as *mut u8, data.len()) };
            Ok(())
        }))?;
        self.synchronize_within(limit)
    }

    /// As [`EmuStream::read`], waiting at most `limit`: the op copies into
    /// a buffer of its own, handed over once it has run.
    pub(crate) fn read_within(&self, src: u64, dst: &mut [u8], limit: std::time::Duration) -> Result<()> {
        self.refuse_while_capturing("a synchronous read")?;
        let (s, n) = (src as usize, dst.len());
        let out = Arc::new(Mutex::new(vec![0u8; n]));
        let theirs = out.clone();
        self.submit(Box::new(move || {
            let mut v = theirs.lock().map_err(|_| Error::internal("read buffer poisoned"))?;
            // SAFETY: `src` is a live allocation of at least n bytes (checked
            // by the caller); `v` is the op's own buffer of n bytes.
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, v.as_mut_ptr(), n) };
            Ok(())
        }))?;
        self.synchronize_within(limit)?;
        dst.copy_from_slice(&out.lock().map_err(|_| Error::internal("read buffer poisoned"))?);
        Ok(())
    }

    /// As [`EmuStream::synchronize`], giving up with `Timeout` after `limit`.
    pub(crate) fn synchronize_within(&self, limit: std::time::Duration) -> Result<()> {
        self.refuse_while_capturing("synchronize")?;
        let end = std::time::Instant::now() + limit;
        let (lock, cv) = &*self.state;
        let mut s = lock.lock().map_err(|_| Error::internal("stream poisoned"))?;
        while s.completed < s.submitted {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "the stream has not run its work within {limit:?} ({} of {} operations done)",
                    s.completed, s.submitted
                )));
            }
            s = cv.wait_timeout(s, left).map_err(|_| Error::internal("stream poisoned"))?.0;
        }
        match &s.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Queues `op` (tests: a stream held up by work that does not finish).
    #[cfg(test)]
    pub(crate) fn submit_for_test(&self, op: Box<dyn FnOnce() -> Result<()> + Send>) -> Result<()> {
        self.submit(op)
    }

    /// # Safety
    /// Both ranges are live host memory until the stream passes this point.
    pub(crate) unsafe fn memcpy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.memcpy_batch(&[(dst, src, bytes)]) }
    }

    /// # Safety
    /// Every range is live host memory until the stream passes this point.
    pub(crate) unsafe fn memcpy_batch(&self, copies: &[(u64, u64, usize)]) -> Result<()> {
        let copies = copies.to_vec();
        let op = move || {
            strict::copy_delay();
            for &(d, s, bytes) in &copies {
                // SAFETY: the caller's contract: both ranges are live until
                // the stream runs this op (it is in the stream, so they are);
                // the ranges come from `Stream::memcpy_raw` /
                // `memcpy_batch_raw`, whose contracts exclude overlap.
                unsafe { std::ptr::copy_nonoverlapping(s as usize as *const u8, d as usize as *mut u8, bytes) };
            }
            Ok(())
        };
        self.enqueue(Arc::new(op), None)
    }

    pub(crate) fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        let d = dst as usize;
        let op = move || {
            // SAFETY: dst is a live buffer of `bytes` bytes; the caller keeps
            // it alive until the stream passes this point (as with CUDA).
            unsafe { std::ptr::write_bytes(d as *mut u8, value, bytes) };
            Ok(())
        };
        self.enqueue(Arc::new(op), None)
    }

    pub(crate) fn record(&self, event: &Arc<EmuEvent>) -> Result<()> {
        let ev = event.clone();
        let op = move || {
            if let Ok(mut at) = ev.at.lock() {
                *at = Some(Instant::now());
            }
            ev.cv.notify_all();
            Ok(())
        };
        self.enqueue(Arc::new(op), Some(event.clone()))
    }

    /// Whether every submitted op has run; the stream's error if one failed.
    pub(crate) fn is_idle(&self) -> Result<bool> {
        self.refuse_while_capturing("a query")?;
        let s = self.state.0.lock().map_err(|_| Error::internal("stream poisoned"))?;
        match &s.error {
            Some(e) => Err(e.clone()),
            None => Ok(s.completed == s.submitted),
        }
    }

    /// # Safety
    /// Every address is a live, 8-aligned word until the stream passes
    /// this point, accessed atomically by everybody.
    pub(crate) unsafe fn write_values(&self, ops: &[(u64, u64, bool)]) -> Result<()> {
        let ops = ops.to_vec();
        let op = move || {
            strict::copy_delay();
            for &(addr, value, _barrier) in &ops {
                // SAFETY: forwarded from the caller. SeqCst orders the store
                // after everything this worker did before (earlier ops).
                unsafe { std::sync::atomic::AtomicU64::from_ptr(addr as *mut u64) }
                    .store(value, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(())
        };
        self.enqueue(Arc::new(op), None)
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.refuse_while_capturing("synchronize")?;
        self.drain()
    }

    /// Waits until every submitted operation has run (what a capture
    /// records is not submitted): the device-wide waits of lazy loading and
    /// of frees, which a capturing stream must not refuse.
    fn drain(&self) -> Result<()> {
        let (lock, cv) = &*self.state;
        let mut s = lock.lock().map_err(|_| Error::internal("stream poisoned"))?;
        while s.completed < s.submitted {
            s = cv.wait(s).map_err(|_| Error::internal("stream poisoned"))?;
        }
        match &s.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for EmuStream {
    fn drop(&mut self) {
        // Closing the channel ends the worker once its queue is drained.
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut w) = self.worker.lock() {
            if let Some(h) = w.take() {
                let _ = h.join();
            }
        }
    }
}

/// An emulated event: the host time at which its stream reached it.
#[derive(Default)]
pub(crate) struct EmuEvent {
    at: Mutex<Option<Instant>>,
    cv: Condvar,
    /// Recorded at least once (an event never recorded counts as reached, as in CUDA).
    recorded: std::sync::atomic::AtomicBool,
}

impl EmuEvent {
    /// Whether the stream passed the event's last record (never recorded:
    /// yes, as `cuEventQuery`). Does not block.
    pub(crate) fn query(&self) -> Result<bool> {
        let at = self.at.lock().map_err(|_| Error::internal("event poisoned"))?;
        Ok(at.is_some() || !self.recorded.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn wait(&self) -> Result<Instant> {
        let mut at = self.at.lock().map_err(|_| Error::internal("event poisoned"))?;
        loop {
            if let Some(t) = *at {
                return Ok(t);
            }
            let (g, timeout) = self
                .cv
                .wait_timeout(at, std::time::Duration::from_secs(60))
                .map_err(|_| Error::internal("event poisoned"))?;
            if timeout.timed_out() && g.is_none() {
                return Err(Error::invalid_usage("event was never recorded (waited 60 s)"));
            }
            at = g;
        }
    }

    pub(crate) fn elapsed_ms(&self, end: &EmuEvent) -> Result<f32> {
        let (a, b) = (self.wait()?, end.wait()?);
        Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3)
    }
}
