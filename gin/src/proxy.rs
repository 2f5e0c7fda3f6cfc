//! The proxy: one progress thread per device communicator serving the
//! descriptor rings.
//!
//! The thread sweeps every ring; for each ready descriptor, in ticket
//! order, it validates it ([`crate::descriptor::decode`]) and hands it to
//! the [`Transport`] (a put's source is read with
//! [`LocalMemory::read_device`] in pieces of at most [`PUT_CHUNK`] bytes,
//! or queued as a device copy by the copy-engine transport). Once the
//! transport has *retired* it ([`Transport::issued`] / [`Transport::retired`]:
//! at once for transports that finish each operation before returning,
//! after a fence behind the data for the copy engine) the proxy applies the
//! local action (counter + 1) and completes the ticket, which returns
//! credit to the producers and satisfies flushes. Completions are kept in
//! one FIFO, so every ring completes in ticket order. After each sweep that
//! did work it flushes the transport, and every sweep it asks the transport
//! for failed peers. An idle proxy backs off: it spins for
//! [`IDLE_SPIN`], yields until [`IDLE_YIELD`], then sleeps (up to
//! [`MAX_IDLE_SLEEP`]), so a busy proxy answers at once and an idle one
//! costs little CPU.
//!
//! Failures never hang producers: a malformed descriptor fails its ring; a
//! failed peer fails every ring toward it (all contexts); a ticket a
//! producer took and gave up without posting (its credit wait timed out
//! or was aborted: [`crate::QueueTail::abandoned`]) fails its ring when the
//! proxy reaches it. Failed rings have
//! `error = 1` in their tail and are no longer served; the first error is
//! kept for [`Proxy::error`].

use crate::descriptor::{decode, Limits, Request};
use crate::ring::Rings;
use crate::transport::{GetSource, PeerFailure, PutTarget, Transport};
use crate::{GinDescriptor, GinHostError, GinHostMemory, GinResult, LocalMemory};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest piece of a put read from the source and handed to the transport
/// at once.
pub const PUT_CHUNK: usize = 4 << 20;
/// How long an idle proxy spins before it starts yielding its CPU.
pub const IDLE_SPIN: Duration = Duration::from_micros(50);
/// How long an idle proxy yields before it starts sleeping.
pub const IDLE_YIELD: Duration = Duration::from_millis(5);
/// Longest sleep of an idle proxy (the worst added latency after idling).
pub const MAX_IDLE_SLEEP: Duration = Duration::from_micros(500);
/// Descriptors served from one ring before moving on to the next (fairness).
const BATCH: usize = 64;
/// Longest time `stop` waits for work in flight to retire.
const STOP_DRAIN: Duration = Duration::from_secs(60);
/// How often the watchdog looks at the proxy's loop.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// How long the loop may stay inside one call before the watchdog warns.
pub const STALL_WARN: Duration = Duration::from_secs(2);

const RUN: u8 = 0;
const STOP: u8 = 1;
const ABORT: u8 = 2;

struct Shared {
    command: AtomicU8,
    error: Mutex<Option<GinHostError>>,
    /// Turns of the proxy's loop so far: it stops moving only while the
    /// thread is inside one call (see [`ProxyMonitor::stalled`]).
    turns: AtomicU64,
    /// Milliseconds the loop has not turned for, as the watchdog last saw
    /// (0: it turns).
    stalled_ms: AtomicU64,
}

impl Shared {
    fn record(&self, e: GinHostError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
    }
}

/// A running proxy (see the module docs). Dropping it stops it as
/// [`Proxy::stop`] does.
pub struct Proxy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("running", &self.thread.is_some()).field("error", &self.error()).finish()
    }
}

