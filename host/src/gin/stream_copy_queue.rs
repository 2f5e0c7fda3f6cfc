//! The GIN proxy's asynchronous device data path ([`devcomm_gin::CopyQueue`])
//! over a runtime stream of its own.
//!
//! * copies: gathered and handed to the copy engine together
//!   (`cuMemcpyBatchAsync`: one driver call for up to [`MAX_COPIES`]), a
//!   batch ending early where a copy would overlap one already in it (the
//!   copies of a batch may run in any order); a copy that continues the
//!   last one gathered (both ranges adjacent) extends it;
//! * writes of 8 aligned bytes, up to [`DIRECT_WRITES`] gathered at a time:
//!   64-bit stream writes (`cuStreamBatchMemOp`, one driver call for the
//!   batch) — the quickest way to land a lone value; writes of any other
//!   size, more 8-byte writes than that (stream writes cost the device a
//!   memory barrier each), 8-byte writes while copies are being gathered,
//!   or where the driver refuses stream writes to the destination: the
//!   bytes go to pinned staging memory, then a copy (gathered like the
//!   others; adjacent staged writes share one copy);
//! * fences: a 64-bit stream write *with* a memory barrier of the fence
//!   number into a host-mapped word, which the proxy reads with a plain
//!   load. The barrier makes everything queued before visible first.
//!
//! Staging is a ring of [`MAX_CHUNKS`] chunks of [`CHUNK_BYTES`] in one
//! pinned allocation made with the queue — never later: allocating pinned
//! memory while a kernel runs may wait for the kernel, and the kernels
//! wait for this queue. Writes fill the current chunk; a chunk is filled again
//! only after the fence behind its last copy has passed. Where every chunk
//! is still in use and that fence has not even been queued (more than
//! `MAX_CHUNKS * CHUNK_BYTES` staged since the last fence), the queue waits
//! for its stream to go idle instead (fence numbers stay the caller's). A
//! device fault stops the fences; [`devcomm_gin::CopyQueue::passed`] then
//! asks the stream (every [`QUERY_EVERY`] unchanged polls) and returns its
//! error.

use crate::runtime::{Device, HostMappedBuffer, Stream};
use devcomm_gin::transport::copy_engine::DRAIN_TIMEOUT;
use devcomm_gin::{CopyQueue, GinHostError, GinResult};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of one staging chunk.
const CHUNK_BYTES: usize = 128 << 10;
/// Staging chunks at most (4 MiB of pinned memory per queue).
const MAX_CHUNKS: usize = 32;
/// A write that does not fit in what is left of the current chunk starts a
/// new chunk, unless it is larger than this and this much is left (then it
/// is split).
const MIN_SPLIT: usize = 4 << 10;
/// Inline values gathered as stream writes (since the queue last handed
/// work to the driver) before the queue turns to staging them. A stream write is the quickest way to land one value
/// (about 4.6 µs to a peer GPU, against 7.1 µs for a copy), but the driver
/// takes stream writes to device memory only with a memory barrier each,
/// which costs the device about 0.8–0.9 µs per value, while one copy of 64
/// adjacent staged values costs 0.11–0.15 µs per value (2 × H200,
/// benches/gpu/proxy_floor.cu; benches/results/2026-11-23-h200x2-gin-landing.md).
const DIRECT_WRITES: usize = 4;
/// Copies gathered before they are handed to the driver in one call.
const MAX_COPIES: usize = 64;
/// Unchanged polls of the fence word between two checks of the stream for errors.
const QUERY_EVERY: u32 = 4096;

/// Forces inline values through staging copies instead of stream writes
/// (for comparison, or as a workaround): `DEVCOMM_GIN_CE_STAGE_INLINE=1`.
pub(crate) const STAGE_INLINE_ENV: &str = "DEVCOMM_GIN_CE_STAGE_INLINE";

