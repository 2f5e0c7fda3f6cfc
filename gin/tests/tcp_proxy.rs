//! Proxies over the TCP transport, N ranks as threads of this process.

mod common;

use common::{FakeBootstrap, FakeMemory, HostGin, RingFailed, PATIENCE};
use devcomm_gin::descriptor::{encode, Request};
use devcomm_gin::{GinDescriptor, GinHostError, Landing, LocalMemory, Proxy, TcpConfig, TcpTransport};
use std::sync::Arc;
use std::time::Instant;

struct Rank {
    proxy: Option<Proxy>,
    mem: Arc<FakeMemory>,
    // Declared after `proxy`: dropped after the proxy has stopped.
    gin: Box<HostGin>,
}

/// `n` connected ranks, each with its own proxy.
fn ranks(n: usize, contexts: u32, depth: u32, windows: &[usize], signals: u32, counters: u32) -> Vec<Rank> {
    let boot = FakeBootstrap::new(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let boot = &boot;
                s.spawn(move || {
                    let gin = HostGin::new(contexts, n as u32, depth, signals, counters);
                    let mem = Arc::new(FakeMemory::new(windows));
                    let local: Arc<dyn LocalMemory> = mem.clone();
                    let hm = gin.mem();
                    // SAFETY: `gin` outlives the transport and the proxy (Rank's field order).
                    let landing = unsafe { Landing::new(local.clone(), hm.signals, hm.total_signals) };
                    let t = TcpTransport::connect(&boot.rank(r), landing, &TcpConfig::default()).unwrap();
                    // SAFETY: as above.
                    let proxy = unsafe { Proxy::start(hm, local, Box::new(t), r) }.unwrap();
                    Rank { proxy: Some(proxy), mem, gin }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn stop_all(ranks: Vec<Rank>) {
    for mut r in ranks {
        r.proxy.take().unwrap().stop().unwrap();
    }
}

fn put(
    peer: usize,
    src: (u32, u64),
    dst: (u32, u64),
    bytes: u64,
    remote: Option<(u32, u64)>,
    local: Option<u32>,
) -> GinDescriptor {
    encode(&Request::Put {
        peer: peer as u32,
        src_window: src.0,
        src_offset: src.1,
        dst_window: dst.0,
        dst_offset: dst.1,
        bytes,
        remote,
        local,
    })
}

fn pattern(src: usize, dst: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + src * 31 + dst * 131) as u8).collect()
}

/// Every rank sends every rank (itself included): a 4 KiB put with SignalInc,
/// an inline put with SignalAdd, a bare signal; all with CounterInc. The
/// receivers wait for each signal, then check the data.
fn all_ops(n: usize) {
    const LEN: usize = 4096;
    // window 0: sources (n * LEN), window 1: put targets (n * LEN), window 2: inline targets (n * 8)
    // signals: [0, n) puts, [n, 2n) inline, [2n, 3n) bare; counter 0
    let ranks = ranks(n, 2, 4, &[n * LEN, n * LEN, n * 8], 3 * n as u32, 1);
    for (r, rank) in ranks.iter().enumerate() {
        for p in 0..n {
            rank.mem.write(0, p * LEN, &pattern(r, p, LEN));
        }
    }
    std::thread::scope(|s| {
        for (r, rank) in ranks.iter().enumerate() {
            s.spawn(move || {
                for p in 0..n {
                    let ring = rank.gin.ring((p % 2) as u32, p as u32);
                    let g = &rank.gin;
                    let l = LEN as u64;
                    g.post(ring, &put(p, (0, p as u64 * l), (1, r as u64 * l), l, Some((r as u32, 1)), Some(0)))
                        .unwrap();
                    let v = encode(&Request::PutValue {
                        peer: p as u32,
                        dst_window: 2,
                        dst_offset: r as u64 * 8,
                        payload: (0xab00 + r as u64 * 16 + p as u64).to_le_bytes(),
                        len: 8,
                        remote: Some(((n + r) as u32, 5)),
                        local: Some(0),
                    });
                    g.post(ring, &v).unwrap();
                    let sig = Request::Signal { peer: p as u32, remote: Some(((2 * n + r) as u32, 7)), local: Some(0) };
                    g.post(ring, &encode(&sig)).unwrap();
                }
                // Flush: every ring completed up to its head.
                for c in 0..2 {
                    for p in 0..n {
                        rank.gin.flush(rank.gin.ring(c, p as u32)).unwrap();
                    }
                }
                assert_eq!(rank.gin.counter(0), 3 * n as u64);
            });
            s.spawn(move || {
                for src in 0..n {
                    rank.gin.wait_signal(src, 1);
                    assert_eq!(rank.mem.read(1, src * LEN, LEN), pattern(src, r, LEN), "put {src} -> {r}");
                    rank.gin.wait_signal(n + src, 5);
                    assert_eq!(rank.mem.read_u64(2, src), 0xab00 + src as u64 * 16 + r as u64);
                    rank.gin.wait_signal(2 * n + src, 7);
                }
            });
        }
    });
    for rank in &ranks {
        for src in 0..n {
            assert_eq!((rank.gin.signal(src), rank.gin.signal(n + src), rank.gin.signal(2 * n + src)), (1, 5, 7));
        }
        assert!(rank.proxy.as_ref().unwrap().error().is_none());
    }
    stop_all(ranks);
}

#[test]
fn all_ops_2_ranks() {
    all_ops(2);
}

#[test]
fn all_ops_3_ranks() {
    all_ops(3);
}

#[test]
fn all_ops_4_ranks() {
    all_ops(4);
}

#[test]
fn all_ops_8_ranks() {
    all_ops(8);
}

/// Depth-2 rings, 8 producer threads per rank, each appending sequence
/// numbers (inline puts, each with a SignalInc) to its own log on every
/// other rank over 2 contexts. The receiver checks, whenever a signal reads
/// k, that entries 0..k are all there: nothing lost, data before signal,
/// order kept per (context, peer).
#[test]
fn depth_two_eight_producers_keep_order() {
    const N: usize = 3;
    const T: usize = 8;
    const EACH: usize = 1500;
    let log = |src: usize, t: usize| (src * T + t) * EACH;
    let ranks = ranks(N, 2, 2, &[N * T * EACH * 8], (N * T) as u32, 1);
    let start = Instant::now();
    std::thread::scope(|s| {
        for (r, rank) in ranks.iter().enumerate() {
            for t in 0..T {
                s.spawn(move || {
                    for seq in 0..EACH {
                        for p in (0..N).filter(|&p| p != r) {
                            let d = encode(&Request::PutValue {
                                peer: p as u32,
                                dst_window: 0,
                                dst_offset: ((log(r, t) + seq) * 8) as u64,
                                payload: (seq as u64 + 1).to_le_bytes(),
                                len: 8,
                                remote: Some(((r * T + t) as u32, 1)),
                                local: Some(0),
                            });
                            rank.gin.post(rank.gin.ring((t % 2) as u32, p as u32), &d).unwrap();
                        }
                    }
                });
            }
            s.spawn(move || {
                let mut checked = vec![0usize; N * T];
                loop {
                    let mut all = true;
                    for src in (0..N).filter(|&p| p != r) {
                        for t in 0..T {
                            let k = rank.gin.signal(src * T + t) as usize;
                            let c = &mut checked[src * T + t];
                            while *c < k {
                                assert_eq!(rank.mem.read_u64(0, log(src, t) + *c), *c as u64 + 1, "{src}/{t} -> {r}");
                                *c += 1;
                            }
                            all &= k == EACH;
                        }
                    }
                    if all {
                        break;
                    }
                    assert!(start.elapsed() < PATIENCE, "stuck: {checked:?}");
                    std::thread::yield_now();
                }
            });
        }
    });
    for rank in &ranks {
        assert_eq!(rank.gin.counter(0), ((N - 1) * T * EACH) as u64);
    }
    stop_all(ranks);
}

/// A put larger than the proxy's chunk and the receiver's piece.
#[test]
fn large_put() {
    const LEN: usize = 9 << 20;
    let ranks = ranks(2, 1, 2, &[LEN], 1, 0);
    let data = pattern(0, 1, LEN);
    ranks[0].mem.write(0, 0, &data);
    ranks[0].gin.post(ranks[0].gin.ring(0, 1), &put(1, (0, 0), (0, 0), LEN as u64, Some((0, 1)), None)).unwrap();
    ranks[1].gin.wait_signal(0, 1);
    assert!(ranks[1].mem.read(0, 0, LEN) == data);
    stop_all(ranks);
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < PATIENCE, "waited too long for {what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Malformed descriptors fail their ring only; a put the destination
/// rejects fails the connection between the two ranks (both sides see it).
#[test]
fn invalid_requests() {
    let ranks = ranks(3, 1, 2, &[64], 2, 1);
    let g0 = &ranks[0].gin;
    let p0 = ranks[0].proxy.as_ref().unwrap();
    // Bad op on the ring to rank 1.
    g0.post(g0.ring(0, 1), &GinDescriptor { op: 9, peer: 1, ..Default::default() }).unwrap();
    wait_for("ring failure", || g0.failed(g0.ring(0, 1)));
    assert!(matches!(p0.error(), Some(GinHostError::Invalid(_))));
    assert_eq!(g0.flush(g0.ring(0, 1)), Err(RingFailed));
    // Source range past the window, to itself.
    g0.post(g0.ring(0, 0), &put(0, (0, 60), (0, 0), 8, None, None)).unwrap();
    wait_for("ring failure", || g0.failed(g0.ring(0, 0)));
    // The ring to rank 2 still works.
    g0.post(g0.ring(0, 2), &put(2, (0, 0), (0, 0), 8, Some((0, 1)), Some(0))).unwrap();
    ranks[2].gin.wait_signal(0, 1);
    // A destination offset rank 2 rejects: the 0-2 connection fails on both sides.
    g0.post(g0.ring(0, 2), &put(2, (0, 0), (0, 60), 8, Some((1, 1)), None)).unwrap();
    wait_for("peer failure", || g0.failed(g0.ring(0, 2)));
    let g2 = &ranks[2].gin;
    wait_for("peer failure", || g2.failed(g2.ring(0, 0)));
    assert!(ranks[2].proxy.as_ref().unwrap().error().is_some());
    assert_eq!(g2.signal(1), 0);
    assert!(!ranks[1].gin.failed(ranks[1].gin.ring(0, 2)));
    for mut r in ranks {
        let _ = r.proxy.take().unwrap().stop();
    }
}

/// A rank that dies (its proxy aborts: connections cut without goodbye):
/// the others' rings toward it fail, their proxies report `Remote`, and
/// producers and flushes toward it return instead of hanging.
#[test]
fn killed_peer() {
    let mut ranks = ranks(3, 2, 2, &[64], 3, 1);
    ranks[2].proxy.take().unwrap().abort().unwrap();
    for r in 0..2 {
        let g = &ranks[r].gin;
        wait_for("rings toward the dead rank", || g.failed(g.ring(0, 2)) && g.failed(g.ring(1, 2)));
        assert!(matches!(ranks[r].proxy.as_ref().unwrap().error(), Some(GinHostError::Remote(_))));
        // Posting toward it gives up (possibly after filling the ring's slots).
        let d = put(2, (0, 0), (0, 0), 8, Some((0, 1)), None);
        let mut res = Ok(0);
        for _ in 0..3 {
            res = g.post(g.ring(0, 2), &d);
        }
        assert_eq!(res, Err(RingFailed));
        assert_eq!(g.flush(g.ring(0, 2)), Err(RingFailed));
        // The survivors still talk to each other.
        let other = 1 - r;
        g.post(g.ring(1, other as u32), &put(other, (0, 0), (0, 8), 8, Some((r as u32, 1)), None)).unwrap();
        ranks[other].gin.wait_signal(r, 1);
    }
    // The dead rank's own rings were failed by the abort.
    assert!(ranks[2].gin.failed(ranks[2].gin.ring(0, 0)));
    for mut r in ranks.into_iter().take(2) {
        assert!(matches!(r.proxy.take().unwrap().stop(), Err(GinHostError::Remote(_))));
    }
}
