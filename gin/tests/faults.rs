//! Failures of the proxy path that must end as errors, never as silent
//! stalls: a producer that took a ticket and gave up before posting it
//! (the proxy fails the ring at the hole instead of waiting for it
//! forever), and a transport that fails as a whole.

mod common;

use common::{FakeMemory, HostGin, PostError, PATIENCE};
use devcomm_gin::descriptor::{encode, Request};
use devcomm_gin::transport::PeerFailure;
use devcomm_gin::{GinHostError, GinResult, Proxy, PutTarget, Transport};
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the test sees of the transport, and the gate it holds puts at.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    delivered: Mutex<Vec<u64>>,
}

/// Delivers puts only while the gate is open (a network that stalls for
/// a while: the proxy thread blocks in `put`, as it does in a TCP write to
/// a peer that stopped reading).
struct Gated(Arc<Gate>);

impl Transport for Gated {
    fn put(&mut self, _to: PutTarget, data: &[u8]) -> GinResult<()> {
        let g = &self.0;
        let open = g.cv.wait_while(g.open.lock().unwrap(), |open| !*open).unwrap();
        drop(open);
        let mut v = [0u8; 8];
        v[..data.len()].copy_from_slice(data);
        g.delivered.lock().unwrap().push(u64::from_le_bytes(v));
        Ok(())
    }
    fn signal(&mut self, _peer: usize, _signal: u32, _value: u64) -> GinResult<()> {
        Ok(())
    }
    fn progress(&mut self, _failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        Ok(())
    }
    fn flush(&mut self) -> GinResult<()> {
        Ok(())
    }
    fn close(&mut self, _graceful: bool) {}
}

fn put_value(v: u64) -> devcomm_gin::GinDescriptor {
    encode(&Request::PutValue {
        peer: 1,
        dst_window: 0,
        dst_offset: 8,
        payload: v.to_le_bytes(),
        len: 8,
        remote: None,
        local: None,
    })
}

/// A producer's credit wait times out while the proxy is held up by its
/// transport; it leaves its ticket unwritten. Once the transport moves
/// again the proxy serves what came before the hole, then fails the ring
/// (naming the abandoned ticket) — a later post's flush ends with the
/// ring's failure, not a stall that only a timeout ends.
#[test]
fn an_abandoned_ticket_fails_the_ring_instead_of_stalling_it() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xab4d);
    let values: Vec<u64> = (0..4).map(|_| rng.gen::<u64>() | 1).collect();
    let gin = HostGin::new(1, 2, 2, 1, 1);
    let gate = Arc::new(Gate::default());
    let local = Arc::new(FakeMemory::new(&[64]));
    // SAFETY: `gin` outlives the proxy (stopped at the end of the test);
    // the producers below access the shared words atomically.
    let proxy = unsafe { Proxy::start(gin.mem(), local, Box::new(Gated(gate.clone())), 0) }.unwrap();
    let ring = gin.ring(0, 1);
    let limit = Duration::from_millis(200);
    // Depth 2: the proxy takes ticket 0 and blocks in the transport; ticket 1 fills the ring.
    assert_eq!(gin.post_within(ring, &put_value(values[0]), limit), Ok(0));
    assert_eq!(gin.post_within(ring, &put_value(values[1]), limit), Ok(1));
    // No credit for ticket 2 while the transport is stuck: the producer gives up.
    let t = Instant::now();
    assert_eq!(gin.post_within(ring, &put_value(values[2]), limit), Err(PostError::Timeout(2)));
    assert!(t.elapsed() >= limit);
    assert!(proxy.error().is_none(), "nothing failed yet: {:?}", proxy.error());
    // The network moves again.
    *gate.open.lock().unwrap() = true;
    gate.cv.notify_all();
    // A later producer: it gets credit (tickets 0 and 1 complete) or finds the ring failed.
    let t = Instant::now();
    let later = gin.post_within(ring, &put_value(values[3]), PATIENCE);
    assert!(matches!(later, Ok(3) | Err(PostError::RingFailed)), "{later:?}");
    assert_eq!(gin.flush(ring), Err(common::RingFailed), "the flush must end with the ring's failure");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    let e = proxy.error().expect("the proxy reports the abandoned ticket");
    assert!(matches!(&e, GinHostError::Timeout(m) if m.contains("gave up ticket 2")), "{e:?}");
    // What came before the hole was carried out, nothing after it.
    assert_eq!(*gate.delivered.lock().unwrap(), values[..2]);
    assert!(gin.completed(ring).is_err());
    assert!(!gin.failed(gin.ring(0, 0)), "other rings are not concerned");
    let stopped = proxy.stop();
    assert!(matches!(stopped, Err(GinHostError::Timeout(_))), "{stopped:?}");
}

/// How the test sees a transport that fails as a whole.
#[derive(Default)]
struct Faulty {
    /// `close` calls: their `graceful` argument.
    closes: Mutex<Vec<bool>>,
}

/// Takes work, then reports a device fault when asked how far it retired
/// (as the copy-engine transport does when its queue faults or its fences
/// stop passing).
struct FaultyTransport(Arc<Faulty>, u64);

impl Transport for FaultyTransport {
    fn put(&mut self, _to: PutTarget, _data: &[u8]) -> GinResult<()> {
        self.1 += 1;
        Ok(())
    }
    fn signal(&mut self, _peer: usize, _signal: u32, _value: u64) -> GinResult<()> {
        self.1 += 1;
        Ok(())
    }
    fn progress(&mut self, _failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        Ok(())
    }
    fn flush(&mut self) -> GinResult<()> {
        Ok(())
    }
    fn issued(&self) -> u64 {
        self.1
    }
    fn retired(&mut self) -> GinResult<u64> {
        Err(GinHostError::System("device fault while copying".into()))
    }
    fn close(&mut self, graceful: bool) {
        self.0.closes.lock().unwrap().push(graceful);
    }
}

/// A transport that fails as a whole fails every ring and is closed at
/// once, not gracefully — its peers learn of it (their connections are
/// cut) while this rank's communicator still lives, instead of waiting for
/// signals whose data never landed.
#[test]
fn a_failed_transport_fails_every_ring_and_is_cut_at_once() {
    let gin = HostGin::new(2, 3, 4, 1, 1);
    let log = Arc::new(Faulty::default());
    let local = Arc::new(FakeMemory::new(&[64]));
    // SAFETY: `gin` outlives the proxy; producers access shared words atomically.
    let proxy = unsafe { Proxy::start(gin.mem(), local, Box::new(FaultyTransport(log.clone(), 0)), 0) }.unwrap();
    let ring = gin.ring(1, 1);
    gin.post(ring, &put_value(0x0dd_ba11)).unwrap();
    assert_eq!(gin.flush(ring), Err(common::RingFailed));
    let start = Instant::now();
    while log.closes.lock().unwrap().is_empty() {
        assert!(start.elapsed() < PATIENCE, "the failed transport was not closed");
        std::thread::yield_now();
    }
    assert_eq!(*log.closes.lock().unwrap(), vec![false], "cut at once, as if this rank had died");
    for q in 0..6 {
        assert!(gin.failed(q), "ring {q} not failed");
    }
    let e = proxy.error().expect("the proxy's error");
    assert!(matches!(&e, GinHostError::System(m) if m.contains("device fault")), "{e:?}");
    assert!(matches!(proxy.stop(), Err(GinHostError::System(_))));
    // `stop` closes again, gracefully (a no-op for the real transports, which close once).
    assert_eq!(*log.closes.lock().unwrap(), vec![false, true]);
}
