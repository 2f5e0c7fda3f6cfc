//! Stream-ordered one-sided operations from the host (NCCL's host RMA:
//! `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`).
//!
//! A [`HostRma`] (made collectively with [`Communicator::host_rma`]) owns a
//! device communicator with GIN. Its calls are **launches of tiny library
//! kernels** on the caller's stream (one thread each) that post GIN
//! operations, exactly as a user's kernel would: no host thread blocks, the
//! call returns once the launch is queued, and the stream runs it in order
//! with the caller's other work.
//!
//! * [`HostRma::put_signal`]: the source's elements land in `peer`'s window
//!   at `offset` (in elements, as NCCL counts), then the peer's signal is
//!   incremented. The source is a range of a registered window (read in
//!   place) or a [`DeviceBuffer`] (copied through a staging area of the
//!   `HostRma` first, in chunks of [`RmaConfig::stage_bytes`]). When the
//!   stream passes the call, the source may be reused. Staged puts of one
//!   `HostRma` share its staging area: do not run them on two streams at
//!   once (as with `Collectives`).
//! * [`HostRma::signal`]: only the increment, after every earlier operation
//!   of the same context to that peer.
//! * [`HostRma::wait_signal`]: the stream waits until the listed numbers of
//!   signal operations from the listed peers have arrived (and consumes
//!   them). A wait that does not end within the communicator's op timeout
//!   fails (no hang): the error is kept and returned by the next call and
//!   by [`HostRma::synchronize`] (as the collectives do).
//!
//! Signals are **per sender**, as NCCL's host signals: host signal `s` from
//! rank `p` is GIN signal [`HostRma::gin_signal`]`(s, p)` (`s * ranks + p`)
//! of [`HostRma::dev_comm`]. Kernels may use that device communicator too:
//! a kernel's `Gin::put`/`signal` with `SignalInc` on that id counts as one
//! signal operation from its rank to a host `wait_signal`, and a kernel
//! waiting on that id sees host `put_signal`s (the proxy applies both with
//! the same atomic add; data before signal either way). `wait_signal`
//! consumes by advancing the signal's device-side shadow
//! (`increase_signal_shadow` + `wait_signal`): a kernel that waits with
//! `wait_signal_meet_shadow` / `increase_signal_shadow` shares that count.
//!
//! Peers of this rank's LSA team (GPUs of the node, their windows mapped
//! here) take direct paths: for puts of at least
//! [`RmaConfig::direct_min_bytes`] one copy-engine copy on the caller's
//! stream into the peer's window, then the signal through the proxy; for
//! puts of at most [`RmaConfig::sm_copy_max_bytes`] one kernel that copies
//! with stores, releases them at system scope and posts the signal — the
//! same signal word either way, after data that is complete. Everything
//! else goes through the proxy: the
//! copy-engine transport on one host, TCP (or verbs) between hosts,
//! `DEVCOMM_GIN_TRANSPORT` choosing as for every GIN user.
//!
//! ```
//! use devcomm::prelude::*;
//! use devcomm::rma::WaitSignal;
//!
//! let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
//! let mems: Vec<_> = comms.iter().map(|c| c.mem_alloc(4096)).collect::<Result<_>>()?;
//! std::thread::scope(|s| {
//!     for (comm, mem) in comms.iter().zip(&mems) {
//!         s.spawn(move || -> devcomm::Result<()> {
//!             let win = comm.register_window(mem, WindowFlags::COLL_SYMMETRIC)?;
//!             let rma = comm.host_rma(&[&win])?;
//!             let stream = comm.device().stream();
//!             let (me, peer) = (comm.rank(), 1 - comm.rank());
//!             let x = comm.device().alloc_from(&[me as u32 + 10; 3])?;
//!             rma.put_signal(&x, peer, &win, 5, 0, stream)?; // elements 5..8 of the peer's window
//!             rma.wait_signal(&[WaitSignal::new(peer, 1)], stream)?;
//!             let mut got = [0u32; 3];
//!             win.read(stream, 5 * 4, &mut got)?;
//!             assert_eq!(got, [peer as u32 + 10; 3]);
//!             rma.synchronize(stream)
//!         });
//!     }
//! });
//! # Ok::<(), devcomm::Error>(())
//! ```