/// What a queue did, for `DEVCOMM_GIN_STATS=1` (kept only then; logged
/// at `info` when the queue is dropped).
#[derive(Default)]
struct Stats {
    /// Driver calls made, and time spent in them.
    calls: u64,
    call_ns: u128,
    /// Stream writes and copies handed to the driver.
    writes: u64,
    copies: u64,
    /// Fences seen passed; sum and largest time from queued to seen passed.
    fences: u64,
    fence_ns: u128,
    fence_max_ns: u64,
    /// Fences in flight: (number, when queued).
    in_flight: std::collections::VecDeque<(u64, std::time::Instant)>,
}

impl Stats {
    fn call<T>(stats: &mut Option<Stats>, ops: (u64, u64), f: impl FnOnce() -> T) -> T {
        let Some(st) = stats else { return f() };
        let t = std::time::Instant::now();
        let r = f();
        st.calls += 1;
        st.call_ns += t.elapsed().as_nanos();
        st.writes += ops.0;
        st.copies += ops.1;
        r
    }

    fn passed(&mut self, upto: u64) {
        while let Some(&(n, at)) = self.in_flight.front() {
            if n > upto {
                break;
            }
            self.in_flight.pop_front();
            let ns = at.elapsed().as_nanos() as u64;
            self.fences += 1;
            self.fence_ns += ns as u128;
            self.fence_max_ns = self.fence_max_ns.max(ns);
        }
    }
}

fn sys_err(e: crate::Error) -> GinHostError {
    GinHostError::System(e.to_string())
}

pub(crate) struct StreamCopyQueue {
    /// Dropped only once the stream has run everything (see `Drop`).
    stream: ManuallyDrop<Stream>,
    /// The fence word (offset 0).
    host: ManuallyDrop<HostMappedBuffer>,
    /// Stream writes not yet handed to the driver: (address, value, with a
    /// memory barrier — always for fences).
    batch: Vec<(u64, u64, bool)>,
    /// Copies not yet handed to the driver: (dst, src, bytes), no
    /// destination overlapping another copy's source or destination. At
    /// most one of `batch` and `copies` is non-empty.
    copies: Vec<(u64, u64, usize)>,
    stage_inline: bool,
    /// Inline values are written with a memory barrier each (only where the
    /// driver refused them without).
    barrier_writes: bool,
    fenced: u64,
    passed: u64,
    /// Pinned staging, [`MAX_CHUNKS`] chunks of [`CHUNK_BYTES`].
    staging: ManuallyDrop<HostMappedBuffer>,
    /// Per chunk, the fence that must pass before it is filled again (0:
    /// free); used round-robin, `cur` being filled.
    chunks: Vec<u64>,
    cur: usize,
    /// Bytes of `chunks[cur]` taken.
    used: usize,
    unchanged_polls: u32,
    stats: Option<Stats>,
}

impl StreamCopyQueue {
    /// A queue on a new stream of `dev`, or `Unavailable` where the device
    /// cannot run stream writes (fences need them).
    pub(crate) fn new(dev: &Device) -> GinResult<StreamCopyQueue> {
        let stream = dev.new_stream().map_err(sys_err)?;
        if !stream.supports_write_values() {
            return Err(GinHostError::Unavailable(format!(
                "{} cannot run 64-bit stream memory operations (the copy-engine transport's fences)",
                dev.name()
            )));
        }
        let host = HostMappedBuffer::new(dev, 64).map_err(sys_err)?;
        let staging = HostMappedBuffer::new(dev, MAX_CHUNKS * CHUNK_BYTES).map_err(sys_err)?;
        let stage_inline = std::env::var(STAGE_INLINE_ENV).is_ok_and(|v| v.trim() == "1");
        Ok(StreamCopyQueue {
            stream: ManuallyDrop::new(stream),
            host: ManuallyDrop::new(host),
            batch: Vec::with_capacity(DIRECT_WRITES + 1),
            copies: Vec::with_capacity(MAX_COPIES),
            stage_inline,
            barrier_writes: false,
            fenced: 0,
            passed: 0,
            staging: ManuallyDrop::new(staging),
            chunks: vec![0; MAX_CHUNKS],
            cur: 0,
            used: 0,
            unchanged_polls: 0,
            stats: devcomm_gin::proxy::stats_enabled().then(Stats::default),
        })
    }

