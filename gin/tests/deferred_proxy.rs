//! The proxy over a transport whose work retires later than it is issued
//! (as the copy-engine transport's does): tickets complete — and counters
//! count — only once retired, in ticket order, while the proxy reads ahead
//! no further than the ring's credit allows; `stop` waits for work in
//! flight.

mod common;

use common::{FakeMemory, HostGin, PATIENCE};
use devcomm_gin::descriptor::{encode, Request};
use devcomm_gin::transport::PeerFailure;
use devcomm_gin::{GinResult, LocalMemory, Proxy, PutTarget, Transport};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the test sees of the transport.
#[derive(Default)]
struct Log {
    /// Inline payloads in the order the proxy issued them.
    issued: Mutex<Vec<u64>>,
    /// How many operations the test lets retire.
    retire_upto: AtomicU64,
}

/// Counts operations; each retires when the test raises `retire_upto`.
struct Deferred {
    log: Arc<Log>,
    count: u64,
}

impl Transport for Deferred {
    fn put(&mut self, _to: PutTarget, data: &[u8]) -> GinResult<()> {
        let mut v = [0u8; 8];
        v[..data.len()].copy_from_slice(data);
        self.log.issued.lock().unwrap().push(u64::from_le_bytes(v));
        self.count += 1;
        Ok(())
    }
    fn signal(&mut self, _peer: usize, _signal: u32, _value: u64) -> GinResult<()> {
        self.count += 1;
        Ok(())
    }
    fn progress(&mut self, _failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        Ok(())
    }
    fn flush(&mut self) -> GinResult<()> {
        Ok(())
    }
    fn issued(&self) -> u64 {
        self.count
    }
    fn retired(&mut self) -> GinResult<u64> {
        Ok(self.log.retire_upto.load(Ordering::SeqCst).min(self.count))
    }
    fn close(&mut self, _graceful: bool) {}
}

fn put_value(v: u64) -> devcomm_gin::GinDescriptor {
    encode(&Request::PutValue {
        peer: 1,
        dst_window: 0,
        dst_offset: 0,
        payload: v.to_le_bytes(),
        len: 8,
        remote: None,
        local: Some(0),
    })
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn tickets_complete_only_when_retired_and_in_order() {
    const DEPTH: u32 = 4;
    let gin = HostGin::new(1, 2, DEPTH, 1, 1);
    let log = Arc::new(Log::default());
    let local: Arc<dyn LocalMemory> = Arc::new(FakeMemory::new(&[64]));
    let t = Deferred { log: log.clone(), count: 0 };
    // SAFETY: `gin` outlives the proxy (stopped below).
    let proxy = unsafe { Proxy::start(gin.mem(), local, Box::new(t), 0) }.unwrap();
    let ring = gin.ring(0, 1);

    // A full ring: the proxy reads all of it ahead, completes nothing.
    for v in 0..DEPTH as u64 {
        gin.post(ring, &put_value(v)).unwrap();
    }
    wait_until("the read-ahead", || log.issued.lock().unwrap().len() == DEPTH as usize);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(gin.completed(ring), Ok(0), "nothing retired, nothing completed");
    assert_eq!(gin.counter(0), 0, "counters count retired work only");

    // A producer blocked on credit gets it as work retires, one ticket at a time.
    let producer = {
        let gin = &*gin as *const HostGin as usize;
        std::thread::spawn(move || {
            // SAFETY: `gin` outlives this thread (joined below).
            let gin = unsafe { &*(gin as *const HostGin) };
            for v in DEPTH as u64..3 * DEPTH as u64 {
                gin.post(ring, &put_value(v)).unwrap();
            }
        })
    };
    for k in 1..=3 * DEPTH as u64 {
        log.retire_upto.store(k, Ordering::SeqCst);
        wait_until("completion of a retired ticket", || gin.completed(ring) == Ok(k));
        assert_eq!(gin.counter(0), k);
        // Never more than the ring's depth in flight.
        let issued = log.issued.lock().unwrap().len() as u64;
        assert!(issued <= k + DEPTH as u64, "read ahead {issued} with {k} completed");
    }
    producer.join().unwrap();
    assert_eq!(*log.issued.lock().unwrap(), (0..3 * DEPTH as u64).collect::<Vec<_>>(), "ticket order kept");

    // `stop` waits for work in flight to retire.
    gin.post(ring, &put_value(99)).unwrap();
    wait_until("the last post", || log.issued.lock().unwrap().len() == 3 * DEPTH as usize + 1);
    let releaser = {
        let log = log.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            log.retire_upto.store(u64::MAX, Ordering::SeqCst);
        })
    };
    proxy.stop().unwrap();
    releaser.join().unwrap();
    assert_eq!(gin.completed(ring), Ok(3 * DEPTH as u64 + 1));
    assert_eq!(gin.counter(0), 3 * DEPTH as u64 + 1);
}