use crate::comm::Communicator;
use crate::dev_comm::{DevCommHandle, DevCommRequirements};
use crate::error::{Error, Result};
use crate::gin::GinConnectionType;
use crate::runtime::{DeviceBuffer, HostMappedWord, LaunchConfig, Stream};
use crate::window::Window;
use bytemuck::Pod;
use devcomm_device::abi::rma::{RmaWaitEntry, RmaWaitList, RMA_WAIT_MAX};
use devcomm_device::comm::{DevComm, WindowDesc};
use std::marker::PhantomData;

/// How a [`HostRma`] is built.
#[derive(Clone, Debug)]
pub struct RmaConfig {
    /// Host signals per sending peer (ids `0..signals`). NCCL allows only
    /// signal 0 today; devcomm allows more.
    pub signals: u32,
    /// GIN contexts (independent rings per peer; ids `0..contexts`). NCCL
    /// allows only context 0 today; devcomm allows more.
    pub contexts: u32,
    /// Bytes of the staging area through which [`DeviceBuffer`] sources
    /// are copied (a multiple of 16; window sources need none).
    pub stage_bytes: usize,
    /// Descriptors per GIN ring (0: the default).
    pub queue_depth: u32,
    /// Puts of at least this many bytes to a peer of this rank's LSA team
    /// (another GPU of the node, whose window is mapped here) take the
    /// direct path: one copy-engine copy on the caller's stream straight
    /// into the peer's window, then the signal through the proxy (no
    /// staging, no proxy copy). Smaller ones, and puts to other nodes or
    /// to oneself, go through the proxy. `usize::MAX`: never. Default
    /// 128 KiB, or `DEVCOMM_RMA_DIRECT_MIN_BYTES`: on 2 × H200 the SM copy
    /// beat the copy engine up to 64 KiB (8 B / 4 KiB round trip 14.6 /
    /// 14.8 µs against 29; 64 KiB puts 9.1 against 5.1–7.0 GB/s) and they
    /// met at 256 KiB (22.6 against 22.0–26.5 GB/s;
    /// `benches/results/2026-11-26-h200x2-ll-rooted-rma-p2p.md`).
    pub direct_min_bytes: usize,
    /// Puts of at most this many bytes (and at least one) to a peer of this
    /// rank's LSA team take the SM-copy direct path: one kernel copies them
    /// into the peer's window with stores, releases them at system scope and
    /// posts the signal through the proxy (one launch, no proxy copy). 0:
    /// never. Default 128 KiB - 1 (with `direct_min_bytes` 128 KiB every
    /// put within the node is direct), or `DEVCOMM_RMA_SM_COPY_MAX_BYTES`.
    /// Where both apply, the copy engine wins.
    pub sm_copy_max_bytes: usize,
}

/// Env: [`RmaConfig::sm_copy_max_bytes`]'s default.
pub const SM_COPY_MAX_BYTES_ENV: &str = "DEVCOMM_RMA_SM_COPY_MAX_BYTES";

/// Env: [`RmaConfig::direct_min_bytes`]'s default.
pub const DIRECT_MIN_BYTES_ENV: &str = "DEVCOMM_RMA_DIRECT_MIN_BYTES";

impl Default for RmaConfig {
    fn default() -> Self {
        let env = |name: &str, default: usize| {
            std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
        };
        RmaConfig {
            signals: 1,
            contexts: 1,
            stage_bytes: 4 << 20,
            queue_depth: 0,
            direct_min_bytes: env(DIRECT_MIN_BYTES_ENV, 128 << 10),
            sm_copy_max_bytes: env(SM_COPY_MAX_BYTES_ENV, (128 << 10) - 1),
        }
    }
}

/// One entry of [`HostRma::wait_signal`] (NCCL's `ncclWaitSignalDesc_t`):
/// wait until `op_count` more signal operations on signal `signal` from
/// `peer` have arrived.
#[doc(alias = "ncclWaitSignalDesc_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitSignal {
    /// The sending rank.
    pub peer: usize,
    /// How many signal operations to wait for (and consume).
    pub op_count: u64,
    /// Signal id (below [`RmaConfig::signals`]).
    pub signal: u32,
    /// GIN context whose failed rings end the wait early (below [`RmaConfig::contexts`]).
    pub context: u32,
}

impl WaitSignal {
    /// `op_count` signal operations from `peer` on signal 0, context 0.
    pub fn new(peer: usize, op_count: u64) -> Self {
        WaitSignal { peer, op_count, signal: 0, context: 0 }
    }
}