    fn fence_word(&self) -> &AtomicU64 {
        // SAFETY: offset 0 of the live, page-aligned host buffer (owned by
        // self); the stream writes it with 64-bit stores, we only load it.
        unsafe { AtomicU64::from_ptr(self.host.host_ptr() as *mut u64) }
    }

    /// Hands the gathered stream writes to the driver (before anything else
    /// is queued, so the stream keeps the order of the calls).
    ///
    /// If the driver refuses a batch that carries inline values (some
    /// mappings do not take stream writes; the call then queued nothing),
    /// the values go through staging copies from then on and the fences
    /// of the batch are queued again on their own.
    fn submit_writes(&mut self) -> GinResult<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let stream = &self.stream;
        // SAFETY: every address is an 8-aligned word of a window mapped for
        // the transport (the `write` contract) or our fence word, alive
        // until a later fence passes (the callers' contracts; Drop syncs).
        let refused =
            match Stats::call(&mut self.stats, (batch.len() as u64, 0), || unsafe { stream.write_values(&batch) }) {
                Ok(()) => {
                    self.batch = batch;
                    self.batch.clear();
                    return Ok(());
                }
                Err(e) => e,
            };
        let fences_only = batch.iter().all(|&(a, _, _)| a == self.host.device_addr());
        if self.stage_inline || fences_only {
            return Err(sys_err(refused));
        }
        if !self.barrier_writes {
            // Some drivers may take value writes only with the default flags.
            self.barrier_writes = true;
            let again: Vec<_> = batch.iter().map(|&(a, v, _)| (a, v, true)).collect();
            // SAFETY: as above.
            if unsafe { self.stream.write_values(&again) }.is_ok() {
                // Every queue of this driver meets it (known of driver 580):
                // said once per process.
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    tracing::warn!("GIN copy queue: unordered stream writes refused ({refused}); ordered ones taken")
                });
                return Ok(());
            }
        }
        tracing::warn!("GIN copy queue: stream writes of inline values refused ({refused}); staging them instead");
        self.stage_inline = true;
        let fence_addr = self.host.device_addr();
        for (addr, value, _) in batch {
            if addr == fence_addr {
                // A fence: its copies were submitted before it was gathered.
                self.submit_copies()?;
                // SAFETY: our fence word, as above.
                unsafe { self.stream.write_values(&[(addr, value, true)]) }.map_err(sys_err)?;
            } else {
                // SAFETY: the address came through `write`, whose contract covers it.
                unsafe { self.stage(addr, &value.to_le_bytes()) }?;
            }
        }
        Ok(())
    }

    /// Hands the gathered copies to the driver.
    fn submit_copies(&mut self) -> GinResult<()> {
        if self.copies.is_empty() {
            return Ok(());
        }
        let (stream, copies) = (&self.stream, &self.copies);
        // SAFETY: each range came through `copy` or `stage`, whose
        // contracts keep it alive until a later fence; no destination
        // overlaps another copy's range (checked when gathered).
        let r = Stats::call(&mut self.stats, (0, copies.len() as u64), || unsafe { stream.memcpy_batch_raw(copies) })
            .map_err(sys_err);
        self.copies.clear();
        r
    }

    /// Moves to the next staging chunk, once the fence behind its last
    /// copy has passed (the stream drained if that fence is not queued yet).
    fn next_chunk(&mut self) -> GinResult<()> {
        self.used = 0;
        self.cur = (self.cur + 1) % MAX_CHUNKS;
        let need = self.chunks[self.cur];
        if need <= self.passed || need <= self.passed()? {
            return Ok(());
        }
        self.wait_for_chunk(need)
    }

    /// Device and host address of byte `at` of the current chunk.
    fn chunk_at(&self, at: usize) -> (u64, *mut u8) {
        let off = self.cur * CHUNK_BYTES + at;
        // SAFETY: `off <= MAX_CHUNKS * CHUNK_BYTES`, the staging length.
        (self.staging.device_addr() + off as u64, unsafe { self.staging.host_ptr().add(off) })
    }

    /// Waits until fence `need` (the one behind the last copy from the
    /// chunk about to be refilled) has passed, or — where it is not queued
    /// yet — until the stream has run everything queued.
    fn wait_for_chunk(&mut self, need: u64) -> GinResult<()> {
        let start = std::time::Instant::now();
        let mut polls = 0u32;
        if need > self.fenced {
            // Not queued yet: no fence to wait for (queueing one would take a
            // fence number from under the caller). Wait for the stream to
            // run everything instead; then no chunk is in use.
            self.submit()?;
            while !self.stream.is_idle().map_err(sys_err)? {
                if start.elapsed() > DRAIN_TIMEOUT {
                    return Err(GinHostError::Timeout("waiting for the copy queue's stream to free staging".into()));
                }
                std::thread::yield_now();
            }
            self.chunks.fill(0);
            return Ok(());
        }
        while self.passed()? < need {
            if start.elapsed() > DRAIN_TIMEOUT {
                return Err(GinHostError::Timeout(format!(
                    "waiting for fence {need} to free staging of the copy queue"
                )));
            }
            polls += 1;
            if polls < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Writes `data` (any length) through staging and copies, filling the
    /// current chunk and moving on as it is used up.
    ///
    /// # Safety
    /// As for [`CopyQueue::write`].
    unsafe fn stage(&mut self, dst: u64, data: &[u8]) -> GinResult<()> {
        let mut done = 0;
        while done < data.len() {
            let want = data.len() - done;
            // A new write starts 8-aligned, unless it continues the last
            // copy gathered (then it extends that copy).
            let (cursor, _) = self.chunk_at(self.used);
            let continues = self.copies.last().is_some_and(|&(d, s, n)| d + n as u64 == dst && s + n as u64 == cursor);
            if !continues {
                self.used = self.used.next_multiple_of(8).min(CHUNK_BYTES);
            }
            let left = CHUNK_BYTES - self.used;
            if left == 0 || (left < want && left < MIN_SPLIT) {
                self.next_chunk()?;
            }
            let n = want.min(CHUNK_BYTES - self.used);
            let (src, host) = self.chunk_at(self.used);
            self.chunks[self.cur] = self.fenced + 1;
            // SAFETY: used + n <= CHUNK_BYTES: inside the current chunk; no
            // queued copy reads these bytes (the chunk's previous fence has
            // passed, or they were never handed out since).
            unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), host, n) };
            let extend = self.used > 0;
            self.used += n;
            // SAFETY: the source is our pinned staging (alive with self, not
            // rewritten before the next fence passes); `dst` is the caller's.
            unsafe { self.gather(dst + done as u64, src, n, extend) }?;
            done += n;
        }
        Ok(())
    }

    /// Adds a copy to the gathered batch (handing the batch over first if
    /// the copy depends on one of it). `extend`: the copy may lengthen the
    /// last one where both ranges continue it — only for staged copies,
    /// whose sources are known to lie in one allocation (a copy may not
    /// span two allocations).
    ///
    /// # Safety
    /// As for [`CopyQueue::copy`].
    unsafe fn gather(&mut self, dst: u64, src: u64, n: usize, extend: bool) -> GinResult<()> {
        self.submit_writes()?;
        let bytes = n as u64;
        let meet = |a: u64, an: u64, b: u64, bn: u64| a < b + bn && b < a + an;
        // Copies of a batch may run in any order: this one may not write
        // what another reads or writes, nor read what another writes.
        let hazard = |&(d, s, len): &(u64, u64, usize)| {
            meet(dst, bytes, d, len as u64) || meet(dst, bytes, s, len as u64) || meet(src, bytes, d, len as u64)
        };
        if self.copies.iter().any(hazard) {
            self.submit_copies()?;
        }
        match self.copies.last_mut() {
            Some((d, s, len)) if extend && *d + *len as u64 == dst && *s + *len as u64 == src => *len += n,
            _ => self.copies.push((dst, src, n)),
        }
        if self.copies.len() >= MAX_COPIES {
            self.submit_copies()?;
        }
        Ok(())
    }
}

