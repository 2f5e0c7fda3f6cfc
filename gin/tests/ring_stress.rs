//! Many host producers (the twin of the GPU producer) against the ring
//! consumer: nothing lost, nothing duplicated, per-producer order kept.

mod common;

use common::HostGin;
use devcomm_gin::{GinDescriptor, Rings};
use std::time::Instant;

#[test]
fn eight_producers_depth_two() {
    const PRODUCERS: u64 = 8;
    const EACH: u64 = 10_000;
    let (contexts, nranks) = (2u32, 2u32);
    let gin = HostGin::new(contexts, nranks, 2, 0, 0);
    // SAFETY: `gin` outlives `rings` and the producers.
    let rings = unsafe { Rings::new(gin.mem()) }.unwrap();
    let nrings = rings.count();
    let start = Instant::now();
    std::thread::scope(|s| {
        for p in 0..PRODUCERS {
            let gin = &gin;
            s.spawn(move || {
                let ring = (p as usize) % nrings;
                for seq in 0..EACH {
                    // Fields in every word of the slot, all derived from (p, seq).
                    let d = GinDescriptor {
                        peer: p as u32,
                        src_window: p as u32,
                        src_offset: seq,
                        dst_offset: !seq,
                        value: seq ^ (p << 40),
                        ..Default::default()
                    };
                    gin.post(ring, &d).unwrap();
                }
            });
        }
        // The consumer: per ring, tickets in order; per producer, sequence in order.
        let mut next = vec![0u64; PRODUCERS as usize];
        let mut total = 0;
        while total < PRODUCERS * EACH {
            let mut did = false;
            for q in 0..nrings {
                while let Some(d) = rings.poll(q) {
                    let p = d.src_window as usize;
                    let seq = d.src_offset;
                    assert_eq!(
                        (d.peer as usize, d.dst_offset, d.value),
                        (p, !seq, seq ^ ((p as u64) << 40)),
                        "torn slot"
                    );
                    assert_eq!(p % nrings, q, "descriptor in the wrong ring");
                    assert_eq!(d.src_offset, next[p], "producer {p}: lost, duplicated or reordered");
                    next[p] += 1;
                    total += 1;
                    rings.complete(q);
                    did = true;
                }
            }
            if !did {
                assert!(start.elapsed() < common::PATIENCE, "stuck at {total}");
                std::thread::yield_now();
            }
        }
        assert!(next.iter().all(|&n| n == EACH));
    });
    for q in 0..nrings {
        assert!(rings.poll(q).is_none());
        assert_eq!(rings.completed(q), PRODUCERS / nrings as u64 * EACH);
    }
}