impl Proxy {
    /// Starts the progress thread of rank `rank` serving the rings of `mem`,
    /// reading put sources from `local` and sending through `transport`.
    ///
    /// # Safety
    /// The pointers of `mem` name live memory of the sizes it states until
    /// the proxy has stopped ([`Proxy::stop`], [`Proxy::abort`] or drop
    /// returned), and producers access the shared words atomically (as
    /// `devcomm_device::gin::proxy::post` does).
    pub unsafe fn start(
        mem: GinHostMemory,
        local: Arc<dyn LocalMemory>,
        transport: Box<dyn Transport>,
        rank: usize,
    ) -> GinResult<Proxy> {
        // SAFETY: forwarded from our contract.
        let rings = unsafe { Rings::new(mem) }?;
        if rank >= mem.nranks as usize {
            return Err(GinHostError::Invalid(format!("rank {rank} of {} ranks", mem.nranks)));
        }
        let shared = Arc::new(Shared {
            command: AtomicU8::new(RUN),
            error: Mutex::new(None),
            turns: AtomicU64::new(0),
            stalled_ms: AtomicU64::new(0),
        });
        let limits = Limits { nranks: mem.nranks, total_signals: mem.total_signals, counters: mem.counters_len };
        let served = (0..rings.count()).map(|q| rings.completed(q)).collect();
        let unpublished = vec![0; rings.count()];
        let mut worker = Worker {
            rings,
            limits,
            local,
            transport,
            shared: shared.clone(),
            buf: Vec::new(),
            failed: Vec::new(),
            pending: VecDeque::new(),
            retired: 0,
            served,
            unpublished,
            stats: stats_enabled().then(TurnStats::default),
            dead: false,
        };
        let thread = std::thread::Builder::new()
            .name(format!("gin-proxy{rank}"))
            .spawn(move || worker.run())
            .map_err(|e| GinHostError::System(format!("spawning the GIN proxy thread: {e}")))?;
        let watched = Arc::downgrade(&shared);
        if let Err(e) = std::thread::Builder::new().name(format!("gin-watch{rank}")).spawn(move || watch(watched, rank))
        {
            tracing::warn!("GIN proxy of rank {rank}: no watchdog ({e}); a stalled proxy is not reported");
        }
        Ok(Proxy { shared, thread: Some(thread) })
    }

