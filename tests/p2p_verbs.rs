//! The point-to-point engine's RDMA (verbs) transport, in one process: two
//! endpoints on the emulated runtime, talking over loopback TCP for their
//! control sockets and through `devcomm-gin`'s software model NIC for the
//! RDMA requests (no RDMA device exists on the project's machines; the
//! model executes each RDMA WRITE/READ on process memory, checking keys
//! and ranges as a NIC does). Covered: send/recv of odd sizes from host and
//! emulated device memory split into several work requests, sendv/recvv,
//! many async transfers in flight through a small send queue checked byte
//! for byte, one-sided writes and reads into advertised regions (and their
//! descriptors with an RDMA key), typed errors (a region too small, an
//! unregistered pointer, a message too large, a descriptor without a key,
//! a peer without RDMA), a peer that dies mid-transfer (completion error),
//! a NIC that stops completing (timeout), and the real libibverbs path
//! failing cleanly where there is no device.

use devcomm::p2p::{Endpoint, P2pConfig};
use devcomm::runtime::{Device, RuntimeSelection};
use devcomm::Error;
use std::time::Duration;

fn config() -> P2pConfig {
    P2pConfig::default().with_bind("127.0.0.1:0".parse().unwrap()).with_timeouts(Duration::from_secs(20))
}

/// Without a device (every project machine; without even libibverbs on
/// the development machines) or without the feature, asking for the verbs
/// transport is a clean error naming what is missing.
#[test]
fn verbs_without_a_device_is_a_clean_error() {
    let dev = Device::open(RuntimeSelection::Emulated, 0).unwrap();
    match Endpoint::with_config(&dev, config().with_verbs(true)) {
        Err(Error::InvalidUsage(m)) => {
            eprintln!("{m}");
            if cfg!(feature = "verbs") {
                assert!(
                    m.contains("p2p verbs") && (m.contains("libibverbs") || m.contains("RDMA")),
                    "unclear message: {m}"
                );
            } else {
                assert!(m.contains("cargo feature `verbs`"), "{m}");
            }
        }
        Err(e) => panic!("expected InvalidUsage, got {e:?}"),
        // A machine with an RDMA device: the endpoint is up (only possible with the feature).
        Ok(ep) if cfg!(feature = "verbs") => eprintln!("an RDMA device exists here: {ep:?}"),
        Ok(ep) => panic!("an endpoint with verbs asked for, built without the feature: {ep:?}"),
    }
}

#[cfg(feature = "verbs")]
mod model {
    use super::*;
    use devcomm::p2p::rdma_testing::{Fabric, Knobs, ModelNic, VerbsConfig};
    use devcomm::p2p::{Conn, ConnMetadata, Mr, P2pTransport};
    use devcomm::SymmetricMemory;
    use rand::{rngs::StdRng, Rng, SeedableRng};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    fn pattern(seed: u64, n: usize) -> Vec<u8> {
        let mut r = StdRng::seed_from_u64(seed);
        (0..n).map(|_| r.gen()).collect()
    }

    /// Two endpoints on model NICs of one fabric, connected: the client
    /// (initiator) and the server (receiver).
    struct Pair {
        fabric: Arc<Fabric>,
        dev: Device,
        client: Endpoint,
        server: Endpoint,
        conn: Conn,
        sconn: Conn,
        cknobs: Arc<Knobs>,
        sknobs: Arc<Knobs>,
    }

    fn pair(cfg: P2pConfig, depth: u32, max_msg: u64) -> Pair {
        let dev = Device::open(RuntimeSelection::Emulated, 0).unwrap();
        let fabric = Fabric::new();
        let cnic = ModelNic::new(&fabric, "model-c", depth, 0, 0).with_max_msg(max_msg);
        let snic = ModelNic::new(&fabric, "model-s", depth, 0, 0).with_max_msg(max_msg);
        let (cknobs, sknobs) = (cnic.knobs(), snic.knobs());
        let vc = VerbsConfig::default();
        let client = Endpoint::with_rdma_nic(&dev, cfg.clone(), Box::new(cnic), vc.clone()).unwrap();
        let server = Endpoint::with_rdma_nic(&dev, cfg, Box::new(snic), vc).unwrap();
        let (conn, sconn) = std::thread::scope(|s| {
            let acc = s.spawn(|| server.accept().unwrap().2);
            let conn = client.connect(server.addr(), 0).unwrap();
            (conn, acc.join().unwrap())
        });
        Pair { fabric, dev, client, server, conn, sconn, cknobs, sknobs }
    }

    fn writes(k: &Knobs) -> usize {
        k.log.lock().unwrap().len()
    }

