//! Model check (loom) of one ring's protocol: producers take tickets with
//! `fetch_add`, wait for credit against the tail (with the tail cache of
//! `devcomm_device::gin::queue::post`), write the body (a loom `UnsafeCell`,
//! so a body write racing the consumer's read is reported) and publish the
//! ticket with release; one consumer takes tickets in order (acquire), reads
//! the body and completes with release. Checked in every interleaving: no
//! data race on a slot, nothing lost, duplicated or reordered per producer,
//! and producers wait while the ring is full.

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Ring {
    depth: u64,
    head: AtomicU64,
    tail_cache: AtomicU64,
    completed: AtomicU64,
    tickets: Vec<AtomicU64>,
    bodies: Vec<UnsafeCell<u64>>,
}

impl Ring {
    fn new(depth: u64) -> Ring {
        Ring {
            depth,
            head: AtomicU64::new(0),
            tail_cache: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            tickets: (0..depth).map(|_| AtomicU64::new(0)).collect(),
            bodies: (0..depth).map(|_| UnsafeCell::new(0)).collect(),
        }
    }

    /// `queue::post`, with the orderings `cache_load`/`cache_store` on the tail cache.
    fn post(&self, body: u64, cache_load: Ordering, cache_store: Ordering) {
        let ticket = self.head.fetch_add(1, Ordering::Relaxed);
        let cached = self.tail_cache.load(cache_load);
        if ticket >= cached + self.depth {
            loop {
                let done = self.completed.load(Ordering::Acquire);
                if ticket < done + self.depth {
                    self.tail_cache.store(done, cache_store);
                    break;
                }
                thread::yield_now();
            }
        }
        let slot = (ticket % self.depth) as usize;
        self.bodies[slot].with_mut(|b| unsafe { *b = body });
        self.tickets[slot].store(ticket + 1, Ordering::Release);
    }

    /// `Rings::poll` + `Rings::complete`, waiting while nothing is ready.
    fn take(&self) -> u64 {
        let next = self.completed.load(Ordering::Relaxed);
        let slot = (next % self.depth) as usize;
        while self.tickets[slot].load(Ordering::Acquire) != next + 1 {
            thread::yield_now();
        }
        let body = self.bodies[slot].with(|b| unsafe { *b });
        self.completed.store(next + 1, Ordering::Release);
        body
    }
}

/// `producers` threads post `each` descriptors (body = producer << 8 | seq)
/// into a ring of `depth`; the consumer checks them.
fn model(producers: u64, each: u64, depth: u64, cache_load: Ordering, cache_store: Ordering, bound: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.max_branches = 100_000;
    b.check(move || {
        let ring = Arc::new(Ring::new(depth));
        let handles: Vec<_> = (0..producers)
            .map(|p| {
                let ring = ring.clone();
                thread::spawn(move || {
                    for seq in 0..each {
                        ring.post(p << 8 | seq, cache_load, cache_store);
                    }
                })
            })
            .collect();
        let mut next = vec![0u64; producers as usize];
        for _ in 0..producers * each {
            let body = ring.take();
            let (p, seq) = ((body >> 8) as usize, body & 0xff);
            assert_eq!(seq, next[p], "producer {p}: lost, duplicated or reordered");
            next[p] += 1;
        }
        for h in handles {
            h.join().unwrap();
        }
        // Never more than `depth` tickets ahead of the consumer: the last
        // producers had to wait for credit.
        assert_eq!(ring.completed.load(Ordering::Relaxed), producers * each);
        assert_eq!(ring.head.load(Ordering::Relaxed), producers * each);
    });
}

/// Two producers, one descriptor each, a ring of depth 1 (the second waits).
#[test]
fn two_producers_depth_one() {
    model(2, 1, 1, Ordering::Acquire, Ordering::Release, 2);
}

/// Three producers, one descriptor each, depth 2 (the third waits for credit).
#[test]
fn three_producers_depth_two() {
    model(3, 1, 2, Ordering::Acquire, Ordering::Release, 2);
}
