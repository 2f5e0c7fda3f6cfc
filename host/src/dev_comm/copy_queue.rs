//! The GIN proxy's asynchronous device data path ([`devcomm_gin::CopyQueue`])
//! over a runtime stream of its own.
//!
//! * copies: gathered and handed to the copy engine together
//!   (`cuMemcpyBatchAsync`: one driver call for up to [`MAX_COPIES`]), a
//!   batch ending early where a copy would overlap one already in it (the
//!   copies of a batch may run in any order);
//! * inline values of 8 aligned bytes: 64-bit stream writes
//!   (`cuStreamBatchMemOp`), batched — consecutive writes cost one driver
//!   call; other sizes, or where the driver refuses stream writes to the
//!   destination: the bytes go to a pinned staging slot, then a copy
//!   (gathered like the others);
//! * fences: a 64-bit stream write *with* a memory barrier of the fence
//!   number into a host-mapped word, which the proxy reads with a plain
//!   load. The barrier makes everything queued before visible first.
//!
//! Staging slots are reused round-robin; a slot is taken again only after
//! the fence behind its last copy has passed. A device fault stops the
//! fences; [`devcomm_gin::CopyQueue::passed`] then asks the stream (every
//! [`QUERY_EVERY`] unchanged polls) and returns its error.

use crate::runtime::{Device, HostMappedBuffer, Stream};
use devcomm_gin::{CopyQueue, GinHostError, GinResult};
use std::sync::atomic::{AtomicU64, Ordering};

/// Staging slots (8 bytes each) for inline values that are not one aligned 8-byte word.
const STAGING_SLOTS: usize = 1024;
/// Offset of the first staging slot (the fence word has its own 64-byte line).
const STAGING_AT: usize = 64;
/// Stream writes gathered before they are handed to the driver in one call.
const MAX_BATCH: usize = 128;
/// Copies gathered before they are handed to the driver in one call.
const MAX_COPIES: usize = 64;
/// Unchanged polls of the fence word between two checks of the stream for errors.
const QUERY_EVERY: u32 = 4096;

/// Forces inline values through staging copies instead of stream writes
/// (for comparison, or as a workaround): `DEVCOMM_GIN_CE_STAGE_INLINE=1`.
pub(crate) const STAGE_INLINE_ENV: &str = "DEVCOMM_GIN_CE_STAGE_INLINE";

fn sys_err(e: crate::Error) -> GinHostError {
    GinHostError::System(e.to_string())
}

