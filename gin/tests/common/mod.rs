//! Test support: an in-process bootstrap, host-memory "device" windows,
//! host-memory GIN rings and a host twin of the GPU producer
//! (`devcomm_device::gin::proxy::post`).
#![allow(dead_code)]

use devcomm_gin::{
    slot_tag, Bootstrap, GinDescriptor, GinHostError, GinHostMemory, GinResult, GinSlot, LocalMemory, QueueTail,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// Allgather between threads of one process.
pub struct FakeBootstrap {
    n: usize,
    slots: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

impl FakeBootstrap {
    pub fn new(n: usize) -> FakeBootstrap {
        FakeBootstrap { n, slots: Mutex::new(vec![Vec::new(); n]), barrier: Barrier::new(n) }
    }

    pub fn rank(&self, rank: usize) -> RankBootstrap<'_> {
        RankBootstrap { shared: self, rank }
    }
}

/// One rank's view of a [`FakeBootstrap`].
pub struct RankBootstrap<'a> {
    shared: &'a FakeBootstrap,
    rank: usize,
}

impl Bootstrap for RankBootstrap<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn nranks(&self) -> usize {
        self.shared.n
    }
    fn allgather(&self, data: &[u8]) -> GinResult<Vec<Vec<u8>>> {
        self.shared.slots.lock().unwrap()[self.rank] = data.to_vec();
        self.shared.barrier.wait();
        let all = self.shared.slots.lock().unwrap().clone();
        self.shared.barrier.wait();
        Ok(all)
    }
}

/// "Device" memory: window `w` at address `(w + 1) << 40`, in host vectors.
pub struct FakeMemory {
    windows: Vec<Mutex<Vec<u8>>>,
}

const WINDOW_SHIFT: u32 = 40;

impl FakeMemory {
    pub fn new(sizes: &[usize]) -> FakeMemory {
        FakeMemory { windows: sizes.iter().map(|&s| Mutex::new(vec![0; s])).collect() }
    }

    pub fn read(&self, window: usize, offset: usize, len: usize) -> Vec<u8> {
        self.windows[window].lock().unwrap()[offset..offset + len].to_vec()
    }

    pub fn write(&self, window: usize, offset: usize, data: &[u8]) {
        self.windows[window].lock().unwrap()[offset..offset + data.len()].copy_from_slice(data);
    }

    pub fn read_u64(&self, window: usize, index: usize) -> u64 {
        u64::from_le_bytes(self.read(window, index * 8, 8).try_into().unwrap())
    }

    fn split(&self, addr: u64, len: usize) -> GinResult<(usize, usize)> {
        let w = (addr >> WINDOW_SHIFT) as usize;
        let off = (addr & ((1 << WINDOW_SHIFT) - 1)) as usize;
        if w == 0 || w > self.windows.len() || off + len > self.windows[w - 1].lock().unwrap().len() {
            return Err(GinHostError::Invalid(format!("bad device address {addr:#x}+{len}")));
        }
        Ok((w - 1, off))
    }
}

impl LocalMemory for FakeMemory {
    fn window_addr(&self, window: u32, offset: u64, bytes: u64) -> GinResult<u64> {
        let Some(w) = self.windows.get(window as usize) else {
            return Err(GinHostError::Invalid(format!("unknown window {window}")));
        };
        let size = w.lock().unwrap().len() as u64;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(GinHostError::Invalid(format!("{bytes} bytes at {offset} exceed window {window} ({size})")));
        }
        Ok(((window as u64 + 1) << WINDOW_SHIFT) + offset)
    }
    fn write_device(&self, addr: u64, data: &[u8]) -> GinResult<()> {
        let (w, off) = self.split(addr, data.len())?;
        self.write(w, off, data);
        Ok(())
    }
    fn read_device(&self, addr: u64, out: &mut [u8]) -> GinResult<()> {
        let (w, off) = self.split(addr, out.len())?;
        out.copy_from_slice(&self.windows[w].lock().unwrap()[off..off + out.len()]);
        Ok(())
    }
}