    /// The first error the proxy met (malformed descriptor, failed peer,
    /// memory access error), if any. Rings it concerned are failed; the
    /// proxy goes on serving the others.
    pub fn error(&self) -> Option<GinHostError> {
        self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A handle that reports this proxy's [`Proxy::error`] from elsewhere
    /// (a communicator's asynchronous error), also after the proxy has
    /// stopped.
    pub fn monitor(&self) -> ProxyMonitor {
        ProxyMonitor(self.shared.clone())
    }

    /// Whether the progress thread still runs.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    fn finish(&mut self, command: u8) -> GinResult<()> {
        let Some(t) = self.thread.take() else { return Ok(()) };
        self.shared.command.store(command, Ordering::SeqCst);
        if t.join().is_err() {
            self.shared.record(GinHostError::System("the GIN proxy thread panicked".into()));
        }
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Serves what is already posted (until every ring is empty or failed),
    /// flushes and closes the transport gracefully (peers do not take it as
    /// a failure), and joins the thread. Returns the first error the proxy
    /// met, if any.
    pub fn stop(mut self) -> GinResult<()> {
        self.finish(STOP)
    }

    /// Stops at once without serving what is queued: every ring is failed
    /// (producers and flushes give up) and connections are cut, as if this
    /// rank had died. Returns the first error the proxy met before, if any.
    pub fn abort(mut self) -> GinResult<()> {
        self.finish(ABORT)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.finish(STOP);
    }
}

/// Reports a [`Proxy`]'s first error ([`Proxy::monitor`]).
#[derive(Clone)]
pub struct ProxyMonitor(Arc<Shared>);

impl ProxyMonitor {
    /// The first error the proxy met, as [`Proxy::error`] (also after it stopped).
    pub fn error(&self) -> Option<GinHostError> {
        self.0.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How long the proxy's thread has been inside one call, if longer
    /// than the watchdog's period (about 100 ms): kernels waiting on the
    /// proxy wait as long. The usual cause is a CUDA driver call of the
    /// proxy (a copy, a read of a put's source) held up by another thread
    /// of the process inside a driver call that waits for the device
    /// while holding the driver's lock — `cudaFree`/`cuMemFree`,
    /// `cudaFreeHost`, module loading — which in turn waits for the kernel
    /// that waits for the proxy: a deadlock until the kernel's timeout.
    pub fn stalled(&self) -> Option<Duration> {
        match self.0.stalled_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// The watchdog of a proxy: while it runs, notes how long its loop has
/// not turned ([`ProxyMonitor::stalled`]) and warns once per stall that
/// lasts [`STALL_WARN`].
fn watch(shared: std::sync::Weak<Shared>, rank: usize) {
    let (mut last, mut since, mut warned) = (u64::MAX, Instant::now(), false);
    loop {
        std::thread::sleep(WATCH_EVERY);
        let Some(sh) = shared.upgrade() else { return };
        if sh.command.load(Ordering::Relaxed) != RUN {
            return;
        }
        let turns = sh.turns.load(Ordering::Relaxed);
        if turns != last {
            (last, since, warned) = (turns, Instant::now(), false);
            sh.stalled_ms.store(0, Ordering::Relaxed);
            continue;
        }
        let t = since.elapsed();
        sh.stalled_ms.store(t.as_millis().max(1) as u64, Ordering::Relaxed);
        if t >= STALL_WARN && !warned {
            warned = true;
            tracing::warn!(
                "GIN proxy of rank {rank} has been inside one call for {:.1} s: kernels waiting on it stall. \
                 Usual cause: another thread of this process is in a CUDA call that waits for the device while \
                 holding the driver's lock (cudaFree/cuMemFree, cudaFreeHost, loading a module) — it waits for the \
                 kernel that waits for this proxy. Free device memory only when no kernel that uses GIN is in flight",
                t.as_secs_f64()
            );
        }
    }
}

impl std::fmt::Debug for ProxyMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyMonitor").field("error", &self.error()).finish()
    }
}

struct Worker {
    rings: Rings,
    limits: Limits,
    local: Arc<dyn LocalMemory>,
    transport: Box<dyn Transport>,
    shared: Arc<Shared>,
    buf: Vec<u8>,
    failed: Vec<PeerFailure>,
    /// Tickets handed to the transport, not yet retired: (mark, ring, local counter).
    pending: VecDeque<(u64, usize, Option<u32>)>,
    /// The transport's last [`Transport::retired`].
    retired: u64,
    /// Per ring: the next ticket to serve (ahead of `completed` while work is in flight).
    served: Vec<u64>,
    /// Per ring: tickets completed this turn, not yet stored in its tail.
    unpublished: Vec<u64>,
    /// Counts for `DEVCOMM_GIN_STATS=1` (logged when the thread ends).
    stats: Option<TurnStats>,
    /// The transport failed as a whole and was closed: nothing is asked of it any more.
    dead: bool,
}

/// What the proxy thread did, logged at `info` when it ends if
/// `DEVCOMM_GIN_STATS=1` (see [`STATS_ENV`]).
#[derive(Default, Debug)]
struct TurnStats {
    /// Turns of the loop, and those that served at least one descriptor.
    turns: u64,
    busy_turns: u64,
    /// Descriptors served, and the most in one turn.
    served: u64,
    most_in_turn: usize,
    /// Turns that served nothing while work was in flight (waiting on the transport).
    waiting_turns: u64,
}

/// Set to `1` to log what the proxy thread and its copy queue did (turns,
/// descriptors per turn, driver calls, fence latencies) when they end.
pub const STATS_ENV: &str = "DEVCOMM_GIN_STATS";

/// Whether [`STATS_ENV`] asks for statistics.
pub fn stats_enabled() -> bool {
    std::env::var(STATS_ENV).is_ok_and(|v| v.trim() == "1")
}

/// Fails every ring if the worker unwinds (a panic in a `LocalMemory` or
/// transport implementation), so producers do not wait forever.
struct PanicGuard(Rings);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for q in 0..self.0.count() {
                self.0.fail(q);
            }
        }
    }
}