    /// Host (`Vec`) or emulated device (`SymmetricMemory`) memory of `n` bytes, registered.
    enum Buf {
        Host(Vec<u8>),
        Device(SymmetricMemory),
    }

    impl Buf {
        fn new(dev: &Device, device: bool, n: usize, fill: &[u8]) -> Buf {
            if device {
                let m = SymmetricMemory::alloc(dev, n).unwrap();
                m.write(dev.stream(), 0, &vec![0xEEu8; n]).unwrap();
                m.write(dev.stream(), 0, fill).unwrap();
                Buf::Device(m)
            } else {
                let mut v = vec![0xEE; n];
                v[..fill.len()].copy_from_slice(fill);
                Buf::Host(v)
            }
        }
        fn addr(&self) -> u64 {
            match self {
                Buf::Host(v) => v.as_ptr() as u64,
                Buf::Device(m) => m.device_addr(),
            }
        }
        fn reg(&mut self, ep: &Endpoint) -> Mr {
            match self {
                // SAFETY: the vector outlives its region in every test (regions dropped first).
                Buf::Host(v) => unsafe { ep.reg(v.as_mut_ptr() as u64, v.len()) }.unwrap(),
                Buf::Device(m) => ep.reg_symmetric(m).unwrap(),
            }
        }
        fn bytes(&self, dev: &Device, at: usize, n: usize) -> Vec<u8> {
            match self {
                // SAFETY: in bounds; the NIC wrote through raw pointers: read volatile.
                Buf::Host(v) => (at..at + n).map(|i| unsafe { std::ptr::read_volatile(v.as_ptr().add(i)) }).collect(),
                Buf::Device(m) => {
                    let mut out = vec![0u8; n];
                    m.read(dev.stream(), at, &mut out).unwrap();
                    out
                }
            }
        }
    }

    #[test]
    fn send_recv_odd_sizes_from_host_and_device_memory() {
        let p = pair(config(), 16, 64 << 10);
        assert_eq!((p.conn.transport(), p.sconn.transport()), (P2pTransport::Verbs, P2pTransport::Verbs));
        assert_eq!(p.conn.rdma_device().as_deref(), Some("model-c"));
        assert_eq!(ConnMetadata::from_bytes(&p.conn.metadata()).unwrap().transport, P2pTransport::Verbs);
        const CAP: usize = (1 << 20) + 64;
        for (i, &n) in [1usize, 7, 4095, 4097, 100_003, (1 << 20) + 13, 0].iter().enumerate() {
            for (src_dev, dst_dev) in [(false, false), (true, true), (false, true), (true, false)] {
                let want = pattern(i as u64 * 10 + u64::from(src_dev) * 2 + u64::from(dst_dev), n);
                let mut src = Buf::new(&p.dev, src_dev, n.max(1), &want);
                let mut dst = Buf::new(&p.dev, dst_dev, CAP, &[]);
                let (smr, dmr) = (src.reg(&p.client), dst.reg(&p.server));
                let before = writes(&p.cknobs);
                let id = p.server.recv_async(&p.sconn, &dmr, dst.addr(), CAP).unwrap();
                p.client.send(&p.conn, &smr, src.addr(), n).unwrap();
                assert_eq!(p.server.wait_async(id).unwrap(), n, "{n} bytes");
                // Through the NIC: ceil(n / 64 KiB) writes and a flush read.
                let wrs = writes(&p.cknobs) - before;
                assert_eq!(wrs, if n == 0 { 0 } else { n.div_ceil(64 << 10) + 1 }, "{n} bytes");
                drop((smr, dmr));
                assert_eq!(dst.bytes(&p.dev, 0, n), want, "{n} bytes, device {src_dev} -> {dst_dev}");
                if n < CAP {
                    assert_eq!(dst.bytes(&p.dev, n, 1), [0xEE], "past the message");
                }
            }
        }
        // Nothing took the data sockets.
        assert!(p.conn.error().is_none() && p.sconn.error().is_none());
    }