/// The source of a [`HostRma::put_signal`]: elements of a [`DeviceBuffer`]
/// (staged) or of a registered window (read in place).
#[derive(Clone, Copy, Debug)]
pub struct RmaSource<'a, T> {
    ptr: u64,
    len: usize,
    ordinal: usize,
    /// (descriptor, byte offset, communicator key) for window sources.
    window: Option<(WindowDesc, u64, usize)>,
    _t: PhantomData<&'a T>,
}

impl<'a, T: Pod> From<&'a DeviceBuffer<T>> for RmaSource<'a, T> {
    fn from(b: &'a DeviceBuffer<T>) -> Self {
        RmaSource { ptr: b.device_addr(), len: b.len(), ordinal: b.device().ordinal(), window: None, _t: PhantomData }
    }
}

impl<'a, T: Pod> From<&'a mut DeviceBuffer<T>> for RmaSource<'a, T> {
    fn from(b: &'a mut DeviceBuffer<T>) -> Self {
        RmaSource::from(&*b)
    }
}

impl<'a, T: Pod> RmaSource<'a, T> {
    /// Elements `start..start + len` of `buffer`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a range past the buffer's end.
    pub fn range(buffer: &'a DeviceBuffer<T>, start: usize, len: usize) -> Result<Self> {
        if start.checked_add(len).is_none_or(|e| e > buffer.len()) {
            return Err(Error::invalid_argument(format!(
                "put_signal source range {start}..{start}+{len} past the buffer's {} elements",
                buffer.len()
            )));
        }
        let mut s = RmaSource::from(buffer);
        s.ptr += (start * std::mem::size_of::<T>()) as u64;
        s.len = len;
        Ok(s)
    }

    /// `len` elements at element `offset` of this rank's `window` (read in
    /// place by the proxy: no staging copy).
    ///
    /// Errors: [`Error::InvalidArgument`] for a range past the window's end.
    pub fn window(window: &'a Window<'_>, offset: usize, len: usize) -> Result<Self> {
        let size = std::mem::size_of::<T>();
        let (start, bytes) = element_range::<T>(offset, len)
            .filter(|&(s, b)| s.checked_add(b).is_some_and(|e| e <= window.size() as u64))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "put_signal source of {len} elements of {size} bytes at element {offset}: past the window's {} bytes",
                    window.size()
                ))
            })?;
        let _ = bytes;
        Ok(RmaSource {
            ptr: window.user_ptr() + start,
            len,
            ordinal: window.comm().device().ordinal(),
            window: Some((window.desc(), start, crate::window::comm_key(window.comm()))),
            _t: PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// (byte start, byte length) of `len` elements at element `offset`, if no overflow.
fn element_range<T>(offset: usize, len: usize) -> Option<(u64, u64)> {
    let size = std::mem::size_of::<T>() as u64;
    Some(((offset as u64).checked_mul(size)?, (len as u64).checked_mul(size)?))
}

/// Stream-ordered put/signal/wait on one communicator (see the [module docs](self)).
pub struct HostRma<'c> {
    comm: &'c Communicator,
    /// Always `Some` but inside `destroy`.
    handle: Option<DevCommHandle<'c>>,
    config: RmaConfig,
    stage_offset: u64,
    world: crate::team::Team,
    error: HostMappedWord,
}

impl std::fmt::Debug for HostRma<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRma").field("rank", &self.comm.rank()).field("config", &self.config).finish()
    }
}