impl Worker {
    fn run(&mut self) {
        self.serve_until_stopped();
        if std::env::var("DEVCOMM_GIN_DEBUG").is_ok() {
            let m = *self.rings.memory();
            for q in 0..self.rings.count() {
                let mut line = format!(
                    "GIN debug: ring {q} (peer {}): served {} completed {} failed {}",
                    self.rings.peer_of(q),
                    self.served[q],
                    self.rings.completed(q),
                    self.rings.is_failed(q)
                );
                for t in 0..4usize.min(m.depth as usize) {
                    // SAFETY: inside the ring array; a debugging read.
                    let w = unsafe { core::ptr::read_volatile(m.rings.add(q * m.depth as usize + t)) }.words;
                    line += &format!("\n   slot {t}: {:016x?}", w);
                }
                eprintln!("{line}");
            }
        }
        if let Some(st) = &self.stats {
            tracing::info!(
                "GIN proxy stats: {} turns, {} served descriptors ({} busy turns, {:.1} per busy turn, at most {}), \
                 {} turns waiting on work in flight",
                st.turns,
                st.served,
                st.busy_turns,
                st.served as f64 / st.busy_turns.max(1) as f64,
                st.most_in_turn,
                st.waiting_turns
            );
        }
    }

    fn serve_until_stopped(&mut self) {
        let _guard = PanicGuard(self.rings.clone());
        let (mut idle, mut idle_since) = (0u32, None);
        let mut turns = 0u64;
        loop {
            turns += 1;
            self.shared.turns.store(turns, Ordering::Relaxed);
            let command = self.shared.command.load(Ordering::SeqCst);
            if command == ABORT {
                for q in 0..self.rings.count() {
                    self.rings.fail(q);
                }
                self.transport.close(false);
                return;
            }
            let did = self.sweep();
            if let Some(st) = &mut self.stats {
                st.turns += 1;
                st.served += did as u64;
                st.busy_turns += (did > 0) as u64;
                st.most_in_turn = st.most_in_turn.max(did);
                st.waiting_turns += (did == 0 && !self.pending.is_empty()) as u64;
            }
            if did > 0 && !self.dead {
                if let Err(e) = self.transport.flush() {
                    self.transport_failed(e);
                }
            }
            self.progress();
            self.retire();
            if did > 0 {
                (idle, idle_since) = (0, None);
                continue;
            }
            if command == STOP {
                self.drain();
                self.transport.close(true);
                return;
            }
            if self.pending.is_empty() {
                backoff(&mut idle, &mut idle_since);
            } else {
                // Work in flight: keep watching it closely.
                (idle, idle_since) = (0, None);
                std::hint::spin_loop();
            }
        }
    }

    /// Completes the pending tickets the transport has retired, in order,
    /// then publishes every completion not yet published.
    fn retire(&mut self) {
        if !self.pending.is_empty() {
            match self.transport.retired() {
                Ok(r) => self.retired = r,
                Err(e) => return self.transport_failed(e),
            }
            while let Some(&(mark, q, counter)) = self.pending.front() {
                if mark > self.retired {
                    break;
                }
                self.pending.pop_front();
                self.finish(q, counter);
            }
        }
        self.publish();
    }

    /// Stores each ring's completions of this turn in one go: producers
    /// poll the tail word over PCIe, and every store to a line they read
    /// costs the CPU an ownership round trip.
    fn publish(&mut self) {
        for q in 0..self.unpublished.len() {
            let n = std::mem::take(&mut self.unpublished[q]);
            if n > 0 && !self.rings.is_failed(q) {
                self.rings.complete_n(q, n);
            }
        }
    }