    #[test]
    fn sendv_recvv_and_many_async_in_flight() {
        let p = pair(config(), 8, 4096);
        let n = 40;
        let sizes: Vec<usize> = (0..n).map(|i| 1 + (i * 7919) % 20_000).collect();
        let total: usize = sizes.iter().sum();
        let src_bytes = pattern(99, total);
        let mut src = Buf::new(&p.dev, true, total, &src_bytes);
        let mut dst = Buf::new(&p.dev, false, total + 64 * n, &[]);
        let (smr, dmr) = (src.reg(&p.client), dst.reg(&p.server));
        // Vectored: each part its own message, in order.
        let mut off = 0;
        let mut sparts = Vec::new();
        let mut rparts = Vec::new();
        for (i, &s) in sizes.iter().enumerate().take(5) {
            sparts.push((&smr, src.addr() + off as u64, s));
            rparts.push((&dmr, dst.addr() + (off + 64 * i) as u64, s + 64));
            off += s;
        }
        let got = std::thread::scope(|sc| {
            let r = sc.spawn(|| p.server.recvv(&p.sconn, &rparts).unwrap());
            p.client.sendv(&p.conn, &sparts).unwrap();
            r.join().unwrap()
        });
        assert_eq!(got, sizes[..5]);
        // Many at once: every receive posted, every send started, then waited for.
        let mut rids = Vec::new();
        let mut at = Vec::new();
        let mut off = 0;
        for (i, &s) in sizes.iter().enumerate() {
            let d = (off + 64 * i) as u64;
            rids.push(p.server.recv_async(&p.sconn, &dmr, dst.addr() + d, s + 64).unwrap());
            at.push((off, d as usize, s));
            off += s;
        }
        let sids: Vec<_> =
            at.iter().map(|&(o, _, s)| p.client.send_async(&p.conn, &smr, src.addr() + o as u64, s).unwrap()).collect();
        for (id, &(_, _, s)) in sids.into_iter().zip(&at) {
            assert_eq!(p.client.wait_async(id).unwrap(), s);
        }
        for (id, &(_, _, s)) in rids.into_iter().zip(&at) {
            assert_eq!(p.server.wait_async(id).unwrap(), s);
        }
        // More requests than the send queue holds were posted (4 KiB each).
        assert!(writes(&p.cknobs) > 8 * 10);
        drop((smr, dmr));
        for &(o, d, s) in &at {
            assert_eq!(dst.bytes(&p.dev, d, s), &src_bytes[o..o + s], "message at {o}");
        }
    }