impl Communicator {
    /// Host RMA on this communicator into `windows` (every window a
    /// `put_signal` may write to; every rank passes the same windows in the
    /// same order), with the default [`RmaConfig`]. Collective.
    ///
    /// Errors: those of [`Communicator::host_rma_with`].
    #[doc(alias = "ncclPutSignal")]
    #[doc(alias = "ncclSignal")]
    #[doc(alias = "ncclWaitSignal")]
    pub fn host_rma(&self, windows: &[&Window<'_>]) -> Result<HostRma<'_>> {
        self.host_rma_with(windows, &RmaConfig::default())
    }

    /// [`Communicator::host_rma`] with `config`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a config out of range (no
    /// signals or contexts, more than the GIN limits, a staging size not a
    /// multiple of 16 up to 1 GiB) or a window of another communicator;
    /// [`Error::InvalidUsage`] when no GIN backend is available; those of
    /// [`Communicator::create_dev_comm`].
    pub fn host_rma_with(&self, windows: &[&Window<'_>], config: &RmaConfig) -> Result<HostRma<'_>> {
        let n = self.count() as u64;
        let max_ids = crate::dev_comm::MAX_GIN_IDS as u64;
        if config.signals == 0 || config.signals as u64 * n > max_ids {
            return Err(Error::invalid_argument(format!(
                "RmaConfig::signals {} not in 1..={} (signals × ranks ({n}) must fit the {max_ids} GIN signals)",
                config.signals,
                max_ids / n
            )));
        }
        if config.contexts == 0 || config.contexts > crate::dev_comm::MAX_GIN_CONTEXTS {
            return Err(Error::invalid_argument(format!(
                "RmaConfig::contexts {} not in 1..={}",
                config.contexts,
                crate::dev_comm::MAX_GIN_CONTEXTS
            )));
        }
        if config.stage_bytes == 0 || config.stage_bytes % 16 != 0 || config.stage_bytes > (1 << 30) {
            return Err(Error::invalid_argument(format!(
                "RmaConfig::stage_bytes {} not a non-zero multiple of 16 up to 1 GiB",
                config.stage_bytes
            )));
        }
        for w in windows {
            if crate::window::comm_key(w.comm()) != crate::window::comm_key(self) {
                return Err(Error::invalid_argument(format!(
                    "host_rma: window {} belongs to another communicator",
                    w.id()
                )));
            }
        }
        let mut req = DevCommRequirements::new();
        req.gin_connection_type = GinConnectionType::Full;
        req.gin_signal_count = config.signals * n as u32;
        req.gin_context_count = config.contexts;
        req.gin_queue_depth = config.queue_depth;
        for w in windows {
            req.use_window(w);
        }
        let stage = req.add_resource(config.stage_bytes as u64, 256);
        let handle = self.create_dev_comm(&req).map_err(|e| e.context("host_rma"))?;
        let stage_offset = handle.resource_offset(stage)?;
        let error = HostMappedWord::new(self.device())?;
        let world = self.team(crate::team::TeamKind::World)?;
        Ok(HostRma { comm: self, handle: Some(handle), config: config.clone(), stage_offset, world, error })
    }
}

/// Dropping waits for this device's queued work (the kernels of queued
/// operations use the device communicator and the error word); a wait
/// that cannot be satisfied ends with the op timeout. Then this rank's
/// side is released without talking to other ranks.
impl Drop for HostRma<'_> {
    fn drop(&mut self) {
        if self.handle.is_some() {
            let _ = self.comm.device().synchronize();
        }
    }
}

impl<'c> HostRma<'c> {
    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The device communicator the operations post on: pass
    /// `dev_comm().dev_comm()` to kernels that put, signal or wait on the
    /// same signals (ids from [`HostRma::gin_signal`]).
    pub fn dev_comm(&self) -> &DevCommHandle<'c> {
        self.handle()
    }

    /// The configuration.
    pub fn config(&self) -> &RmaConfig {
        &self.config
    }

    /// The GIN signal id of host signal `signal` sent by rank `from`
    /// (`signal * ranks + from`), in [`HostRma::dev_comm`]: the word a
    /// kernel signals to count as `from`'s signal operation, or waits on.
    ///
    /// Errors: [`Error::InvalidArgument`] for a signal or rank out of range.
    pub fn gin_signal(&self, signal: u32, from: usize) -> Result<u32> {
        self.check_signal(signal, "gin_signal")?;
        self.check_peer(from, "gin_signal")?;
        Ok(signal * self.comm.count() as u32 + from as u32)
    }

    /// The failure an operation's kernel reported, if any (kept until this
    /// object is dropped: after a failed wait the signals' counts are unknown),
    /// or the first error of the GIN proxy serving it.
    pub fn error(&self) -> Option<Error> {
        Error::from_device_code(self.error.get(), "a host RMA operation").or_else(|| self.handle().gin_error())
    }

    /// Waits for `stream`, then returns the first failure ([`HostRma::error`]).
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        stream.synchronize()?;
        self.error().map_or(Ok(()), Err)
    }

    /// Collective release (`ncclDevCommDestroy` of its device communicator):
    /// waits for this device's queued work first, then releases on every rank.
    pub fn destroy(mut self) -> Result<()> {
        let idle = self.comm.device().synchronize();
        let r = match self.handle.take() {
            Some(h) => h.destroy(),
            None => Ok(()),
        };
        idle.and(r)
    }

    fn handle(&self) -> &DevCommHandle<'c> {
        // Taken only by `destroy`, which consumes `self`.
        self.handle.as_ref().expect("HostRma's device communicator is present until destroy")
    }