/// A heap array written through raw pointers by several threads.
pub struct RawBuf<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Clone> RawBuf<T> {
    fn new(value: T, len: usize) -> RawBuf<T> {
        let b: Box<[T]> = vec![value; len].into_boxed_slice();
        RawBuf { ptr: Box::into_raw(b) as *mut T, len }
    }
}

impl<T> Drop for RawBuf<T> {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw of a boxed slice of `len` elements.
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

// SAFETY: shared words are accessed atomically; plain parts follow the ring protocol.
unsafe impl<T> Send for RawBuf<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for RawBuf<T> {}

/// GIN memory of one rank in host vectors, plus the producers' device-side
/// words (heads, tail cache).
pub struct HostGin {
    rings: RawBuf<GinSlot>,
    tails: RawBuf<QueueTail>,
    signals: Vec<AtomicU64>,
    counters: Vec<AtomicU64>,
    heads: Vec<AtomicU64>,
    tail_cache: Vec<AtomicU64>,
    pub contexts: u32,
    pub nranks: u32,
    pub depth: u32,
}

/// The ring was failed by the proxy.
#[derive(Debug, PartialEq, Eq)]
pub struct RingFailed;

/// Why [`HostGin::post_within`] gave up.
#[derive(Debug, PartialEq, Eq)]
pub enum PostError {
    /// The proxy failed the ring.
    RingFailed,
    /// No credit in time: this ticket was taken and abandoned.
    Timeout(u64),
}

/// How long a producer or a check waits before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

impl HostGin {
    pub fn new(contexts: u32, nranks: u32, depth: u32, signals: u32, counters: u32) -> Box<HostGin> {
        let rings = (contexts * nranks) as usize;
        Box::new(HostGin {
            rings: RawBuf::new(GinSlot::default(), rings * depth as usize),
            tails: RawBuf::new(QueueTail::default(), rings),
            signals: (0..signals).map(|_| AtomicU64::new(0)).collect(),
            counters: (0..counters).map(|_| AtomicU64::new(0)).collect(),
            heads: (0..rings).map(|_| AtomicU64::new(0)).collect(),
            tail_cache: (0..rings).map(|_| AtomicU64::new(0)).collect(),
            contexts,
            nranks,
            depth,
        })
    }

    /// The memory for the proxy. The box must outlive the proxy.
    pub fn mem(&self) -> GinHostMemory {
        GinHostMemory {
            rings: self.rings.ptr,
            tails: self.tails.ptr,
            signals: self.signals.as_ptr() as *mut u64,
            counters: self.counters.as_ptr() as *mut u64,
            contexts: self.contexts,
            nranks: self.nranks,
            depth: self.depth,
            total_signals: self.signals.len() as u32,
            counters_len: self.counters.len() as u32,
        }
    }

    pub fn ring(&self, context: u32, peer: u32) -> usize {
        (context * self.nranks + peer) as usize
    }

    fn tail_words(&self, ring: usize) -> (&AtomicU64, &AtomicU64) {
        assert!(ring < self.tails.len);
        let t = self.tails.ptr.wrapping_add(ring);
        // SAFETY: live, aligned, shared words accessed atomically by everybody.
        unsafe {
            (
                AtomicU64::from_ptr(core::ptr::addr_of_mut!((*t).completed)),
                AtomicU64::from_ptr(core::ptr::addr_of_mut!((*t).error)),
            )
        }
    }

    /// `proxy::completed`: acquire load of the tail, then the error word.
    pub fn completed(&self, ring: usize) -> Result<u64, RingFailed> {
        let (done, error) = self.tail_words(ring);
        let done = done.load(Ordering::Acquire);
        if error.load(Ordering::Relaxed) != 0 {
            return Err(RingFailed);
        }
        Ok(done)
    }

    pub fn failed(&self, ring: usize) -> bool {
        self.tail_words(ring).1.load(Ordering::Acquire) != 0
    }