impl CopyQueue for StreamCopyQueue {
    unsafe fn copy(&mut self, dst: u64, src: u64, bytes: u64) -> GinResult<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.gather(dst, src, bytes as usize, false) }
    }

    unsafe fn write(&mut self, dst: u64, data: &[u8]) -> GinResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        // An aligned word is a stream write (the latency path), unless
        // copies are being gathered (then it joins them rather than ending
        // their batch) or [`DIRECT_WRITES`] words are gathered already: then
        // they all go through staging, where adjacent ones share a copy.
        if data.len() == 8 && dst % 8 == 0 && !self.stage_inline && self.copies.is_empty() {
            if self.batch.len() < DIRECT_WRITES {
                let value = u64::from_le_bytes(data.try_into().unwrap_or_default());
                self.batch.push((dst, value, self.barrier_writes));
                return Ok(());
            }
            // Between fences the batch holds inline values only (a fence is
            // handed to the driver as soon as it is queued).
            for (addr, value, _) in std::mem::take(&mut self.batch) {
                // SAFETY: the address came through `write`, whose contract covers it.
                unsafe { self.stage(addr, &value.to_le_bytes()) }?;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.stage(dst, data) }
    }

    fn fence(&mut self) -> GinResult<u64> {
        let n = self.fenced + 1;
        self.submit_copies()?;
        self.batch.push((self.host.device_addr(), n, true));
        self.submit_writes()?;
        self.fenced = n;
        if let Some(st) = &mut self.stats {
            st.in_flight.push_back((n, std::time::Instant::now()));
        }
        Ok(n)
    }

    fn submit(&mut self) -> GinResult<()> {
        // At most one of the two holds work (each flushes the other first).
        self.submit_copies()?;
        self.submit_writes()
    }

    fn passed(&mut self) -> GinResult<u64> {
        let seen = self.fence_word().load(Ordering::Acquire);
        if seen > self.passed {
            self.passed = seen;
            self.unchanged_polls = 0;
            if let Some(st) = &mut self.stats {
                st.passed(seen);
            }
        } else if self.passed < self.fenced {
            self.unchanged_polls += 1;
            if self.unchanged_polls % QUERY_EVERY == 0 {
                // A fault stops the fences for good: report it.
                self.stream.is_idle().map_err(sys_err)?;
            }
        }
        Ok(self.passed)
    }
}