pub(crate) struct StreamCopyQueue {
    stream: Stream,
    /// Fence word at offset 0, staging slots from [`STAGING_AT`].
    host: HostMappedBuffer,
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
    next_slot: usize,
    /// Per staging slot: the fence that must pass before it is reused.
    slot_fence: Vec<u64>,
    unchanged_polls: u32,
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
        let host = HostMappedBuffer::new(dev, STAGING_AT + STAGING_SLOTS * 8).map_err(sys_err)?;
        let stage_inline = std::env::var(STAGE_INLINE_ENV).is_ok_and(|v| v.trim() == "1");
        Ok(StreamCopyQueue {
            stream,
            host,
            batch: Vec::with_capacity(MAX_BATCH),
            copies: Vec::with_capacity(MAX_COPIES),
            stage_inline,
            barrier_writes: false,
            fenced: 0,
            passed: 0,
            next_slot: 0,
            slot_fence: vec![0; STAGING_SLOTS],
            unchanged_polls: 0,
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
        // SAFETY: every address is an 8-aligned word of a window mapped for
        // the transport (the `write` contract) or our fence word, alive
        // until a later fence passes (the callers' contracts; Drop syncs).
        let refused = match unsafe { self.stream.write_values(&batch) } {
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
                tracing::warn!("GIN copy queue: unordered stream writes refused ({refused}); ordered ones taken");
                return Ok(());
            }
        }
        tracing::warn!("GIN copy queue: stream writes of inline values refused ({refused}); staging them instead");
        self.stage_inline = true;
        let fence_addr = self.host.device_addr();
        for (addr, value, _) in batch {
            if addr == fence_addr {
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
        // SAFETY: each range came through `copy`, whose contract keeps it
        // alive until a later fence; no destination overlaps another
        // copy's range (checked when gathered).
        let r = unsafe { self.stream.memcpy_batch_raw(&self.copies) }.map_err(sys_err);
        self.copies.clear();
        r
    }

    /// A staging slot free for reuse, waiting for its fence if needed.
    fn take_slot(&mut self) -> GinResult<usize> {
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % STAGING_SLOTS;
        let need = self.slot_fence[slot];
        if need > self.fenced {
            self.fence()?;
        }
        let start = std::time::Instant::now();
        while self.passed()? < need {
            if start.elapsed() > devcomm_gin::transport::copy_engine::DRAIN_TIMEOUT {
                return Err(GinHostError::Timeout("waiting for a staging slot of the copy queue".into()));
            }
            std::hint::spin_loop();
        }
        Ok(slot)
    }

    /// Writes `data` (1 to 8 bytes) through a staging slot and a copy.
    ///
    /// # Safety
    /// As for [`CopyQueue::write`].
    unsafe fn stage(&mut self, dst: u64, data: &[u8]) -> GinResult<()> {
        let slot = self.take_slot()?;
        self.slot_fence[slot] = self.fenced + 1;
        let at = STAGING_AT + slot * 8;
        // SAFETY: slot < STAGING_SLOTS and data.len() <= 8, so the bytes lie
        // inside `host`; no queued copy reads this slot (its fence has passed).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.host.host_ptr().add(at), data.len()) };
        let src = self.host.device_addr() + at as u64;
        // SAFETY: the source is our pinned slot (alive with self, not
        // rewritten before the next fence passes); `dst` is the caller's.
        // Gathered with the other copies (one driver call for many).
        unsafe { CopyQueue::copy(self, dst, src, data.len() as u64) }
    }
}

impl CopyQueue for StreamCopyQueue {
    unsafe fn copy(&mut self, dst: u64, src: u64, bytes: u64) -> GinResult<()> {
        self.submit_writes()?;
        let n = bytes as usize;
        let meet = |a: u64, an: u64, b: u64, bn: u64| a < b + bn && b < a + an;
        // Copies of a batch may run in any order: this one may not write
        // what another reads or writes, nor read what another writes.
        let hazard = |&(d, s, len): &(u64, u64, usize)| {
            meet(dst, bytes, d, len as u64) || meet(dst, bytes, s, len as u64) || meet(src, bytes, d, len as u64)
        };
        if self.copies.iter().any(hazard) {
            self.submit_copies()?;
        }
        self.copies.push((dst, src, n));
        if self.copies.len() >= MAX_COPIES {
            self.submit_copies()?;
        }
        Ok(())
    }

    unsafe fn write(&mut self, dst: u64, data: &[u8]) -> GinResult<()> {
        if data.is_empty() || data.len() > 8 {
            return Err(GinHostError::Invalid(format!("an inline write of {} bytes (1 to 8)", data.len())));
        }
        if data.len() == 8 && dst % 8 == 0 && !self.stage_inline {
            let value = u64::from_le_bytes(data.try_into().unwrap_or_default());
            self.submit_copies()?;
            self.batch.push((dst, value, self.barrier_writes));
            if self.batch.len() >= MAX_BATCH {
                self.submit_writes()?;
            }
            return Ok(());
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

impl Drop for StreamCopyQueue {
    fn drop(&mut self) {
        // Nothing may still copy into peer mappings that are about to be unmapped.
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!("GIN copy queue: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeSelection;

    fn device() -> Device {
        Device::open(RuntimeSelection::Emulated, 0).unwrap()
    }

    fn wait(q: &mut StreamCopyQueue, f: u64) {
        while q.passed().unwrap() < f {
            std::thread::yield_now();
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
    fn staging_slots_are_reused_after_their_fence() {
        let dev = device();
        let mut q = StreamCopyQueue::new(&dev).unwrap();
        let buf = dev.alloc_from(&[0u8; 3 * STAGING_SLOTS + 64]).unwrap();
        // More odd-sized writes than slots: slots are recycled through fences.
        for i in 0..(3 * STAGING_SLOTS) as u64 {
            // SAFETY: inside `buf`, alive past the final fence wait.
            unsafe { q.write(buf.device_addr() + i, &[(i % 251) as u8]).unwrap() };
        }
        let f = q.fence().unwrap();
        wait(&mut q, f);
        let got = dev.stream().read_vec(&buf).unwrap();
        for (i, &b) in got.iter().enumerate().take(3 * STAGING_SLOTS) {
            assert_eq!(b, (i % 251) as u8, "byte {i}");
        }
        // SAFETY: an empty or oversized write is refused before touching memory.
        unsafe {
            assert!(matches!(q.write(buf.device_addr(), &[]), Err(GinHostError::Invalid(_))));
            assert!(matches!(q.write(buf.device_addr(), &[0; 9]), Err(GinHostError::Invalid(_))));
        }
    }
}
