//! The CopyEngine transport: peers on the same host, reached without a
//! network.
//!
//! For each same-host peer, `devcomm` maps into this process the peer's
//! windows (the device memory behind them, imported from file descriptors)
//! and the peer's signal array (host shared memory). A put is queued on a
//! [`CopyQueue`] (a copy-engine copy into the peer's mapped window; inline
//! values as 8-byte stream writes) and the call returns at once. After each
//! sweep the proxy calls [`Transport::flush`], which queues a fence; once the
//! fence has passed (the data is complete and visible), [`Transport::retired`]
//! applies the signals that followed that data — an atomic add on the
//! peer's signal word — in the order they were issued, and the proxy
//! completes the tickets. So a signal is never visible before its data,
//! puts and signals to a peer stay in order, and nothing waits per
//! operation: a proxy keeps the copy engine busy with many puts in flight.
//!
//! Peers on other hosts go to the `fallback` transport (TCP), which also
//! keeps receiving for this rank.

use super::{GetSource, PeerFailure, PutTarget, Transport};
use crate::descriptor::RemoteSignal;
use crate::{CopyQueue, GinHostError, GinResult, LocalMemory};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Longest wait for device work in flight (the transport draining when it
/// closes, a TCP receiver waiting for its fence, a copy queue waiting for
/// staging); copies of a healthy device end far sooner.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A same-host peer as this process sees it.
pub struct SameHostPeer {
    /// The peer's windows mapped here: window id → (device address, usable size).
    pub windows: HashMap<u32, (u64, u64)>,
    /// The peer's signal array mapped here (host address of `total_signals` u64s).
    pub signals: *mut u64,
    /// Length of the signal array.
    pub total_signals: u32,
}

// SAFETY: `signals` is only accessed atomically, and `devcomm` keeps the
// mapping alive while the transport exists (see `CopyEngineTransport::new`).
unsafe impl Send for SameHostPeer {}

/// Same-host peers through the copy engine, the others through `fallback`.
pub struct CopyEngineTransport {
    queue: Box<dyn CopyQueue>,
    peers: Vec<Option<SameHostPeer>>,
    fallback: Box<dyn Transport>,
    /// Number of the last fence queued.
    fenced: u64,
    /// Operations queued since that fence (0: none, all work is fenced).
    unfenced_ops: u32,
    /// Number of the last fence seen passed.
    passed: u64,
    /// Signals waiting for the fence behind their data: (fence, peer, signal).
    waiting: VecDeque<(u64, usize, RemoteSignal)>,
    /// Peers served by the fallback.
    fallback_peers: usize,
    /// When the fallback's `progress` last ran.
    fallback_polled: std::time::Instant,
    /// Gets handed to the fallback, not yet retired there: (this
    /// transport's mark for them, the fallback's mark). [`Transport::retired`]
    /// stays below the first one's mark until the fallback retires it.
    holds: VecDeque<(u64, u64)>,
    /// Longest time fences may stay in flight without one passing before
    /// the transport fails ([`CopyEngineTransport::set_fence_timeout`]).
    fence_timeout: std::time::Duration,
    /// Since when fences have been in flight without one passing.
    stalled_since: Option<std::time::Instant>,
    /// Polls without progress since the clock was last read.
    stalled_polls: u32,
    /// `close` ran.
    closed: bool,
}

/// Polls of a fence in flight without progress between two looks at the clock.
const STALL_CHECK_EVERY: u32 = 256;

/// Operations queued behind a fence in flight before another fence is
/// queued anyway (see [`Transport::flush`] of this transport).
pub const FENCE_EVERY: u32 = 64;

/// How often the fallback is polled when it serves no peer (failure detection only).
const FALLBACK_POLL: std::time::Duration = std::time::Duration::from_micros(200);

impl CopyEngineTransport {
    /// A transport over `peers` (indexed by world rank; `None`: not on this
    /// host, served by `fallback`), queueing device work on a new
    /// [`CopyQueue`] of `local`.
    ///
    /// # Safety
    /// Every mapping named in `peers` (windows and signal arrays) stays
    /// mapped until the transport is dropped, and every access to the
    /// signal words is atomic.
    pub unsafe fn new(
        local: Arc<dyn LocalMemory>,
        peers: Vec<Option<SameHostPeer>>,
        fallback: Box<dyn Transport>,
    ) -> GinResult<CopyEngineTransport> {
        let queue = local.copy_queue()?;
        let fallback_peers = peers.iter().filter(|p| p.is_none()).count();
        Ok(CopyEngineTransport {
            queue,
            peers,
            fallback,
            fenced: 0,
            unfenced_ops: 0,
            passed: 0,
            waiting: VecDeque::new(),
            fallback_peers,
            fallback_polled: std::time::Instant::now(),
            holds: VecDeque::new(),
            fence_timeout: DRAIN_TIMEOUT,
            stalled_since: None,
            stalled_polls: 0,
            closed: false,
        })
    }

    /// Fails the transport ([`Transport::retired`] returns `Timeout`) once
    /// fences have been in flight for `t` without one passing — copies that
    /// never complete (a wedged copy engine, a peer mapping that stopped
    /// answering) then surface as an error (every ring fails, peers are
    /// told) instead of tickets that never complete. Default
    /// [`DRAIN_TIMEOUT`]; a healthy device passes a fence within
    /// milliseconds of its copies.
    pub fn set_fence_timeout(&mut self, t: std::time::Duration) {
        self.fence_timeout = t;
    }

    /// Reads how far the queue's fences have passed; `Timeout` once they
    /// have been stuck for longer than the fence timeout.
    fn poll_fences(&mut self) -> GinResult<()> {
        let passed = self.queue.passed()?;
        if passed > self.passed {
            self.passed = passed;
            self.stalled_since = None;
            self.stalled_polls = 0;
        }
        if self.passed >= self.fenced {
            return Ok(());
        }
        self.stalled_polls += 1;
        if self.stalled_since.is_none() || self.stalled_polls >= STALL_CHECK_EVERY {
            self.stalled_polls = 0;
            let since = *self.stalled_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > self.fence_timeout {
                return Err(GinHostError::Timeout(format!(
                    "copy-engine fence {} has not passed within {:?} (fences passed up to {}): the device copies \
                     do not complete",
                    self.passed + 1,
                    self.fence_timeout,
                    self.passed
                )));
            }
        }
        Ok(())
    }

    /// Number of peers reached through the copy engine.
    pub fn same_host_peers(&self) -> usize {
        self.peers.iter().filter(|p| p.is_some()).count()
    }

    fn peer(&self, peer: usize) -> Option<&SameHostPeer> {
        self.peers.get(peer).and_then(|p| p.as_ref())
    }

    fn dst(&self, peer: usize, window: u32, offset: u64, bytes: u64) -> GinResult<u64> {
        let p = self.peer(peer).ok_or_else(|| GinHostError::Invalid(format!("rank {peer} is not on this host")))?;
        let &(base, size) = p.windows.get(&window).ok_or_else(|| {
            GinHostError::Invalid(format!(
                "window {window} of rank {peer} is not mapped here (declare it with use_window)"
            ))
        })?;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(GinHostError::Invalid(format!(
                "{bytes} bytes at offset {offset} exceed window {window} of rank {peer} ({size} bytes)"
            )));
        }
        Ok(base + offset)
    }

    fn check_signal(&self, peer: usize, signal: Option<RemoteSignal>) -> GinResult<()> {
        match (signal, self.peer(peer)) {
            (Some((id, _)), Some(p)) if id >= p.total_signals => {
                Err(GinHostError::Invalid(format!("signal {id} of rank {peer} does not exist")))
            }
            _ => Ok(()),
        }
    }

    fn add_signal(&self, peer: usize, (id, value): RemoteSignal) {
        let Some(p) = self.peer(peer) else { return };
        debug_assert!(id < p.total_signals, "checked when issued");
        // SAFETY: id < total_signals (checked when the signal was issued);
        // the mapping is alive and only accessed atomically (the contract of `new`).
        unsafe { AtomicU64::from_ptr(p.signals.add(id as usize)) }.fetch_add(value, Ordering::SeqCst);
    }

    /// Applies `signal` to `peer` once everything queued so far has landed:
    /// at once if nothing is in flight, else after the covering fence.
    fn signal_after_queued(&mut self, peer: usize, signal: RemoteSignal) {
        if self.waiting.is_empty() && self.unfenced_ops == 0 && self.passed >= self.fenced {
            self.add_signal(peer, signal);
        } else {
            let mark = self.issued();
            self.waiting.push_back((mark, peer, signal));
        }
    }

    /// Queues a fence behind the work queued since the last one, if any.
    fn fence_now(&mut self) -> GinResult<()> {
        if self.unfenced_ops > 0 {
            self.fenced = self.queue.fence()?;
            self.unfenced_ops = 0;
        }
        Ok(())
    }

    fn mark_queued(&mut self) {
        self.unfenced_ops += 1;
    }

    /// Queues a fence and waits until it (and every signal before it) has
    /// retired: nothing of this transport is in flight afterwards.
    fn drain(&mut self) -> GinResult<()> {
        self.fence_now()?;
        self.fallback.flush()?;
        let start = std::time::Instant::now();
        while self.retired()? < self.fenced {
            if start.elapsed() > DRAIN_TIMEOUT {
                return Err(GinHostError::Timeout(format!(
                    "copy-engine work did not complete within {DRAIN_TIMEOUT:?} (fence {} of {} passed)",
                    self.passed, self.fenced
                )));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

impl Transport for CopyEngineTransport {
    fn put(&mut self, to: PutTarget, data: &[u8]) -> GinResult<()> {
        let PutTarget { peer, dst_window, dst_offset, signal } = to;
        if self.peer(peer).is_none() {
            return self.fallback.put(PutTarget::new(peer, dst_window, dst_offset, signal), data);
        }
        let dst = self.dst(peer, dst_window, dst_offset, data.len() as u64)?;
        self.check_signal(peer, signal)?;
        if !data.is_empty() {
            // SAFETY: `dst` lies in a window mapped here (checked above),
            // kept mapped while the transport exists (the contract of `new`).
            // The queue stages `data` before returning.
            unsafe { self.queue.write(dst, data) }?;
            self.mark_queued();
        }
        if let Some(s) = signal {
            self.signal_after_queued(peer, s);
        }
        Ok(())
    }

    fn signal(&mut self, peer: usize, signal: u32, value: u64) -> GinResult<()> {
        if self.peer(peer).is_none() {
            return self.fallback.signal(peer, signal, value);
        }
        self.check_signal(peer, Some((signal, value)))?;
        self.signal_after_queued(peer, (signal, value));
        Ok(())
    }

    fn put_from_device(
        &mut self,
        local: &dyn LocalMemory,
        to: PutTarget,
        src: u64,
        bytes: u64,
        buf: &mut Vec<u8>,
    ) -> GinResult<()> {
        let PutTarget { peer, dst_window, dst_offset, signal } = to;
        if self.peer(peer).is_none() {
            return self.fallback.put_from_device(
                local,
                PutTarget::new(peer, dst_window, dst_offset, signal),
                src,
                bytes,
                buf,
            );
        }
        let dst = self.dst(peer, dst_window, dst_offset, bytes)?;
        self.check_signal(peer, signal)?;
        if bytes > 0 {
            // SAFETY: `dst` lies in a mapped window of the peer (checked
            // above); `src` in this rank's window (resolved by the proxy),
            // which the proxy does not release before the ticket completes,
            // i.e. after the covering fence has passed.
            unsafe { self.queue.copy(dst, src, bytes) }?;
            self.mark_queued();
        }
        if let Some(s) = signal {
            self.signal_after_queued(peer, s);
        }
        Ok(())
    }

    /// A same-host peer's window (mapped here) copied into `dst` by the copy
    /// engine; other peers' through the fallback, this transport's mark
    /// held back until the fallback has retired the get.
    fn get(&mut self, from: GetSource, dst: u64, bytes: u64) -> GinResult<()> {
        if self.peer(from.peer).is_none() {
            self.fallback.get(from, dst, bytes)?;
            // A mark of our own for it (a fence, empty if nothing else is
            // queued), which `retired` does not reach before the fallback's.
            self.mark_queued();
            self.holds.push_back((self.issued(), self.fallback.issued()));
            return Ok(());
        }
        let src = self.dst(from.peer, from.src_window, from.src_offset, bytes)?;
        if src < dst + bytes && dst < src + bytes {
            return Err(GinHostError::Invalid(format!(
                "a get of {bytes} bytes from rank {} overlaps its own destination",
                from.peer
            )));
        }
        // SAFETY: `src` lies in a window of the peer mapped here, `dst` in
        // this rank's window (resolved by the proxy), not overlapping
        // (checked above); both stay mapped while the transport exists, and
        // the ticket completes only after the covering fence has passed.
        unsafe { self.queue.copy(dst, src, bytes) }?;
        self.mark_queued();
        Ok(())
    }

    fn progress(&mut self, failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        self.retired()?;
        if self.unfenced_ops > 0 && self.passed >= self.fenced {
            // The work held back by `flush` while a fence was in flight.
            self.fence_now()?;
        }
        // With every peer on this host the fallback carries no data, only
        // failure detection (broken connections): poll it now and then, not
        // on every turn of the proxy's loop.
        if self.fallback_peers > 0 || self.fallback_polled.elapsed() >= FALLBACK_POLL {
            self.fallback_polled = std::time::Instant::now();
            return self.fallback.progress(failed);
        }
        Ok(())
    }

    /// Queues a fence behind the work queued since the last one — at once
    /// when no fence is in flight (the latency case), else only once
    /// [`FENCE_EVERY`] operations wait behind it; `progress` fences the rest
    /// when the fence in flight has passed. So a busy proxy pays one fence
    /// (a driver call) per many operations, not one per sweep.
    fn flush(&mut self) -> GinResult<()> {
        if self.unfenced_ops > 0 && (self.passed >= self.fenced || self.unfenced_ops >= FENCE_EVERY) {
            self.fence_now()?;
        } else {
            // Keep the copy engine busy with what this sweep queued.
            self.queue.submit()?;
        }
        self.fallback.flush()
    }

    fn issued(&self) -> u64 {
        self.fenced + (self.unfenced_ops > 0) as u64
    }

    fn retired(&mut self) -> GinResult<u64> {
        if self.passed < self.fenced {
            self.poll_fences()?;
        }
        while let Some(&(mark, peer, signal)) = self.waiting.front() {
            if mark > self.passed {
                break;
            }
            self.waiting.pop_front();
            self.add_signal(peer, signal);
        }
        if !self.holds.is_empty() {
            let done = self.fallback.retired()?;
            while self.holds.front().is_some_and(|&(_, theirs)| theirs <= done) {
                self.holds.pop_front();
            }
        }
        Ok(match self.holds.front() {
            Some(&(mine, _)) => self.passed.min(mine - 1),
            None => self.passed,
        })
    }

    fn close(&mut self, graceful: bool) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        if graceful {
            if let Err(e) = self.drain() {
                tracing::error!(error = %e, "GIN copy-engine transport: work in flight failed while closing");
            }
        }
        self.fallback.close(graceful)
    }
}

#[cfg(test)]
mod tests {
    //! The transport's ordering and fence policy against a model queue whose
    //! fences pass only when the test says so.
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct QueueLog {
        ops: Vec<String>,
        fences: u64,
        passed: u64,
    }

    struct ModelQueue(Arc<Mutex<QueueLog>>);

    impl CopyQueue for ModelQueue {
        unsafe fn copy(&mut self, dst: u64, src: u64, bytes: u64) -> GinResult<()> {
            self.0.lock().unwrap().ops.push(format!("copy {dst:#x} {src:#x} {bytes}"));
            Ok(())
        }
        unsafe fn write(&mut self, dst: u64, data: &[u8]) -> GinResult<()> {
            self.0.lock().unwrap().ops.push(format!("write {dst:#x} {}", data.len()));
            Ok(())
        }
        fn fence(&mut self) -> GinResult<u64> {
            let mut l = self.0.lock().unwrap();
            l.fences += 1;
            let n = l.fences;
            l.ops.push(format!("fence {n}"));
            Ok(n)
        }
        fn passed(&mut self) -> GinResult<u64> {
            Ok(self.0.lock().unwrap().passed)
        }
    }

    struct ModelMemory(Arc<Mutex<QueueLog>>);

    impl LocalMemory for ModelMemory {
        fn window_addr(&self, _: u32, offset: u64, _: u64) -> GinResult<u64> {
            Ok(0x1000 + offset)
        }
        fn write_device(&self, _: u64, _: &[u8]) -> GinResult<()> {
            Ok(())
        }
        fn read_device(&self, _: u64, _: &mut [u8]) -> GinResult<()> {
            Ok(())
        }
        fn copy_queue(&self) -> GinResult<Box<dyn CopyQueue>> {
            Ok(Box::new(ModelQueue(self.0.clone())))
        }
    }

    /// The fallback of a host whose peers are all local: never given work.
    struct NoFallback;

    impl Transport for NoFallback {
        fn put(&mut self, to: PutTarget, _: &[u8]) -> GinResult<()> {
            let peer = to.peer;
            Err(GinHostError::Invalid(format!("rank {peer} reached the fallback")))
        }
        fn signal(&mut self, peer: usize, _: u32, _: u64) -> GinResult<()> {
            Err(GinHostError::Invalid(format!("rank {peer} reached the fallback")))
        }
        fn progress(&mut self, _: &mut Vec<PeerFailure>) -> GinResult<()> {
            Ok(())
        }
        fn flush(&mut self) -> GinResult<()> {
            Ok(())
        }
        fn close(&mut self, _: bool) {}
    }

    fn transport(signals: &mut [u64]) -> (CopyEngineTransport, Arc<Mutex<QueueLog>>) {
        let log = Arc::new(Mutex::new(QueueLog::default()));
        let peer = SameHostPeer {
            windows: HashMap::from([(0, (0x9000_0000, 1 << 20))]),
            signals: signals.as_mut_ptr(),
            total_signals: signals.len() as u32,
        };
        let local: Arc<dyn LocalMemory> = Arc::new(ModelMemory(log.clone()));
        // SAFETY: the model queue touches no memory; `signals` outlives the
        // transport in every test and is only accessed through it meanwhile.
        let t = unsafe { CopyEngineTransport::new(local, vec![None, Some(peer)], Box::new(NoFallback)) }.unwrap();
        (t, log)
    }

    fn pass(log: &Mutex<QueueLog>, n: u64) {
        log.lock().unwrap().passed = n;
    }

    #[test]
    fn signals_wait_for_their_fence_and_busy_proxies_fence_less() {
        let mut signals = vec![0u64; 4];
        let sig = signals.as_ptr();
        // SAFETY: called with `i < 4` only: an aligned `u64` of `signals`,
        // which outlives the closure's uses; the transport writes it only
        // atomically.
        let read = |i: usize| unsafe { AtomicU64::from_ptr(sig.add(i) as *mut u64) }.load(Ordering::SeqCst);
        let (mut t, log) = transport(&mut signals);
        let mut failed = Vec::new();

        // Idle: the first put is fenced at once; its signal waits for that fence.
        t.put(PutTarget::new(1, 0, 8, Some((2, 1))), &7u64.to_le_bytes()).unwrap();
        t.flush().unwrap();
        assert_eq!(log.lock().unwrap().fences, 1);
        assert_eq!(t.issued(), 1);
        assert_eq!(read(2), 0, "signal before its data's fence");

        // Busy: with fence 1 in flight, flushes hold the next puts back.
        let mut buf = Vec::new();
        let m = ModelMemory(log.clone());
        for i in 0..(FENCE_EVERY - 1) as u64 {
            t.put_from_device(&m, PutTarget::new(1, 0, 64 * i, Some((2, 1))), 0x1000, 64, &mut buf).unwrap();
            t.flush().unwrap();
        }
        assert_eq!(log.lock().unwrap().fences, 1, "a fence per sweep while one is in flight");
        assert_eq!(t.issued(), 2);

        // Fence 1 passes: its signal lands; progress fences the held-back work.
        pass(&log, 1);
        t.progress(&mut failed).unwrap();
        assert_eq!(t.retired().unwrap(), 1);
        assert_eq!(read(2), 1);
        assert_eq!(log.lock().unwrap().fences, 2);

        // FENCE_EVERY operations behind a fence in flight force another.
        for i in 0..FENCE_EVERY as u64 {
            t.put(PutTarget::new(1, 0, 8 * i, None), &i.to_le_bytes()).unwrap();
        }
        t.signal(1, 3, 5).unwrap();
        t.flush().unwrap();
        assert_eq!(log.lock().unwrap().fences, 3);
        pass(&log, 3);
        assert_eq!(t.retired().unwrap(), 3);
        assert_eq!(read(2), 1 + (FENCE_EVERY as u64 - 1));
        assert_eq!(read(3), 5);
        assert!(failed.is_empty());

        // Every data operation precedes the fence that covers its signal.
        let ops = log.lock().unwrap().ops.clone();
        let fence2 = ops.iter().position(|o| o == "fence 2").unwrap();
        assert_eq!(ops[..fence2].iter().filter(|o| o.starts_with("copy")).count(), FENCE_EVERY as usize - 1);
        assert_eq!(ops.last().map(String::as_str), Some("fence 3"));
    }

    #[test]
    fn fences_that_never_pass_fail_the_transport_with_a_timeout() {
        let mut signals = vec![0u64; 4];
        let (mut t, log) = transport(&mut signals);
        t.set_fence_timeout(std::time::Duration::from_millis(150));
        let mut failed = Vec::new();
        t.put(PutTarget::new(1, 0, 8, Some((1, 1))), &0x5eedu64.to_le_bytes()).unwrap();
        t.flush().unwrap();
        t.put(PutTarget::new(1, 0, 16, Some((1, 1))), &0x5eedu64.to_le_bytes()).unwrap();
        t.flush().unwrap();
        // Fence 1 passes, fence 2 never does (a copy that never completes).
        pass(&log, 1);
        let start = std::time::Instant::now();
        let e = loop {
            match t.progress(&mut failed).and_then(|()| t.retired()) {
                Ok(r) => assert!(r <= 1, "retired {r} with fence 2 stuck"),
                Err(e) => break e,
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "the stuck fence was never reported");
            std::thread::yield_now();
        };
        assert!(start.elapsed() >= std::time::Duration::from_millis(150));
        assert!(matches!(&e, GinHostError::Timeout(m) if m.contains("fence 2")), "{e:?}");
        assert_eq!(signals[1], 1, "the signal behind fence 1 landed, the one behind fence 2 did not");
        // Progress resets the clock: a fence that passes late but passes is no failure.
        let (mut t, log) = transport(&mut signals);
        t.set_fence_timeout(std::time::Duration::from_millis(150));
        for round in 1..=4u64 {
            t.put(PutTarget::new(1, 0, 8, None), &round.to_le_bytes()).unwrap();
            t.flush().unwrap();
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_millis(100) {
                assert_eq!(t.retired().unwrap(), round - 1);
                std::thread::yield_now();
            }
            pass(&log, round);
            assert_eq!(t.retired().unwrap(), round);
        }
    }

    #[test]
    fn a_graceful_close_fences_what_was_held_back() {
        let mut signals = vec![0u64; 1];
        let (mut t, log) = transport(&mut signals);
        t.put(PutTarget::new(1, 0, 0, None), &1u64.to_le_bytes()).unwrap();
        t.flush().unwrap();
        t.put(PutTarget::new(1, 0, 8, Some((0, 1))), &2u64.to_le_bytes()).unwrap();
        t.flush().unwrap();
        assert_eq!(log.lock().unwrap().fences, 1);
        pass(&log, 2); // the model passes fence 2 as soon as it is queued
        t.close(true);
        assert_eq!(log.lock().unwrap().fences, 2);
        assert_eq!(signals[0], 1);
    }

    /// A fallback that only takes gets, retiring them when the test says.
    struct GetFallback(Arc<Mutex<(u64, u64)>>);

    impl Transport for GetFallback {
        fn put(&mut self, _: PutTarget, _: &[u8]) -> GinResult<()> {
            Err(GinHostError::Invalid("no puts here".into()))
        }
        fn signal(&mut self, _: usize, _: u32, _: u64) -> GinResult<()> {
            Err(GinHostError::Invalid("no signals here".into()))
        }
        fn get(&mut self, _: GetSource, _: u64, _: u64) -> GinResult<()> {
            self.0.lock().unwrap().0 += 1;
            Ok(())
        }
        fn progress(&mut self, _: &mut Vec<PeerFailure>) -> GinResult<()> {
            Ok(())
        }
        fn flush(&mut self) -> GinResult<()> {
            Ok(())
        }
        fn issued(&self) -> u64 {
            self.0.lock().unwrap().0
        }
        fn retired(&mut self) -> GinResult<u64> {
            Ok(self.0.lock().unwrap().1)
        }
        fn close(&mut self, _: bool) {}
    }

    #[test]
    fn gets_retire_after_their_copy_and_fallback_gets_hold_later_work_back() {
        let mut signals = vec![0u64; 1];
        let log = Arc::new(Mutex::new(QueueLog::default()));
        let fb = Arc::new(Mutex::new((0u64, 0u64)));
        let peer = SameHostPeer {
            windows: HashMap::from([(0, (0x9000_0000, 1 << 20))]),
            signals: signals.as_mut_ptr(),
            total_signals: 1,
        };
        let local: Arc<dyn LocalMemory> = Arc::new(ModelMemory(log.clone()));
        // SAFETY: the model queue touches no memory; `signals` outlives the transport.
        let mut t =
            unsafe { CopyEngineTransport::new(local, vec![None, Some(peer)], Box::new(GetFallback(fb.clone()))) }
                .unwrap();
        let src = |peer| GetSource { peer, src_window: 0, src_offset: 64 };
        // A same-host get is a copy from the peer's mapped window, retired by its fence.
        t.get(src(1), 0x1000, 32).unwrap();
        t.flush().unwrap();
        assert_eq!(t.issued(), 1);
        assert!(log.lock().unwrap().ops.iter().any(|o| o == "copy 0x1000 0x90000040 32"));
        assert_eq!(t.retired().unwrap(), 0);
        pass(&log, 1);
        assert_eq!(t.retired().unwrap(), 1);
        // A get overlapping its own source is refused.
        assert!(matches!(t.get(src(1), 0x9000_0050, 32), Err(GinHostError::Invalid(_))));
        // A get through the fallback takes a mark of its own ...
        t.get(src(0), 0x2000, 16).unwrap();
        let held = t.issued();
        assert_eq!(held, 2);
        t.put(PutTarget::new(1, 0, 0, None), &[1, 2, 3]).unwrap();
        t.flush().unwrap();
        let mut failed = Vec::new();
        t.progress(&mut failed).unwrap();
        let later = t.issued();
        pass(&log, later);
        // ... which the copy engine's fences alone do not retire, nor what follows.
        assert_eq!(t.retired().unwrap(), held - 1);
        fb.lock().unwrap().1 = 1;
        assert_eq!(t.retired().unwrap(), later);
    }
}