    /// Local action, then completion of ring `q`'s oldest pending ticket (skipped
    /// for a failed ring: its producers have given up).
    fn finish(&mut self, q: usize, counter: Option<u32>) {
        if self.rings.is_failed(q) {
            return;
        }
        if let Some(c) = counter {
            if let Err(e) = self.rings.counter_inc(c) {
                return self.fail_ring(q, e);
            }
        }
        self.unpublished[q] += 1;
    }

    /// At `stop`: flushes the transport and waits (bounded) until every
    /// pending ticket has retired.
    fn drain(&mut self) {
        if self.dead {
            return;
        }
        if let Err(e) = self.transport.flush() {
            self.transport_failed(e);
        }
        let start = Instant::now();
        loop {
            self.progress();
            self.retire();
            if self.pending.is_empty() {
                return;
            }
            if start.elapsed() > STOP_DRAIN {
                let e = GinHostError::Timeout(format!(
                    "{} GIN operations still in flight after {STOP_DRAIN:?} at stop",
                    self.pending.len()
                ));
                return self.transport_failed(e);
            }
            std::thread::yield_now();
        }
    }

    /// Serves every ready descriptor (up to [`BATCH`] per ring); returns how many.
    fn sweep(&mut self) -> usize {
        let mut did = 0;
        for q in 0..self.rings.count() {
            for _ in 0..BATCH {
                let Some(d) = self.rings.poll_at(q, self.served[q]) else {
                    self.check_abandoned(q);
                    break;
                };
                self.served[q] += 1;
                self.serve(q, &d);
                did += 1;
            }
        }
        did
    }

    /// Ring `q`'s next slot is empty: if a producer gave up a ticket it
    /// took (see [`QueueTail::abandoned`](crate::QueueTail)), the proxy can
    /// never serve past that hole in ticket order, so the ring fails now —
    /// its waiters get an error instead of a timeout.
    fn check_abandoned(&mut self, q: usize) {
        let Some((ticket, cause)) = self.rings.abandoned(q) else { return };
        if self.rings.is_failed(q) {
            return;
        }
        use devcomm_device::abi::gin::{ABANDON_ABORTED, ABANDON_TIMEOUT};
        let why = match cause {
            ABANDON_TIMEOUT => "its wait for ring credit timed out",
            ABANDON_ABORTED => "its wait for ring credit was aborted",
            _ => "it found the ring failed while waiting for credit",
        };
        let msg = format!(
            "ring {q} (peer {}): a device producer gave up ticket {ticket} without posting it ({why}); the \
             ring's later operations cannot be served in ticket order",
            self.rings.peer_of(q)
        );
        let e = match cause {
            ABANDON_TIMEOUT => GinHostError::Timeout(msg),
            _ => GinHostError::Remote(msg),
        };
        self.fail_ring(q, e);
    }

    fn serve(&mut self, q: usize, d: &GinDescriptor) {
        let ring_peer = self.rings.peer_of(q);
        let req = match decode(d, &self.limits) {
            Ok(r) if r.peer() as usize == ring_peer => r,
            Ok(r) => {
                return self.fail_ring(
                    q,
                    GinHostError::Invalid(format!("descriptor for peer {} in the ring of peer {ring_peer}", r.peer())),
                )
            }
            Err(e) => return self.fail_ring(q, e),
        };
        match self.perform(&req) {
            Ok(()) => {}
            Err(e @ GinHostError::Remote(_)) => return self.fail_peer(ring_peer, e),
            Err(e) => return self.fail_ring(q, e),
        }
        let mark = self.transport.issued();
        if self.pending.is_empty() && mark <= self.retired {
            self.finish(q, req.local());
        } else {
            self.pending.push_back((mark, q, req.local()));
        }
    }