    #[test]
    fn one_sided_writes_and_reads_into_advertised_regions() {
        let p = pair(config(), 8, 8192);
        let n = 50_001;
        let want = pattern(5, n);
        let mut src = Buf::new(&p.dev, true, n, &want);
        let mut back = Buf::new(&p.dev, false, n, &[]);
        let mut target = Buf::new(&p.dev, true, 2 * n, &[]);
        let (smr, bmr, tmr) = (src.reg(&p.client), back.reg(&p.client), target.reg(&p.server));
        let region = p.server.advertise(&tmr, target.addr() + 100, n + 50).unwrap();
        // The descriptor carries the RDMA key and survives shipping.
        let bytes = region.to_bytes();
        assert_eq!(bytes.len(), 56);
        let region = devcomm::p2p::RemoteRegion::from_bytes(&bytes).unwrap();
        assert!(region.rkey().is_some());
        // Async writes of disjoint pieces, all in flight at once.
        let pieces: Vec<(usize, usize)> =
            (0..20).map(|i| (i * 2500, if i == 19 { n - 19 * 2500 } else { 2500 })).collect();
        let ids: Vec<_> = pieces
            .iter()
            .map(|&(o, l)| p.client.write_async(&p.conn, &smr, src.addr() + o as u64, l, &region, o + 50).unwrap())
            .collect();
        for (id, &(_, l)) in ids.into_iter().zip(&pieces) {
            assert_eq!(p.client.wait_async(id).unwrap(), l);
        }
        assert_eq!(target.bytes(&p.dev, 150, n), want);
        // Read it back, in two reads.
        p.client.read(&p.conn, &bmr, back.addr(), 1000, &region, 50).unwrap();
        p.client.read(&p.conn, &bmr, back.addr() + 1000, n - 1000, &region, 1050).unwrap();
        assert_eq!(back.bytes(&p.dev, 0, n), want);

        // Typed errors, before anything moves.
        let before = writes(&p.cknobs);
        let e = p.client.write(&p.conn, &smr, src.addr(), 100, &region, n).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("do not fit")), "{e:?}");
        let e = p.client.send(&p.conn, &smr, src.addr() + 1, n).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("not inside")), "{e:?}");
        let e = p.client.read(&p.conn, &bmr, back.addr() + n as u64, 1, &region, 0).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("not inside")), "{e:?}");
        // The 48-byte form (no key) cannot address an RDMA peer.
        let mut legacy = bytes[..48].to_vec();
        legacy[7] = 0;
        let keyless = devcomm::p2p::RemoteRegion::from_bytes(&legacy).unwrap();
        let e = p.client.write(&p.conn, &smr, src.addr(), 10, &keyless, 0).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("no RDMA key")), "{e:?}");
        assert_eq!(writes(&p.cknobs), before, "a refused transfer posted requests");
        // A message too large for the receive: both sides told, the connection stays.
        let id = p.server.recv_async(&p.sconn, &tmr, target.addr(), 10).unwrap();
        let e = p.client.send(&p.conn, &smr, src.addr(), 11).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("larger")), "{e:?}");
        assert!(matches!(p.server.wait_async(id), Err(Error::InvalidArgument(_))));
        p.client.write(&p.conn, &smr, src.addr(), 10, &region, 0).unwrap();
        // The region deregistered at the target: the NIC refuses the key
        // (remote access error), which fails the connection, typed.
        drop(tmr);
        let e = p.client.write(&p.conn, &smr, src.addr(), 10, &region, 0).unwrap_err();
        assert!(matches!(&e, Error::RemoteError(m) if m.contains("remote access error")), "{e:?}");
        assert!(matches!(p.conn.error(), Some(Error::RemoteError(_))));
        let e = p.client.write(&p.conn, &smr, src.addr(), 10, &region, 0).unwrap_err();
        assert!(matches!(e, Error::RemoteError(_)), "{e:?}");
        drop((smr, bmr));
        let _ = (&p.server, &p.sknobs, &p.fabric);
    }

    #[test]
    fn a_peer_that_dies_mid_transfer_fails_the_connection_typed() {
        let p = pair(config(), 8, 4096);
        let n = 200_000;
        let mut src = Buf::new(&p.dev, false, n, &pattern(1, n));
        let mut dst = Buf::new(&p.dev, true, n, &[]);
        let (smr, dmr) = (src.reg(&p.client), dst.reg(&p.server));
        let id = p.server.recv_async(&p.sconn, &dmr, dst.addr(), n).unwrap();
        p.client.send(&p.conn, &smr, src.addr(), n).unwrap();
        p.server.wait_async(id).unwrap();
        // The server's host dies (its control socket stays open: only the
        // NIC can tell): the sender's requests are not answered.
        let _rid = p.server.recv_async(&p.sconn, &dmr, dst.addr(), n).unwrap();
        p.fabric.kill(&p.sknobs);
        let t = Instant::now();
        let e = p.client.send(&p.conn, &smr, src.addr(), n).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
        assert!(matches!(&e, Error::RemoteError(m) if m.contains("completion error") && m.contains("retry")), "{e:?}");
        assert!(matches!(p.conn.error(), Some(Error::RemoteError(_))));
        // Later transfers are refused at once; regions drop without waiting.
        let e = p.client.write(&p.conn, &smr, src.addr(), 1, &p.server.advertise(&dmr, dst.addr(), 1).unwrap(), 0);
        assert!(matches!(e, Err(Error::RemoteError(_))), "{e:?}");
        drop((smr, dmr));
    }

    #[test]
    fn a_nic_that_stops_completing_times_out_and_fails_the_connection() {
        let p = pair(config().with_timeouts(Duration::from_secs(1)), 8, 4096);
        let n = 10_000;
        let mut src = Buf::new(&p.dev, false, n, &pattern(2, n));
        let mut dst = Buf::new(&p.dev, false, n, &[]);
        let (smr, dmr) = (src.reg(&p.client), dst.reg(&p.server));
        let region = p.server.advertise(&dmr, dst.addr(), n).unwrap();
        p.cknobs.per_poll.store(0, Ordering::SeqCst);
        let t = Instant::now();
        let e = p.client.write(&p.conn, &smr, src.addr(), n, &region, 0).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(p.conn.error().is_some());
        // The regions' drops do not wait for the dead requests.
        drop((smr, dmr));
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_peer_without_rdma_is_refused_typed_both_ways() {
        let dev = Device::open(RuntimeSelection::Emulated, 0).unwrap();
        let fabric = Fabric::new();
        let nic = ModelNic::new(&fabric, "model", 8, 0, 0);
        let rdma = Endpoint::with_rdma_nic(&dev, config(), Box::new(nic), VerbsConfig::default()).unwrap();
        let plain = Endpoint::with_config(&dev, config()).unwrap();
        for (from, to) in [(&rdma, &plain), (&plain, &rdma)] {
            let e = from.connect(to.addr(), 0).unwrap_err();
            assert!(matches!(&e, Error::InvalidUsage(m) if m.contains("RDMA (verbs)")), "{e:?}");
        }
        let t = Instant::now();
        while plain.rejections().is_empty() || rdma.rejections().is_empty() {
            assert!(t.elapsed() < Duration::from_secs(10), "the refusals were not recorded");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