    /// Host twin of `proxy::post`: ticket by fetch_add, credit against the
    /// (cached) tail, then the slot's tagged words with relaxed stores (a
    /// release fence first, as a put does).
    pub fn post(&self, ring: usize, body: &GinDescriptor) -> Result<u64, RingFailed> {
        let depth = self.depth as u64;
        let ticket = self.heads[ring].fetch_add(1, Ordering::Relaxed);
        let cached = self.tail_cache[ring].load(Ordering::Relaxed);
        if ticket >= cached + depth {
            let start = Instant::now();
            loop {
                let done = self.completed(ring)?;
                if ticket < done + depth {
                    self.tail_cache[ring].store(done, Ordering::Relaxed);
                    break;
                }
                assert!(start.elapsed() < PATIENCE, "no credit on ring {ring} (ticket {ticket}, done {done})");
                std::thread::yield_now();
            }
        }
        self.write_slot(ring, ticket, body);
        Ok(ticket)
    }

    /// The slot of `ticket` (credit held), as `proxy::post` writes it.
    fn write_slot(&self, ring: usize, ticket: u64, body: &GinDescriptor) {
        let depth = self.depth as u64;
        assert!(ring < self.tails.len);
        let slot = self.rings.ptr.wrapping_add(ring * self.depth as usize + (ticket % depth) as usize);
        let words = GinSlot::encode(body, slot_tag(ticket, self.depth)).words;
        std::sync::atomic::fence(Ordering::Release);
        // SAFETY: our slot (credit held), aligned; its words are accessed
        // atomically by the proxy. Stored last word first, so a reader
        // racing with us sees mixed laps (the case the tags are for).
        unsafe {
            for i in (0..8).rev() {
                AtomicU64::from_ptr(core::ptr::addr_of_mut!((*slot).words[i])).store(words[i], Ordering::Relaxed);
            }
        }
    }

    /// Host twin of `proxy::post` with a credit wait that gives up after
    /// `limit`, as a device producer's does (its op timeout): the ticket it
    /// took is then recorded as abandoned in the ring's tail
    /// (`QueueTail::abandoned`), as `post` does on the GPU.
    pub fn post_within(&self, ring: usize, body: &GinDescriptor, limit: Duration) -> Result<u64, PostError> {
        use devcomm_device::abi::gin::{abandon_word, ABANDON_TIMEOUT};
        let depth = self.depth as u64;
        let ticket = self.heads[ring].fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let abandon = |cause: u64| {
            let t = self.tails.ptr.wrapping_add(ring);
            // SAFETY: ring `ring`'s live, aligned tail; the word is accessed atomically.
            let w = unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*t).abandoned)) };
            // As on the GPU: a load, then a store; the first record stays.
            if w.load(Ordering::Relaxed) == 0 {
                w.store(abandon_word(ticket, cause), Ordering::Relaxed);
            }
        };
        loop {
            match self.completed(ring) {
                // As on the GPU: a failed ring needs no record (the proxy
                // failed it, or an earlier record did).
                Err(RingFailed) => return Err(PostError::RingFailed),
                Ok(done) if ticket < done + depth => break,
                Ok(_) if start.elapsed() > limit => {
                    abandon(ABANDON_TIMEOUT);
                    return Err(PostError::Timeout(ticket));
                }
                Ok(_) => std::thread::yield_now(),
            }
        }
        self.write_slot(ring, ticket, body);
        Ok(ticket)
    }

    /// Host twin of `proxy::flush_ring`.
    pub fn flush(&self, ring: usize) -> Result<(), RingFailed> {
        let target = self.heads[ring].load(Ordering::Relaxed);
        let start = Instant::now();
        while self.completed(ring)? < target {
            assert!(start.elapsed() < PATIENCE, "flush of ring {ring} stuck");
            std::thread::yield_now();
        }
        Ok(())
    }

    pub fn signal(&self, id: usize) -> u64 {
        self.signals[id].load(Ordering::SeqCst)
    }

    pub fn counter(&self, id: usize) -> u64 {
        self.counters[id].load(Ordering::SeqCst)
    }

    /// Waits until `signal(id) >= value`.
    pub fn wait_signal(&self, id: usize, value: u64) {
        let start = Instant::now();
        while self.signal(id) < value {
            assert!(start.elapsed() < PATIENCE, "signal {id} stuck at {} < {value}", self.signal(id));
            std::thread::yield_now();
        }
    }
}