    fn check_signal(&self, signal: u32, what: &str) -> Result<()> {
        below(signal as usize, self.config.signals as usize, what, "signal", "RmaConfig::signals")
    }

    fn check_context(&self, context: u32, what: &str) -> Result<()> {
        below(context as usize, self.config.contexts as usize, what, "context", "RmaConfig::contexts")
    }

    fn check_peer(&self, peer: usize, what: &str) -> Result<()> {
        below(peer, self.comm.count(), what, "peer", "the rank count")
    }

    /// The kept failure, as an `Err`.
    fn sticky(&self) -> Result<()> {
        self.error().map_or(Ok(()), Err)
    }

    /// `src`'s elements into `peer_window` of `peer` at element `offset`,
    /// then `peer`'s signal `signal` (from this rank) + 1, on context 0
    /// (`ncclPutSignal`). Stream-ordered; returns once queued.
    ///
    /// Errors: [`Error::InvalidArgument`] for a peer, signal or range out of
    /// range, a window not passed to [`Communicator::host_rma`], a source
    /// on another device or communicator; the kept failure of an earlier
    /// operation.
    #[doc(alias = "ncclPutSignal")]
    pub fn put_signal<'a, T: Pod>(
        &self,
        src: impl Into<RmaSource<'a, T>>,
        peer: usize,
        peer_window: &Window<'_>,
        offset: usize,
        signal: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.put_signal_on(src, peer, peer_window, offset, signal, 0, stream)
    }

    /// [`HostRma::put_signal`] on GIN context `context`.
    ///
    /// Errors: as [`HostRma::put_signal`], and [`Error::InvalidArgument`]
    /// for a context out of range.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_on<'a, T: Pod>(
        &self,
        src: impl Into<RmaSource<'a, T>>,
        peer: usize,
        peer_window: &Window<'_>,
        offset: usize,
        signal: u32,
        context: u32,
        stream: &Stream,
    ) -> Result<()> {
        let what = "put_signal";
        let src = src.into();
        self.check_peer(peer, what)?;
        self.check_signal(signal, what)?;
        self.check_context(context, what)?;
        let dst = self.handle().window(peer_window).map_err(|e| {
            Error::invalid_argument(format!("{what}: {e} (pass the window to host_rma when creating it)"))
        })?;
        if src.ordinal != self.comm.device().ordinal() {
            return Err(Error::invalid_argument(format!(
                "{what}: the source is on device {}, the communicator on device {}",
                src.ordinal,
                self.comm.device().ordinal()
            )));
        }
        let (dst_offset, bytes) = element_range::<T>(offset, src.len)
            .filter(|&(s, b)| s.checked_add(b).is_some_and(|e| e <= peer_window.size() as u64))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{what}: {} elements of {} bytes at element {offset} are past the peer window's {} bytes",
                    src.len,
                    std::mem::size_of::<T>(),
                    peer_window.size()
                ))
            })?;
        self.sticky()?;
        let gin_signal = signal * self.comm.count() as u32 + self.comm.rank() as u32;
        if let Some((win, src_offset, _)) = src.window {
            if peer == self.comm.rank()
                && win.id() == dst.id()
                && src_offset < dst_offset + bytes
                && dst_offset < src_offset + bytes
            {
                return Err(Error::invalid_argument(format!(
                    "{what}: a put to this rank's own window overlaps its source (bytes {src_offset}.. and {dst_offset}.., {bytes} each)"
                )));
            }
        }
        // Direct paths: a peer of this rank's LSA team, its window mapped here.
        let ce = bytes as usize >= self.config.direct_min_bytes;
        let sm = !ce && bytes as usize <= self.config.sm_copy_max_bytes;
        let direct = (bytes > 0 && (ce || sm) && peer != self.comm.rank())
            .then(|| peer_window.peer_pointer(&self.world, peer, dst_offset as usize).ok())
            .flatten();
        if direct.is_some() && src.window.is_some_and(|(_, _, key)| key != crate::window::comm_key(self.comm)) {
            return Err(Error::invalid_argument(format!("{what}: the source window belongs to another communicator")));
        }
        if let (Some(dst_ptr), true) = (direct, sm) {
            let threads = match self.comm.device().kind() {
                crate::runtime::RuntimeKind::Cuda => 256,
                crate::runtime::RuntimeKind::Emulated => 32,
            };
            let args = (
                self.dc(),
                dst_ptr,
                src.ptr,
                bytes,
                peer as u32,
                gin_signal,
                context,
                self.error.device_addr() as *mut u32,
            );
            // SAFETY: `dst_ptr .. + bytes` is the peer's window range mapped
            // here (`peer_pointer` checked the LSA team, the range was checked
            // against the window's size above); `src.ptr .. + bytes` is the
            // caller's buffer or window range on this device, alive for the
            // call's borrow; different ranks' memory. The device communicator
            // is ours (GIN, the signal id and context checked); the error word
            // is host-mapped and ours.
            return unsafe {
                stream.launch::<devcomm_kernels::rma::rma_put_lsa_signal>(LaunchConfig::new(1, threads), args)
            };
        }
        if let Some(dst_ptr) = direct {
            // SAFETY: `dst_ptr .. + bytes` is the peer's window range, mapped
            // here (`peer_pointer` checked the LSA team; the range was checked
            // against the window's size above); `src.ptr .. + bytes` is the
            // caller's buffer or window range on this device, alive for the
            // call's borrow (freeing device memory waits for the device);
            // different ranks' memory, so they do not overlap.
            unsafe { stream.memcpy_raw(dst_ptr, src.ptr, bytes as usize) }?;
            // The signal after the copy, in stream order: the copy is complete
            // (its data in the peer's memory) before the kernel posts it.
            return self.signal_raw(peer, gin_signal, context, stream);
        }
        match src.window {
            Some((win, src_offset, key)) => {
                if key != crate::window::comm_key(self.comm) {
                    return Err(Error::invalid_argument(format!(
                        "{what}: the source window belongs to another communicator"
                    )));
                }
                // SAFETY: windows of this communicator (`dst` declared with
                // use_window: `handle.window` checked it), ranges checked
                // above against both windows' sizes; the error word is ours.
                unsafe { self.launch_put(dst, dst_offset, win, src_offset, bytes, peer, gin_signal, context, stream) }
            }
            None => {
                // Staged through the resource window in chunks; only the
                // last chunk signals. Each chunk's kernel flushes, so the
                // next chunk's copy into the staging area is stream-ordered
                // after the proxy has read the previous one.
                let stage = self.handle().resource_window();
                let chunk = self.config.stage_bytes as u64;
                let stage_ptr = stage.local_ptr::<u8>(self.stage_offset) as u64;
                let mut done = 0u64;
                loop {
                    let n = (bytes - done).min(chunk);
                    let last = done + n == bytes;
                    if n > 0 {
                        // SAFETY: `src.ptr + done .. + n` lies inside the
                        // caller's buffer (its length gave `bytes`), alive for
                        // the call's borrow (freeing device memory waits for
                        // the device); the staging area holds `stage_bytes >= n`
                        // bytes of this rank's resource window; they do not overlap.
                        unsafe { stream.memcpy_raw(stage_ptr, src.ptr + done, n as usize) }?;
                    }
                    let sig = if last { gin_signal } else { u32::MAX };
                    // SAFETY: as for window sources: the resource window is
                    // this communicator's, `stage_offset + n` inside it.
                    unsafe {
                        self.launch_put(dst, dst_offset + done, stage, self.stage_offset, n, peer, sig, context, stream)
                    }?;
                    done += n;
                    if last {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Queues one `rma_put_signal` kernel.
    ///
    /// # Safety
    /// `dst` (declared for the device communicator) and `src` are windows of
    /// this communicator with the byte ranges inside them.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_put(
        &self,
        dst: WindowDesc,
        dst_offset: u64,
        src: WindowDesc,
        src_offset: u64,
        bytes: u64,
        peer: usize,
        signal: u32,
        context: u32,
        stream: &Stream,
    ) -> Result<()> {
        let args = (
            self.dc(),
            dst,
            dst_offset,
            src,
            src_offset,
            bytes,
            peer as u32,
            signal,
            context,
            self.error.device_addr() as *mut u32,
        );
        // SAFETY: the caller's contract for the windows and ranges; the
        // device communicator is this object's (GIN, `contexts` contexts,
        // the signal id below signals × ranks); the error word is host-mapped
        // and lives as long as `self`, which outlives queued work only if the
        // caller synchronises (dropping the device communicator stops its proxy
        // after the device is idle).
        unsafe { stream.launch::<devcomm_kernels::rma::rma_put_signal>(LaunchConfig::new(1, 1), args) }
    }

    fn dc(&self) -> DevComm {
        self.handle().dev_comm()
    }

    /// `peer`'s signal `signal` (from this rank) + 1, after every earlier
    /// operation of context 0 to `peer` (`ncclSignal`). Stream-ordered.
    ///
    /// Errors: [`Error::InvalidArgument`] for a peer or signal out of range;
    /// the kept failure of an earlier operation.
    #[doc(alias = "ncclSignal")]
    pub fn signal(&self, peer: usize, signal: u32, stream: &Stream) -> Result<()> {
        self.signal_on(peer, signal, 0, stream)
    }

    /// [`HostRma::signal`] on GIN context `context`.
    ///
    /// Errors: as [`HostRma::signal`], and for a context out of range.
    pub fn signal_on(&self, peer: usize, signal: u32, context: u32, stream: &Stream) -> Result<()> {
        let what = "signal";
        self.check_peer(peer, what)?;
        self.check_signal(signal, what)?;
        self.check_context(context, what)?;
        self.sticky()?;
        let gin_signal = signal * self.comm.count() as u32 + self.comm.rank() as u32;
        self.signal_raw(peer, gin_signal, context, stream)
    }

    /// Queues the `rma_signal` kernel: GIN signal `gin_signal` of `peer` + 1.
    /// The caller checked `peer`, the signal id (below signals × ranks) and
    /// `context`.
    fn signal_raw(&self, peer: usize, gin_signal: u32, context: u32, stream: &Stream) -> Result<()> {
        let args = (self.dc(), peer as u32, gin_signal, context, self.error.device_addr() as *mut u32);
        // SAFETY: this object's device communicator with GIN, peer, signal id
        // and context checked by the caller; the error word is host-mapped and ours.
        unsafe { stream.launch::<devcomm_kernels::rma::rma_signal>(LaunchConfig::new(1, 1), args) }
    }

    /// The stream waits until, for every entry, `op_count` more signal
    /// operations on `signal` from `peer` have arrived, and consumes them
    /// (`ncclWaitSignal`). Entries are waited for in order (all must arrive;
    /// the order only changes which wait reports a timeout). A wait that
    /// does not end within the op timeout (`DEVCOMM_OP_TIMEOUT_MS`) becomes
    /// [`Error::Timeout`], kept and returned by the next call and by
    /// [`HostRma::synchronize`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a peer, signal or context out
    /// of range; the kept failure of an earlier operation.
    #[doc(alias = "ncclWaitSignal")]
    pub fn wait_signal(&self, waits: &[WaitSignal], stream: &Stream) -> Result<()> {
        let what = "wait_signal";
        for w in waits {
            self.check_peer(w.peer, what)?;
            self.check_signal(w.signal, what)?;
            self.check_context(w.context, what)?;
        }
        self.sticky()?;
        let n = self.comm.count() as u32;
        for chunk in waits.chunks(RMA_WAIT_MAX) {
            let mut list = RmaWaitList::default();
            for (e, w) in list.entries.iter_mut().zip(chunk) {
                *e = RmaWaitEntry { signal: w.signal * n + w.peer as u32, context: w.context, count: w.op_count };
            }
            list.len = chunk.len() as u32;
            let args = (self.dc(), list, self.error.device_addr() as *mut u32);
            // SAFETY: this object's device communicator; every entry's signal
            // id is below signals × ranks and its context below contexts
            // (checked above); the error word is host-mapped and ours.
            unsafe { stream.launch::<devcomm_kernels::rma::rma_wait_signal>(LaunchConfig::new(1, 1), args) }?;
        }
        Ok(())
    }
}

/// `Err(InvalidArgument)` "`what`: `name` `value` is not below `limit_name` (`limit`)" unless `value < limit`.
fn below(value: usize, limit: usize, what: &str, name: &str, limit_name: &str) -> Result<()> {
    if value >= limit {
        return Err(Error::invalid_argument(format!("{what}: {name} {value} is not below {limit_name} ({limit})")));
    }
    Ok(())
}