/// Waits (at most `limit`) until `stream` has run everything queued on it;
/// `Ok(false)` if it has not by then. A fault of its work ends the wait too
/// (a faulted context runs nothing more): it is returned.
fn wait_idle(stream: &Stream, limit: std::time::Duration) -> crate::Result<bool> {
    let start = std::time::Instant::now();
    let mut polls = 0u32;
    while !stream.is_idle()? {
        if start.elapsed() > limit {
            return Ok(false);
        }
        polls += 1;
        if polls < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
    Ok(true)
}

impl Drop for StreamCopyQueue {
    fn drop(&mut self) {
        // Nothing may still copy into peer mappings that are about to be
        // unmapped, nor from staging about to be freed: wait for the stream
        // — bounded (a device that never finishes must not hang the proxy's
        // stop and the communicator's destroy). Past the bound the stream
        // and its buffers are leaked (never freed under the device's feet)
        // and the failure is logged; the proxy has already failed its rings
        // (fences that do not pass fail the transport).
        let done = match wait_idle(&self.stream, DRAIN_TIMEOUT) {
            Ok(idle) => idle,
            Err(e) => {
                tracing::warn!("GIN copy queue: {e}");
                true
            }
        };
        if done {
            // SAFETY: each field is dropped once, here, and never used again
            // (we are in `drop`); the stream has run everything that used them.
            unsafe {
                ManuallyDrop::drop(&mut self.staging);
                ManuallyDrop::drop(&mut self.host);
                ManuallyDrop::drop(&mut self.stream);
            }
        } else {
            tracing::error!(
                "GIN copy queue: its stream did not finish within {DRAIN_TIMEOUT:?}; its stream and {} bytes of \
                 pinned staging are leaked rather than freed while the device may still use them",
                MAX_CHUNKS * CHUNK_BYTES
            );
        }
        if let Some(st) = &self.stats {
            let per = |x: u128, n: u64| if n == 0 { 0.0 } else { x as f64 / n as f64 / 1e3 };
            tracing::info!(
                "GIN copy queue stats: {} driver calls ({:.2} us each; {} stream writes, {} copies), \
                 {} fences passed ({:.2} us queued -> seen on average, {:.2} us at most)",
                st.calls,
                per(st.call_ns, st.calls),
                st.writes,
                st.copies,
                st.fences,
                per(st.fence_ns, st.fences),
                st.fence_max_ns as f64 / 1e3
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeSelection;

    /// The emulated device, or a GPU with `DEVCOMM_RUNTIME=cuda` (these
    /// tests then check the real stream operations).
    fn device() -> Device {
        Device::open(RuntimeSelection::from_env().unwrap(), 0).unwrap()
    }

    fn wait(q: &mut StreamCopyQueue, f: u64) {
        let start = std::time::Instant::now();
        while q.passed().unwrap() < f {
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "fence {f} did not pass");
            std::thread::yield_now();
        }
    }

    #[test]
    fn one_staged_write_from_another_thread() {
        // As the proxy and the TCP receivers use it: created on one thread,
        // used on another; single staged copies (odd sizes and offsets).
        let dev = device();
        let buf = dev.alloc_from(&[0u8; 256]).unwrap();
        let base = buf.device_addr();
        let made_here = StreamCopyQueue::new(&dev).unwrap();
        let d2 = dev.clone();
        std::thread::scope(|s| {
            for (k, q) in [Some(made_here), None].into_iter().enumerate() {
                let d2 = d2.clone();
                s.spawn(move || {
                    let mut q = q.unwrap_or_else(|| StreamCopyQueue::new(&d2).unwrap());
                    for (i, len) in [1usize, 3, 8, 5].into_iter().enumerate() {
                        let at = base + (k * 128 + i * 16 + 1) as u64;
                        let data: Vec<u8> = (0..len).map(|j| (k * 100 + i * 10 + j + 1) as u8).collect();
                        // SAFETY: inside `buf`, alive past the wait.
                        unsafe { q.write(at, &data).unwrap() };
                        let f = q.fence().unwrap();
                        wait(&mut q, f);
                    }
                });
            }
        });
        let got = dev.stream().read_vec(&buf).unwrap();
        for k in 0..2 {
            for (i, len) in [1usize, 3, 8, 5].into_iter().enumerate() {
                let at = k * 128 + i * 16 + 1;
                let want: Vec<u8> = (0..len).map(|j| (k * 100 + i * 10 + j + 1) as u8).collect();
                assert_eq!(got[at..at + len], want[..], "queue {k}, write {i}");
            }
        }
    }

    #[test]
    fn writes_copies_and_fences_land_in_order() {
        let dev = device();
        let mut q = StreamCopyQueue::new(&dev).unwrap();
        let buf = dev.alloc_from(&[0u64; 4096]).unwrap();
        let base = buf.device_addr();
        let src = dev.alloc_from(&(0..512u64).map(|i| i * 3 + 1).collect::<Vec<_>>()).unwrap();
        let mut last = 0;
        for round in 0..3u64 {
            // SAFETY: every address lies in `buf` or `src`, alive past the fence waits below.
            unsafe {
                for i in 0..300u64 {
                    q.write(base + i * 8, &(i + round * 1000).to_le_bytes()).unwrap();
                }
                q.write(base + 300 * 8 + 3, &[7u8, 8, 9]).unwrap();
                q.copy(base + 8 * 1024, src.device_addr(), 512 * 8).unwrap();
            }
            let f = q.fence().unwrap();
            assert_eq!(f, last + 1);
            last = f;
            wait(&mut q, f);
            let got = dev.stream().read_vec(&buf).unwrap();
            for i in 0..300u64 {
                assert_eq!(got[i as usize], i + round * 1000);
            }
            assert_eq!(got[300].to_le_bytes()[3..6], [7, 8, 9]);
            for i in 0..512u64 {
                assert_eq!(got[1024 + i as usize], i * 3 + 1);
            }
        }
    }

    #[test]
    fn a_few_words_are_stream_writes_more_are_staged_and_merged() {
        let dev = device();
        let mut q = StreamCopyQueue::new(&dev).unwrap();
        let buf = dev.alloc_from(&[0u64; 64]).unwrap();
        let base = buf.device_addr();
        let value = |i: u64| 0x5eed_0000_0000 + i * 7;
        // SAFETY: every write here is inside `buf`, which lives past the fence waits.
        unsafe {
            for i in 0..DIRECT_WRITES as u64 {
                q.write(base + 8 * i, &value(i).to_le_bytes()).unwrap();
            }
            assert_eq!(q.batch.len(), DIRECT_WRITES, "a few words: stream writes");
            assert!(q.copies.is_empty());
            // One more: all of them go through staging, adjacent ones in one copy.
            q.write(base + 8 * DIRECT_WRITES as u64, &value(DIRECT_WRITES as u64).to_le_bytes()).unwrap();
            assert!(q.batch.is_empty(), "many words: staged");
            assert_eq!(q.copies.len(), 1, "adjacent staged words share a copy");
            assert_eq!(q.copies[0].2, 8 * (DIRECT_WRITES + 1));
            // A word elsewhere: a copy of its own.
            q.write(base + 8 * 40, &value(40).to_le_bytes()).unwrap();
            assert_eq!(q.copies.len(), 2);
        }
        let f = q.fence().unwrap();
        wait(&mut q, f);
        // After the fence a lone word is a stream write again.
        // SAFETY: as above.
        unsafe { q.write(base + 8 * 50, &value(50).to_le_bytes()).unwrap() };
        assert_eq!(q.batch.len(), 1);
        let f = q.fence().unwrap();
        wait(&mut q, f);
        let got = dev.stream().read_vec(&buf).unwrap();
        for (i, &v) in got.iter().enumerate() {
            let want = if i <= DIRECT_WRITES || i == 40 || i == 50 { value(i as u64) } else { 0 };
            assert_eq!(v, want, "word {i}");
        }
    }

    #[test]
    fn dependent_copies_are_not_batched_together() {
        let dev = device();
        let mut q = StreamCopyQueue::new(&dev).unwrap();
        let a = dev.alloc_from(&(0..64u64).map(|i| i + 100).collect::<Vec<_>>()).unwrap();
        let b = dev.alloc_from(&(0..64u64).map(|i| i + 900).collect::<Vec<_>>()).unwrap();
        let x = dev.alloc_from(&[0u64; 64]).unwrap();
        let y = dev.alloc_from(&[0u64; 64]).unwrap();
        let (pa, pb, px, py) = (a.device_addr(), b.device_addr(), x.device_addr(), y.device_addr());
        // SAFETY: every range lies in the four buffers, alive past the wait below.
        unsafe {
            q.copy(px, pa, 512).unwrap(); // x = a
            q.copy(py, px, 256).unwrap(); // y[..32] = x[..32]: reads what the first writes (new batch)
            q.copy(px + 256, pb, 256).unwrap(); // x[32..] = b[..32]: independent of the second (same batch)
            q.copy(px, pb + 256, 128).unwrap(); // x[..16] = b[32..48]: writes what the second reads (new batch)
        }
        assert_eq!(q.copies, vec![(px, pb + 256, 128)], "dependent copies end the batch");
        q.submit().unwrap();
        let f = q.fence().unwrap();
        wait(&mut q, f);
        let (gx, gy) = (dev.stream().read_vec(&x).unwrap(), dev.stream().read_vec(&y).unwrap());
        for i in 0..64usize {
            let want_x = if i < 16 {
                900 + 32 + i as u64
            } else if i < 32 {
                100 + i as u64
            } else {
                900 + (i - 32) as u64
            };
            assert_eq!(gx[i], want_x, "x[{i}]");
            let want_y = if i < 32 { 100 + i as u64 } else { 0 };
            assert_eq!(gy[i], want_y, "y[{i}]");
        }
    }

    #[test]
    fn small_writes_are_staged_and_adjacent_ones_merged() {
        let dev = device();
        let mut q = StreamCopyQueue::new(&dev).unwrap();
        let n = 3 * CHUNK_BYTES / 8;
        let buf = dev.alloc_from(&vec![0u8; 128 + 2 * n]).unwrap();
        let base = buf.device_addr();
        // SAFETY: every write here is inside `buf`, which lives past the fence waits.
        unsafe {
            // Adjacent bytes: staged back to back, one copy.
            for i in 0..64u64 {
                q.write(base + i, &[i as u8 + 1]).unwrap();
            }
            assert_eq!(q.copies.len(), 1, "adjacent staged writes extend one copy");
            assert_eq!(q.copies[0].2, 64);
            // An aligned word while copies are gathered joins them.
            q.write(base + 64, &[9u8; 8]).unwrap();
            assert!(q.batch.is_empty());
            assert_eq!(q.copies.len(), 1);
            // Empty writes queue nothing.
            q.write(base, &[]).unwrap();
            // More strided odd-sized writes than one chunk holds (8 bytes of
            // staging each): the next chunks are used, nothing overwritten.
            for i in 0..n as u64 {
                q.write(base + 128 + 2 * i, &[(i % 251) as u8]).unwrap();
            }
        }
        assert!(q.cur >= 2, "several chunks used");
        let f = q.fence().unwrap();
        assert_eq!(f, 1);
        wait(&mut q, f);
        let got = dev.stream().read_vec(&buf).unwrap();
        for (i, &b) in got.iter().enumerate().take(64) {
            assert_eq!(b, i as u8 + 1, "byte {i}");
        }
        assert_eq!(got[64..72], [9u8; 8]);
        for i in 0..n {
            assert_eq!(got[128 + 2 * i], (i % 251) as u8, "strided byte {i}");
            assert_eq!(got[129 + 2 * i], 0);
        }
    }

    #[test]
    fn large_writes_reuse_staging_after_fences_and_never_overwrite_it() {
        let dev = device();
        let mut q = StreamCopyQueue::new(&dev).unwrap();
        let pattern = |round: usize, len: usize| -> Vec<u8> { (0..len).map(|i| (i * 7 + round * 13) as u8).collect() };
        // Bigger than all staging together, with no fence: the queue drains
        // its stream to refill chunks, fence numbers stay the caller's.
        let big = MAX_CHUNKS * CHUNK_BYTES * 5 / 2 + 3;
        let a = dev.alloc_from(&vec![0u8; big]).unwrap();
        let data = pattern(1, big);
        // SAFETY: inside `a`, alive past the fence wait.
        unsafe { q.write(a.device_addr() + 1, &data[1..]).unwrap() };
        let f = q.fence().unwrap();
        assert_eq!(f, 1);
        wait(&mut q, f);
        assert_eq!(dev.stream().read_vec(&a).unwrap()[1..], data[1..]);

        // Many fenced writes in flight: each chunk is refilled only after
        // the fence behind its copies has passed.
        let len = 300 << 10;
        let b = dev.alloc_from(&vec![0u8; 40 * len]).unwrap();
        let mut last = 0;
        for round in 0..40 {
            // SAFETY: inside `b`, alive past the fence wait.
            unsafe { q.write(b.device_addr() + (round * len) as u64, &pattern(round, len)).unwrap() };
            last = q.fence().unwrap();
        }
        assert_eq!(last, 41);
        wait(&mut q, last);
        let got = dev.stream().read_vec(&b).unwrap();
        for round in 0..40 {
            assert!(got[round * len..(round + 1) * len] == pattern(round, len)[..], "round {round}");
        }
    }
}