    fn perform(&mut self, req: &Request) -> GinResult<()> {
        match *req {
            Request::Put { peer, src_window, src_offset, dst_window, dst_offset, bytes, remote, .. } => {
                let src = if bytes == 0 { 0 } else { self.local.window_addr(src_window, src_offset, bytes)? };
                let local = &*self.local;
                self.transport.put_from_device(
                    local,
                    PutTarget::new(peer as usize, dst_window, dst_offset, remote),
                    src,
                    bytes,
                    &mut self.buf,
                )
            }
            Request::PutValue { peer, dst_window, dst_offset, payload, len, remote, .. } => self
                .transport
                .put(PutTarget::new(peer as usize, dst_window, dst_offset, remote), &payload[..len as usize]),
            Request::Get { peer, src_window, src_offset, dst_window, dst_offset, bytes, .. } => {
                if bytes == 0 {
                    return Ok(());
                }
                let dst = self.local.window_addr(dst_window, dst_offset, bytes)?;
                self.transport.get(GetSource { peer: peer as usize, src_window, src_offset }, dst, bytes)
            }
            Request::Signal { peer, remote, .. } => match remote {
                Some((signal, value)) => self.transport.signal(peer as usize, signal, value),
                None => Ok(()),
            },
        }
    }

    fn progress(&mut self) {
        if self.dead {
            return;
        }
        if let Err(e) = self.transport.progress(&mut self.failed) {
            self.transport_failed(e);
        }
        while let Some(PeerFailure { peer, error }) = self.failed.pop() {
            self.fail_peer(peer, error);
        }
    }

    /// The error is recorded before the ring is marked failed (a release
    /// store): whoever sees the ring failed (a flush, a producer) finds
    /// the proxy's error too. The other order let a test's flush end with
    /// the ring's failure while `Proxy::error` still said `None`.
    fn fail_ring(&mut self, q: usize, e: GinHostError) {
        tracing::error!(ring = q, error = %e, "GIN proxy: ring failed");
        self.shared.record(e);
        self.rings.fail(q);
    }

    /// As [`Self::fail_ring`], for every ring of `peer`.
    fn fail_peer(&mut self, peer: usize, e: GinHostError) {
        tracing::error!(peer, error = %e, "GIN proxy: peer failed");
        self.shared.record(e);
        for q in (0..self.rings.count()).filter(|&q| self.rings.peer_of(q) == peer) {
            self.rings.fail(q);
        }
    }

    /// The transport failed as a whole (a device fault, fences that never
    /// pass, work that did not retire at `stop`): every ring fails, and the
    /// transport is closed at once as if this rank had died, so that peers
    /// learn it too — their waits for this rank's signals (whose data may
    /// never have landed) end with their rings to this rank failed instead
    /// of a timeout.
    fn transport_failed(&mut self, e: GinHostError) {
        tracing::error!(error = %e, "GIN proxy: transport failed");
        // Recorded first, as in `fail_ring`.
        self.shared.record(e);
        for q in 0..self.rings.count() {
            self.rings.fail(q);
        }
        self.pending.clear();
        if !std::mem::replace(&mut self.dead, true) {
            self.transport.close(false);
        }
    }
}

/// Idle back-off: spin for [`IDLE_SPIN`], then yield until [`IDLE_YIELD`],
/// then sleep (growing to [`MAX_IDLE_SLEEP`]).
fn backoff(idle: &mut u32, since: &mut Option<Instant>) {
    let start = *since.get_or_insert_with(Instant::now);
    let t = start.elapsed();
    if t < IDLE_SPIN {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    } else if t < IDLE_YIELD {
        std::thread::yield_now();
    } else {
        *idle = idle.saturating_add(1);
        let us = (20u64 << (*idle / 8).min(5)).min(MAX_IDLE_SLEEP.as_micros() as u64);
        std::thread::sleep(Duration::from_micros(us));
    }
}
