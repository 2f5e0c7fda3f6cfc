//! The point-to-point engine (`devcomm::p2p`) between processes of one
//! host, over both transports (same-host IPC with the copy engine, and TCP
//! forced with `DEVCOMM_P2P_TRANSPORT=tcp`): every API call with device,
//! shareable and host memory, vectored transfers of odd sizes, many async
//! transfers in flight checked byte for byte, one-sided writes and reads,
//! typed errors (message too large, unregistered pointers, wrong
//! direction, closed connection, a deregistered remote region), a peer
//! killed mid-transfer (either side), and garbage on the listening port.
//! Same-host connections use the shared-memory control path unless
//! `DEVCOMM_P2P_CONTROL=tcp`: many small messages in a row and in flight
//! over it, its peer killed or its endpoint dropped mid-stream, and its
//! negotiation.
//!
//! Rank 0 serves (accepts), rank 1 connects; they find each other's ports
//! and descriptors through files in a directory the parent makes.

mod common;

use common::{child_job, is_child, run_on_runtime_without_kernels, runtime};
use devcomm::p2p::{ConnMetadata, ControlPath, ControlStats, Endpoint, Mr, P2pConfig, P2pTransport, RemoteRegion};
use devcomm::runtime::{Device, RuntimeSelection};
use devcomm::{DeviceBuffer, Error, SymmetricMemory};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const DIR_ENV: &str = "P2P_TEST_DIR";
const POISON: u8 = 0xEE;

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen()).collect()
}

fn dir() -> PathBuf {
    PathBuf::from(std::env::var(DIR_ENV).expect(DIR_ENV))
}

fn put(name: &str, bytes: &[u8]) {
    let tmp = dir().join(format!("{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(tmp, dir().join(name)).unwrap();
}

fn get(name: &str) -> Vec<u8> {
    let t = Instant::now();
    loop {
        if let Ok(b) = std::fs::read(dir().join(name)) {
            return b;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{name} never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn new_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("devcomm-p2p-{tag}-{}-{}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rank() -> usize {
    std::env::var("RANK").unwrap().parse().unwrap()
}

/// The device of rank `r` (on CUDA, ranks share the GPUs there are).
fn device_of(r: usize) -> Device {
    let sel = RuntimeSelection::from_env().unwrap();
    let n = devcomm::runtime::device_count(sel).unwrap().1;
    Device::open(sel, r % n).unwrap()
}

fn config() -> P2pConfig {
    let mut c = P2pConfig::from_env()
        .unwrap()
        .with_bind("127.0.0.1:0".parse().unwrap())
        .with_timeouts(Duration::from_secs(30))
        .with_threads(3);
    c.chunk_bytes = 64 << 10;
    c
}

fn forced_tcp() -> bool {
    std::env::var("DEVCOMM_P2P_TRANSPORT").is_ok_and(|v| v == "tcp")
}

/// The control path connections of this test get.
fn control_path() -> ControlPath {
    if forced_tcp() || std::env::var("DEVCOMM_P2P_CONTROL").is_ok_and(|v| v == "tcp") {
        ControlPath::Tcp
    } else {
        ControlPath::SharedMemory
    }
}

/// The three kinds of memory a test registers: shareable (SymmetricMemory),
/// plain device memory (not shareable: over TCP even on one host), host memory.
struct Mem {
    // The regions first: fields drop in order, so they are deregistered
    // before the memory they name is freed.
    sym_mr: Mr,
    dev_mr: Mr,
    host_mr: Mr,
    dev: Device,
    sym: SymmetricMemory,
    dbuf: DeviceBuffer<u8>,
    host: Vec<u8>,
}

const SYM: usize = 2 << 20;
const DBUF: usize = 1 << 20;
const HOST: usize = 1 << 20;

impl Mem {
    fn new(ep: &Endpoint) -> Mem {
        let dev = ep.device().clone();
        let sym = SymmetricMemory::alloc(&dev, SYM).unwrap();
        sym.write(dev.stream(), 0, &vec![POISON; SYM]).unwrap();
        let dbuf = dev.alloc_from(&vec![POISON; DBUF]).unwrap();
        let mut host = vec![POISON; HOST];
        let sym_mr = ep.reg_symmetric(&sym).unwrap();
        assert!(sym_mr.is_shareable() && !sym_mr.is_host());
        // SAFETY: the buffer outlives the region (`Mem`'s fields drop in order, the regions first).
        let dev_mr = unsafe { ep.reg(dbuf.device_addr(), DBUF) }.unwrap();
        assert!(!dev_mr.is_shareable());
        // SAFETY: as above; `host` is never moved or resized while registered.
        let host_mr = unsafe { ep.reg(host.as_mut_ptr() as u64, HOST) }.unwrap();
        assert!(!host_mr.is_shareable());
        Mem { sym_mr, dev_mr, host_mr, dev, sym, dbuf, host }
    }

    /// (region, address) of byte `off` of memory kind `k` (0 shareable, 1 device, 2 host).
    fn at(&self, k: usize, off: usize) -> (&Mr, u64) {
        match k {
            0 => (&self.sym_mr, self.sym.device_addr() + off as u64),
            1 => (&self.dev_mr, self.dbuf.device_addr() + off as u64),
            _ => (&self.host_mr, self.host.as_ptr() as u64 + off as u64),
        }
    }

    fn fill(&mut self, k: usize, off: usize, data: &[u8]) {
        match k {
            0 => self.sym.write(self.dev.stream(), off, data).unwrap(),
            1 => {
                let mut all = self.dev.stream().read_vec(&self.dbuf).unwrap();
                all[off..off + data.len()].copy_from_slice(data);
                self.dev.stream().write(&mut self.dbuf, &all).unwrap();
            }
            _ => self.host[off..off + data.len()].copy_from_slice(data),
        }
    }

    fn bytes(&self, k: usize, off: usize, n: usize) -> Vec<u8> {
        match k {
            0 => {
                let mut v = vec![0u8; n];
                self.sym.read(self.dev.stream(), off, &mut v).unwrap();
                v
            }
            1 => self.dev.stream().read_vec(&self.dbuf).unwrap()[off..off + n].to_vec(),
            // SAFETY: no transfer into the host buffer is in flight when a test reads it;
            // read through a volatile copy since the engine wrote it behind the compiler's back.
            _ => (0..n).map(|i| unsafe { std::ptr::read_volatile(self.host.as_ptr().add(off + i)) }).collect(),
        }
    }
}

fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: byte {i} of {} is {:#04x}, expected {:#04x}", want.len(), got[i], want[i]);
    }
}

fn port_of(ep: &Endpoint) -> Vec<u8> {
    ep.addr().port().to_le_bytes().to_vec()
}

fn peer_port(r: usize) -> u16 {
    let b = get(&format!("port{r}"));
    u16::from_le_bytes([b[0], b[1]])
}

/// Rank 0: accepts, receives, advertises, checks.
fn every_call_server(ep: &Endpoint) {
    let client_gpu = device_of(1).ordinal();
    let (peer, gpu, conn) = ep.accept().unwrap();
    assert_eq!(gpu, client_gpu);
    assert!(!conn.is_initiator());
    assert_eq!(peer.ip(), std::net::IpAddr::from([127, 0, 0, 1]));
    let want = if forced_tcp() { P2pTransport::Tcp } else { P2pTransport::Ipc };
    assert_eq!(conn.transport(), want);
    assert_eq!(conn.control_path(), control_path());
    let meta = ConnMetadata::from_bytes(&conn.metadata()).unwrap();
    assert_eq!(
        (meta.id, meta.initiator, meta.remote_gpu, meta.transport, meta.threads),
        (conn.id(), false, gpu, want, 3)
    );
    assert_eq!(meta.peer_addr, conn.peer_addr());
    // The other direction: this side connects to the client.
    let client = ("127.0.0.1", peer_port(1));
    assert!(matches!(ep.connect(client, client_gpu + 7), Err(Error::InvalidArgument(m)) if m.contains("serves GPU")));
    let back = ep.connect(client, client_gpu).unwrap();
    assert!(back.is_initiator());
    let mut m = Mem::new(ep);

    // A. Two-sided between every kind of memory: (size, our kind, offset).
    for (i, &(n, k, off)) in
        [(1_000_003usize, 0usize, 5usize), (333_333, 1, 3), (77_777, 0, 1_200_000), (123_457, 2, 11)].iter().enumerate()
    {
        let (mr, p) = m.at(k, off);
        let got = ep.recv(&conn, mr, p, n + 100_000).unwrap();
        assert_eq!(got, n, "message {i}");
        assert_bytes(&format!("message {i}"), &m.bytes(k, off, n), &pattern(i as u64, n));
        assert_eq!(m.bytes(k, off + n, 1)[0], POISON, "message {i} overran");
    }

    // B. Vectored, odd sizes (one empty), into all three kinds.
    let sizes = [1usize, 4097, 0, 65_537, 200_003, 13];
    let slots: Vec<(usize, usize)> =
        sizes.iter().enumerate().map(|(i, _)| (i % 3, 300_000 + i * 210_000 % 600_000)).collect();
    let parts: Vec<(&Mr, u64, usize)> = slots
        .iter()
        .zip(sizes)
        .map(|(&(k, off), n)| {
            let (mr, p) = m.at(k, off);
            (mr, p, n + 17)
        })
        .collect();
    assert_eq!(ep.recvv(&conn, &parts).unwrap(), sizes.to_vec());
    for (i, (&(k, off), n)) in slots.iter().zip(sizes).enumerate() {
        assert_bytes(&format!("recvv part {i}"), &m.bytes(k, off, n), &pattern(100 + i as u64, n));
    }

    // C. A message larger than the receive region fails both sides; the connection stays usable.
    let (mr, p) = m.at(0, 0);
    assert!(matches!(ep.recv(&conn, mr, p, 1000), Err(Error::InvalidArgument(m)) if m.contains("larger")));
    assert_eq!(ep.recv(&conn, mr, p, 1000).unwrap(), 999);
    assert_bytes("after too large", &m.bytes(0, 0, 999), &pattern(200, 999));

    // D. Many receives in flight, polled, each checked byte for byte.
    let count = 48;
    let size = |i: usize| (i * 7919 + 13) % 40_000 + 1;
    let slot = |i: usize| if i % 3 == 0 { (1, (i / 3) * 40_064) } else { (0, i * 40_064) };
    let ids: Vec<_> = (0..count)
        .map(|i| {
            let (k, off) = slot(i);
            let (mr, p) = m.at(k, off);
            ep.recv_async(&conn, mr, p, 40_000).unwrap()
        })
        .collect();
    let mut done = vec![None; count];
    let t = Instant::now();
    while done.iter().any(Option::is_none) {
        for (i, id) in ids.iter().enumerate() {
            if done[i].is_none() {
                done[i] = ep.poll_async(*id).unwrap();
            }
        }
        assert!(t.elapsed() < Duration::from_secs(60), "async receives did not finish");
    }
    assert!(matches!(ep.poll_async(ids[0]), Err(Error::InvalidArgument(_))), "a reported transfer is forgotten");
    for (i, d) in done.iter().enumerate() {
        assert_eq!(*d, Some(size(i)), "async receive {i}");
        let (k, off) = slot(i);
        assert_bytes(&format!("async receive {i}"), &m.bytes(k, off, size(i)), &pattern(1000 + i as u64, size(i)));
    }

    // E. One-sided: advertise two spans (shareable, plain device) and one that goes away.
    let (sym_off, sym_len, dev_off, dev_len) = (4096usize, 300_000usize, 100usize, 200_000usize);
    m.fill(0, sym_off, &pattern(70, sym_len));
    m.fill(1, dev_off, &pattern(71, dev_len));
    let r_sym = ep.advertise(&m.sym_mr, m.at(0, sym_off).1, sym_len).unwrap();
    let r_dev = ep.advertise(&m.dev_mr, m.at(1, dev_off).1, dev_len).unwrap();
    assert!(matches!(ep.advertise(&m.dev_mr, m.at(1, DBUF - 10).1, 11), Err(Error::InvalidArgument(_))));
    let gone = SymmetricMemory::alloc(ep.device(), 4096).unwrap();
    let gone_mr = ep.reg_symmetric(&gone).unwrap();
    let r_gone = ep.advertise(&gone_mr, gone.device_addr(), 4096).unwrap();
    ep.dereg(gone_mr);
    put("r_sym", &r_sym.to_bytes());
    put("r_dev", &r_dev.to_bytes());
    put("r_gone", &r_gone.to_bytes());
    put("secret", &m.host_mr.id().to_le_bytes());
    // The client writes, reads, then tells us with a one-byte message.
    let (mr, p) = m.at(2, 0);
    assert_eq!(ep.recv(&conn, mr, p, 8).unwrap(), 1);
    let mut want = pattern(70, sym_len);
    want[7..7 + 250_001].copy_from_slice(&pattern(80, 250_001));
    assert_bytes("written shareable span", &m.bytes(0, sym_off, sym_len), &want);
    let mut want = pattern(71, dev_len);
    want[1..1 + 199_999].copy_from_slice(&pattern(81, 199_999));
    assert_bytes("written device span", &m.bytes(1, dev_off, dev_len), &want);

    // F. Unregistered pointers and the wrong direction.
    let (mr, p) = m.at(0, SYM - 10);
    assert!(matches!(ep.recv(&conn, mr, p, 11), Err(Error::InvalidArgument(m)) if m.contains("not inside")));
    assert!(matches!(ep.recv(&conn, mr, 0x1000, 10), Err(Error::InvalidArgument(_))));
    assert!(matches!(ep.send(&conn, mr, p, 10), Err(Error::InvalidUsage(m)) if m.contains("connect from")));
    assert!(matches!(ep.recv(&back, mr, p, 10), Err(Error::InvalidUsage(_))));

    // G. The other direction.
    let n = 54_321;
    m.fill(0, 0, &pattern(300, n));
    let (mr, p) = m.at(0, 0);
    ep.send(&back, mr, p, n).unwrap();

    // H. The client closes its connection: our receive fails, typed.
    let (mr, p) = m.at(0, 0);
    let e = ep.recv(&conn, mr, p, 100).unwrap_err();
    assert!(matches!(e, Error::RemoteError(ref m) if m.contains("closed")), "{e:?}");
    assert!(conn.error().is_some());
    put("server-done", b"1");
    get("client-done");
}

/// Rank 1: connects, sends, writes and reads one-sidedly.
fn every_call_client(ep: &Endpoint) {
    let server_gpu = device_of(0).ordinal();
    let server = ("127.0.0.1", peer_port(0));
    let conn = ep.connect(server, server_gpu).unwrap();
    assert!(conn.is_initiator());
    let want = if forced_tcp() { P2pTransport::Tcp } else { P2pTransport::Ipc };
    assert_eq!(conn.transport(), want);
    assert_eq!(conn.control_path(), control_path());
    assert_eq!(conn.remote_gpu(), server_gpu);
    let (_, _, back) = ep.accept().unwrap();
    let mut m = Mem::new(ep);

    // A. (size, our kind, offset).
    for (i, &(n, k, off)) in
        [(1_000_003usize, 0usize, 1usize), (333_333, 1, 17), (77_777, 2, 999), (123_457, 0, 1_500_000)]
            .iter()
            .enumerate()
    {
        m.fill(k, off, &pattern(i as u64, n));
        let (mr, p) = m.at(k, off);
        ep.send(&conn, mr, p, n).unwrap();
    }

    // B. Vectored.
    let sizes = [1usize, 4097, 0, 65_537, 200_003, 13];
    let offs: Vec<(usize, usize)> = (0..sizes.len()).map(|i| ((i + 1) % 3, i * 150_001 % 700_000)).collect();
    for (i, (&(k, off), n)) in offs.iter().zip(sizes).enumerate() {
        m.fill(k, off, &pattern(100 + i as u64, n));
    }
    let parts: Vec<(&Mr, u64, usize)> = offs
        .iter()
        .zip(sizes)
        .map(|(&(k, off), n)| {
            let (mr, p) = m.at(k, off);
            (mr, p, n)
        })
        .collect();
    ep.sendv(&conn, &parts).unwrap();

    // C. Too large, then a message that fits.
    m.fill(0, 0, &pattern(200, 5000));
    let (mr, p) = m.at(0, 0);
    assert!(matches!(ep.send(&conn, mr, p, 5000), Err(Error::InvalidArgument(m)) if m.contains("larger")));
    m.fill(0, 0, &pattern(200, 999));
    let (mr, p) = m.at(0, 0);
    ep.send(&conn, mr, p, 999).unwrap();

    // D. Many sends in flight, from distinct slices.
    let count = 48;
    let size = |i: usize| (i * 7919 + 13) % 40_000 + 1;
    for i in 0..count {
        m.fill(0, i * 40_064, &pattern(1000 + i as u64, size(i)));
    }
    let ids: Vec<_> = (0..count)
        .map(|i| {
            let (mr, p) = m.at(0, i * 40_064);
            ep.send_async(&conn, mr, p, size(i)).unwrap()
        })
        .collect();
    for (i, id) in ids.into_iter().enumerate() {
        assert_eq!(ep.wait_async(id).unwrap(), size(i), "async send {i}");
    }

    // E. One-sided.
    let r_sym = RemoteRegion::from_bytes(&get("r_sym")).unwrap();
    let r_dev = RemoteRegion::from_bytes(&get("r_dev")).unwrap();
    let r_gone = RemoteRegion::from_bytes(&get("r_gone")).unwrap();
    assert!(RemoteRegion::from_bytes(&get("r_sym")[..40]).is_err());
    let mapped = ep.mapped_address(&conn, &r_sym).unwrap();
    assert_eq!(mapped.is_some(), !forced_tcp(), "shareable spans are mapped on IPC connections");
    assert_eq!(ep.mapped_address(&conn, &r_dev).unwrap(), None, "plain device memory is not");
    // Reads into each kind of local memory, from both spans.
    for (k, (r, seed, len)) in
        [(0usize, (&r_sym, 70u64, 300_000usize)), (1, (&r_dev, 71, 200_000)), (2, (&r_sym, 70, 300_000))]
    {
        let (off, n) = (1_001usize, 123_457usize.min(len - 1_001));
        let (mr, p) = m.at(k, 600_000);
        ep.read(&conn, mr, p, n, r, off).unwrap();
        assert_bytes(&format!("read into kind {k}"), &m.bytes(k, 600_000, n), &pattern(seed, len)[off..off + n]);
    }
    // Async read and write next to each other.
    m.fill(0, 50_000, &pattern(80, 250_001));
    m.fill(2, 50_000, &pattern(81, 199_999));
    let (mr0, p0) = m.at(0, 50_000);
    let (mr2, p2) = m.at(2, 50_000);
    let w1 = ep.write_async(&conn, mr0, p0, 250_001, &r_sym, 7).unwrap();
    let w2 = ep.write_async(&conn, mr2, p2, 199_999, &r_dev, 1).unwrap();
    assert_eq!(ep.wait_async(w1).unwrap(), 250_001);
    assert_eq!(ep.wait_async(w2).unwrap(), 199_999);
    // Out of the advertised span, a descriptor of a deregistered region, a bad one.
    assert!(
        matches!(ep.write(&conn, mr0, p0, 100, &r_dev, 199_901), Err(Error::InvalidArgument(m)) if m.contains("do not fit"))
    );
    let e = ep.write(&conn, mr0, p0, 100, &r_gone, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("peer") && m.contains("not registered")), "{e:?}");
    // A forged descriptor of a region the server registered but never advertised.
    let mut forged = get("r_dev");
    forged[24..32].copy_from_slice(&get("secret")[..8]);
    let forged = RemoteRegion::from_bytes(&forged).unwrap();
    let e = ep.write(&conn, mr0, p0, 100, &forged, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("never advertised")), "{e:?}");
    let e = ep.read(&conn, mr0, p0, 100, &r_gone, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("not registered")), "{e:?}");
    assert!(conn.error().is_none(), "refused one-sided transfers leave the connection usable");
    // Tell the server (a one-byte message).
    let (mr, p) = m.at(2, 0);
    ep.send(&conn, mr, p, 1).unwrap();

    // F. Unregistered pointers, wrong direction.
    let (mr, p) = m.at(0, SYM - 10);
    assert!(matches!(ep.send(&conn, mr, p, 100), Err(Error::InvalidArgument(m)) if m.contains("register")));
    assert!(matches!(ep.recv(&conn, mr, p, 10), Err(Error::InvalidUsage(_))));
    assert!(matches!(ep.write(&back, mr, p, 10, &r_sym, 0), Err(Error::InvalidUsage(_))));

    // G. The other direction, into plain device memory.
    let (mr, p) = m.at(1, 12_345);
    assert_eq!(ep.recv(&back, mr, p, 100_000).unwrap(), 54_321);
    assert_bytes("the other direction", &m.bytes(1, 12_345, 54_321), &pattern(300, 54_321));

    // H. Close: later calls on the connection fail, typed.
    ep.close(&conn);
    let (mr, p) = m.at(0, 0);
    assert!(matches!(ep.send(&conn, mr, p, 10), Err(Error::InvalidUsage(m)) if m.contains("closed")));
    put("client-done", b"1");
    get("server-done");
}

/// Child: rank 0 serves, rank 1 connects.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_every_call() {
    if !is_child("child_every_call") {
        return;
    }
    let ep = Endpoint::with_config(&device_of(rank()), config()).unwrap();
    put(&format!("port{}", rank()), &port_of(&ep));
    if rank() == 0 {
        every_call_server(&ep);
    } else {
        every_call_client(&ep);
    }
}

fn every_call(transport: &str, control: &str) {
    let d = new_dir(&format!("{transport}-{control}"));
    run_on_runtime_without_kernels(
        "child_every_call",
        2,
        &[
            (DIR_ENV, d.display().to_string()),
            ("DEVCOMM_P2P_TRANSPORT", transport.to_string()),
            ("DEVCOMM_P2P_CONTROL", control.to_string()),
        ],
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn every_call_between_processes_same_host_ipc() {
    every_call("auto", "auto");
}

#[test]
fn every_call_between_processes_same_host_ipc_with_tcp_control() {
    every_call("auto", "tcp");
}

#[test]
fn every_call_between_processes_over_tcp() {
    every_call("tcp", "auto");
}

/// Message `i` of the small-message test: its length, and where it starts
/// in the sender's buffers (which hold `pattern(7, ..)`).
fn small(i: usize) -> (usize, usize) {
    (1 + (i * 37) % 256, (i * 257) % (DBUF - 256))
}

/// The change of `b` over `a`.
fn delta(a: ControlStats, b: ControlStats) -> ControlStats {
    ControlStats {
        shm_sent: b.shm_sent - a.shm_sent,
        shm_received: b.shm_received - a.shm_received,
        tcp_sent: b.tcp_sent - a.tcp_sent,
        tcp_received: b.tcp_received - a.tcp_received,
    }
}

/// Child: rank 1 sends rank 0 many small messages over the shared-memory
/// control path: `ROW` one after another, then `FLIGHT` all in flight at
/// once; rank 0 checks each byte for byte, and both check that no control
/// frame took the socket meanwhile.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_small_messages() {
    const ROW: usize = 1500;
    const FLIGHT: usize = 200;
    if !is_child("child_small_messages") {
        return;
    }
    let ep = Endpoint::with_config(&device_of(rank()), config().with_shm_control(true)).unwrap();
    put(&format!("port{}", rank()), &port_of(&ep));
    let conn = if rank() == 0 {
        ep.accept().unwrap().2
    } else {
        ep.connect(("127.0.0.1", peer_port(0)), device_of(0).ordinal()).unwrap()
    };
    assert_eq!(conn.transport(), P2pTransport::Ipc);
    assert_eq!(conn.control_path(), ControlPath::SharedMemory);
    let mut m = Mem::new(&ep);
    let data = pattern(7, DBUF);
    let before = conn.control_stats();
    if rank() == 1 {
        // Shareable memory mostly (the copy engine); every 7th message
        // from plain device memory (its bytes take the data sockets).
        m.fill(0, 0, &data);
        m.fill(1, 0, &data);
        let kind = |i: usize| if i % 7 == 6 { 1 } else { 0 };
        for i in 0..ROW {
            let (n, off) = small(i);
            let (mr, p) = m.at(kind(i), off);
            ep.send(&conn, mr, p, n).unwrap_or_else(|e| panic!("send {i}: {e}"));
        }
        let ids: Vec<_> = (ROW..ROW + FLIGHT)
            .map(|i| {
                let (n, off) = small(i);
                let (mr, p) = m.at(kind(i), off);
                ep.send_async(&conn, mr, p, n).unwrap()
            })
            .collect();
        for (j, id) in ids.into_iter().enumerate() {
            assert_eq!(ep.wait_async(id).unwrap(), small(ROW + j).0, "async send {j}");
        }
        let d = delta(before, conn.control_stats());
        assert!(d.shm_received >= (ROW + FLIGHT) as u64, "a clear-to-send per message on the ring: {d:?}");
        assert_eq!((d.tcp_sent, d.tcp_received), (0, 0), "no control frame on the socket: {d:?}");
    } else {
        // Into shareable memory, every 10th message into host memory;
        // message i lands in its own 256-byte slot.
        let kind = |i: usize| if i % 10 == 9 { 2 } else { 0 };
        let slot = |i: usize| (i * 256) % (HOST - 256);
        for i in 0..ROW {
            let (n, off) = small(i);
            let (mr, p) = m.at(kind(i), slot(i));
            assert_eq!(ep.recv(&conn, mr, p, 256).unwrap_or_else(|e| panic!("recv {i}: {e}")), n, "message {i}");
            assert_bytes(&format!("message {i}"), &m.bytes(kind(i), slot(i), n), &data[off..off + n]);
            if n < 256 {
                assert_eq!(m.bytes(kind(i), slot(i) + n, 1)[0], POISON, "message {i} overran");
            }
        }
        // All posted before any arrives (the sender may be ahead already).
        let ids: Vec<_> = (ROW..ROW + FLIGHT)
            .map(|i| {
                let (mr, p) = m.at(kind(i), slot(i));
                ep.recv_async(&conn, mr, p, 256).unwrap()
            })
            .collect();
        let mut done = vec![None; FLIGHT];
        let t = Instant::now();
        while done.iter().any(Option::is_none) {
            for (j, id) in ids.iter().enumerate() {
                if done[j].is_none() {
                    done[j] = ep.poll_async(*id).unwrap();
                }
            }
            assert!(t.elapsed() < Duration::from_secs(60), "async receives did not finish");
        }
        for (j, d) in done.into_iter().enumerate() {
            let i = ROW + j;
            let (n, off) = small(i);
            assert_eq!(d, Some(n), "async receive {j}");
            assert_bytes(&format!("async message {i}"), &m.bytes(kind(i), slot(i), n), &data[off..off + n]);
        }
        let d = delta(before, conn.control_stats());
        assert!(d.shm_sent >= (ROW + FLIGHT) as u64, "a clear-to-send per message on the ring: {d:?}");
        assert!(d.shm_received >= (ROW + FLIGHT) as u64, "a done per message on the ring: {d:?}");
        assert_eq!((d.tcp_sent, d.tcp_received), (0, 0), "no control frame on the socket: {d:?}");
    }
    put(&format!("small-done{}", rank()), b"1");
    get(&format!("small-done{}", 1 - rank()));
}

#[test]
fn many_small_messages_over_the_shared_memory_control_path() {
    let d = new_dir("small");
    run_on_runtime_without_kernels("child_small_messages", 2, &[(DIR_ENV, d.display().to_string())]);
    let _ = std::fs::remove_dir_all(d);
}

/// Child: transfers 2 MiB messages until the connection fails (the parent
/// kills the other rank); the survivor must see a typed error, soon.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_killed() {
    if !is_child("child_killed") {
        return;
    }
    let auto = std::env::var("DEVCOMM_P2P_TRANSPORT").is_ok_and(|v| v == "auto");
    let cfg = config().with_timeouts(Duration::from_secs(20)).with_shm_control(auto);
    let ep = Endpoint::with_config(&device_of(rank()), cfg).unwrap();
    put(&format!("port{}", rank()), &port_of(&ep));
    let conn = if rank() == 0 {
        ep.accept().unwrap().2
    } else {
        ep.connect(("127.0.0.1", peer_port(0)), device_of(0).ordinal()).unwrap()
    };
    if auto {
        assert_eq!(conn.control_path(), ControlPath::SharedMemory);
    }
    let m = Mem::new(&ep);
    let n = std::env::var(KILL_BYTES_ENV).map_or(SYM, |v| v.parse().unwrap());
    let mut sent = 0;
    let t = Instant::now();
    let (mr, p) = m.at(0, 0);
    let call = || if rank() == 0 { ep.recv(&conn, mr, p, n).map(|_| ()) } else { ep.send(&conn, mr, p, n) };
    loop {
        let start = Instant::now();
        match call() {
            Ok(()) => {
                sent += 1;
                if sent == 3 {
                    put("flowing", b"1");
                }
            }
            Err(e) => {
                eprintln!("rank {} after {sent} messages: {e}", rank());
                assert!(matches!(e, Error::RemoteError(_)), "a dead peer is a RemoteError: {e:?}");
                assert!(start.elapsed() < Duration::from_secs(10), "found out before the op timeout (20 s)");
                assert!(conn.error().is_some());
                // Later calls fail at once too.
                let t = Instant::now();
                assert!(matches!(call(), Err(Error::RemoteError(_))));
                assert!(t.elapsed() < Duration::from_secs(1));
                return;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(90), "the peer was never killed");
    }
}

/// Bytes per message of `child_killed` (default: 2 MiB).
const KILL_BYTES_ENV: &str = "P2P_KILL_BYTES";

fn killed(transport: &str, victim: usize) {
    killed_with(transport, victim, SYM);
}

fn killed_with(transport: &str, victim: usize, bytes: usize) {
    let d = new_dir(&format!("kill{victim}{transport}"));
    let opts = child_job("child_killed", 2)
        .env("DEVCOMM_RUNTIME", runtime())
        .env(DIR_ENV, d.display().to_string())
        .env("DEVCOMM_P2P_TRANSPORT", transport)
        .env(KILL_BYTES_ENV, bytes.to_string())
        .kill_on_failure(false)
        .timeout(Some(Duration::from_secs(120)));
    let mut job = devcomm::launch::spawn(&opts).unwrap();
    let t = Instant::now();
    while !d.join("flowing").exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "transfers never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(3));
    job.kill_rank(victim).unwrap();
    let st = job.wait().unwrap();
    let survivor = 1 - victim;
    assert!(st[survivor].success(), "rank {survivor}: {}", devcomm::launch::describe(&st[survivor]));
    assert!(!st[victim].success());
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn sender_killed_mid_transfer_fails_the_receiver_over_tcp() {
    killed("tcp", 1);
}

#[test]
fn receiver_killed_mid_transfer_fails_the_sender_over_tcp() {
    killed("tcp", 0);
}

#[test]
fn peer_killed_on_a_same_host_connection() {
    killed("auto", 1);
    killed("auto", 0);
}

/// Small messages stream (the control rings busy) when a peer dies.
#[test]
fn peer_killed_while_small_messages_stream_over_shared_memory() {
    killed_with("auto", 1, 64);
    killed_with("auto", 0, 64);
}

/// Two endpoints in one process over the shared-memory control path:
/// small messages stream until the receiving endpoint is dropped; the
/// sender's transfers in flight and later ones fail typed, soon.
#[test]
fn endpoint_dropped_mid_stream_over_shared_memory() {
    let dev = device_of(0);
    let cfg = config().with_shm_control(true).with_timeouts(Duration::from_secs(20));
    let server = Endpoint::with_config(&dev, cfg.clone()).unwrap();
    let client = Endpoint::with_config(&dev, cfg).unwrap();
    let port = server.addr().port();
    let (src, dst) = (SymmetricMemory::alloc(&dev, 4096).unwrap(), SymmetricMemory::alloc(&dev, 4096).unwrap());
    src.write(dev.stream(), 0, &pattern(3, 4096)).unwrap();
    let smr = client.reg_symmetric(&src).unwrap();
    std::thread::scope(|s| {
        let rx = s.spawn(move || {
            let (_, _, conn) = server.accept().unwrap();
            assert_eq!(conn.control_path(), ControlPath::SharedMemory);
            let dmr = server.reg_symmetric(&dst).unwrap();
            for i in 0..300 {
                assert_eq!(server.recv(&conn, &dmr, dst.device_addr(), 4096).unwrap(), 64, "message {i}");
            }
            // Receives posted, then the endpoint goes away with them.
            let _ids: Vec<_> =
                (0..4).map(|_| server.recv_async(&conn, &dmr, dst.device_addr(), 4096).unwrap()).collect();
            drop(dmr);
            drop(server);
        });
        let conn = client.connect(("127.0.0.1", port), dev.ordinal()).unwrap();
        assert_eq!(conn.control_path(), ControlPath::SharedMemory);
        let mut sent = 0;
        let t = Instant::now();
        let e = loop {
            let ids: Vec<_> = match (0..8).map(|_| client.send_async(&conn, &smr, src.device_addr(), 64)).collect() {
                Ok(ids) => ids,
                Err(e) => break e,
            };
            let mut first = None;
            for id in ids {
                match client.wait_async(id) {
                    Ok(_) => sent += 1,
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first {
                break e;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "the receiver never went away ({sent} sent)");
        };
        assert!(sent >= 300, "{sent} messages went before the failure");
        assert!(matches!(e, Error::RemoteError(ref m) if m.contains("closed")), "{e:?}");
        assert!(conn.error().is_some());
        let t = Instant::now();
        assert!(matches!(client.send(&conn, &smr, src.device_addr(), 64), Err(Error::RemoteError(_))));
        assert!(t.elapsed() < Duration::from_secs(1));
        rx.join().unwrap();
    });
}

/// The shared-memory control path needs both sides: an endpoint that
/// refuses it (or TCP forced) gives connections on the control socket,
/// which work as before.
#[test]
fn the_control_path_is_negotiated() {
    let dev = device_of(0);
    for (server_shm, client_shm, force_tcp, want) in [
        (true, true, false, ControlPath::SharedMemory),
        (false, true, false, ControlPath::Tcp),
        (true, false, false, ControlPath::Tcp),
        (true, true, true, ControlPath::Tcp),
    ] {
        let cfg = config().with_force_tcp(force_tcp);
        let server = Endpoint::with_config(&dev, cfg.clone().with_shm_control(server_shm)).unwrap();
        let client = Endpoint::with_config(&dev, cfg.with_shm_control(client_shm)).unwrap();
        let (src, dst) = (SymmetricMemory::alloc(&dev, 4096).unwrap(), SymmetricMemory::alloc(&dev, 4096).unwrap());
        let data = pattern(5, 1000);
        src.write(dev.stream(), 0, &data).unwrap();
        let (smr, dmr) = (client.reg_symmetric(&src).unwrap(), server.reg_symmetric(&dst).unwrap());
        let addr = ("127.0.0.1", server.addr().port());
        std::thread::scope(|s| {
            let acc = s.spawn(|| server.accept().unwrap().2);
            let conn = client.connect(addr, dev.ordinal()).unwrap();
            let sconn = acc.join().unwrap();
            let what = format!("server {server_shm}, client {client_shm}, force_tcp {force_tcp}");
            assert_eq!((conn.control_path(), sconn.control_path()), (want, want), "{what}");
            let (c0, s0) = (conn.control_stats(), sconn.control_stats());
            for _ in 0..10 {
                let id = server.recv_async(&sconn, &dmr, dst.device_addr(), 4096).unwrap();
                client.send(&conn, &smr, src.device_addr(), 1000).unwrap();
                assert_eq!(server.wait_async(id).unwrap(), 1000, "{what}");
            }
            let (c, s) = (delta(c0, conn.control_stats()), delta(s0, sconn.control_stats()));
            if want == ControlPath::SharedMemory {
                assert!(
                    s.shm_sent >= 10 && c.shm_received >= 10 && s.tcp_sent + c.tcp_received == 0,
                    "{what}: {s:?} {c:?}"
                );
            } else {
                assert!(
                    s.tcp_sent >= 10 && c.tcp_received >= 10 && s.shm_sent + c.shm_received == 0,
                    "{what}: {s:?} {c:?}"
                );
            }
        });
        let mut back = vec![0u8; 1000];
        dst.read(dev.stream(), 0, &mut back).unwrap();
        assert_bytes("negotiated transfer", &back, &data);
    }
}

/// Garbage, a wrong version, a stray data socket and an empty connection
/// at the listening port are refused with typed errors, and the endpoint
/// keeps serving; connecting to things that are not endpoints fails typed.
#[test]
fn garbage_on_the_listening_port() {
    let dev = device_of(0);
    let mut cfg = config().with_timeouts(Duration::from_secs(2));
    cfg.accept_timeout = Duration::from_secs(10);
    let server = Endpoint::with_config(&dev, cfg.clone()).unwrap();
    let client = Endpoint::with_config(&dev, cfg).unwrap();
    let addr = server.addr();
    let mut junk = pattern(9, 300);
    junk[0] = b'G';
    let mut wrong_version = vec![0u8; 256];
    wrong_version[..8].copy_from_slice(b"DCP2PHI\0");
    wrong_version[8..12].copy_from_slice(&99u32.to_le_bytes());
    let mut stray = wrong_version.clone();
    stray[8..12].copy_from_slice(&1u32.to_le_bytes());
    stray[12..16].copy_from_slice(&2u32.to_le_bytes()); // a data socket
    stray[64..72].copy_from_slice(&12345u64.to_le_bytes());
    let mut held = Vec::new();
    for bytes in [&junk[..], &wrong_version[..], &stray[..], &[][..]] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(bytes).unwrap();
        if bytes.is_empty() {
            drop(s);
        } else {
            held.push(s);
        }
    }
    // Meanwhile a real peer connects and transfers.
    let mem = SymmetricMemory::alloc(&dev, 100_000).unwrap();
    let data = pattern(10, 100_000);
    mem.write(dev.stream(), 0, &data).unwrap();
    let out = SymmetricMemory::alloc(&dev, 100_000).unwrap();
    let (smr, dmr) = (client.reg_symmetric(&mem).unwrap(), server.reg_symmetric(&out).unwrap());
    std::thread::scope(|s| {
        let acc = s.spawn(|| {
            let (_, _, c) = server.accept().unwrap();
            server.recv(&c, &dmr, out.device_addr(), 100_000).unwrap()
        });
        let c = client.connect(addr, dev.ordinal()).unwrap();
        client.send(&c, &smr, mem.device_addr(), 100_000).unwrap();
        assert_eq!(acc.join().unwrap(), 100_000);
    });
    let mut back = vec![0u8; 100_000];
    out.read(dev.stream(), 0, &mut back).unwrap();
    assert_bytes("transfer beside garbage", &back, &data);
    let t = Instant::now();
    while server.rejections().len() < 4 {
        assert!(t.elapsed() < Duration::from_secs(10), "rejections: {:?}", server.rejections());
        std::thread::sleep(Duration::from_millis(5));
    }
    let rej = server.rejections();
    let text: Vec<String> = rej.iter().map(|e| e.to_string()).collect();
    assert!(rej.iter().all(|e| matches!(e, Error::RemoteError(_))), "{text:?}");
    for needle in ["not a devcomm point-to-point hello", "version 99", "no pending connection", "closed the connection"]
    {
        assert!(text.iter().any(|t| t.contains(needle)), "no rejection says {needle:?}: {text:?}");
    }
    drop(held);

    // Nobody listening; a listener that answers garbage; one that never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    assert!(matches!(client.connect(dead, 0), Err(Error::RemoteError(m)) if m.contains("nobody listens")));
    let liar = TcpListener::bind("127.0.0.1:0").unwrap();
    let liar_addr = liar.local_addr().unwrap();
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = liar.accept().unwrap();
        let mut hello = [0u8; 256];
        let _ = s.read_exact(&mut hello);
        let _ = s.write_all(&pattern(11, 256));
        std::thread::sleep(Duration::from_secs(1));
    });
    assert!(matches!(client.connect(liar_addr, 0), Err(Error::RemoteError(m)) if m.contains("not a devcomm")));
    let t = Instant::now();
    assert!(matches!(client.connect(silent_addr, 0), Err(Error::Timeout(_))));
    assert!(t.elapsed() < Duration::from_secs(5));
    drop(silent);
    // Accepting with nobody coming times out.
    assert!(matches!(server.accept_timeout(Duration::from_millis(50)), Err(Error::Timeout(_))));
}

/// `Endpoint::new(gpu, threads)` (runtime and settings from the
/// environment), two endpoints in one process: host memory both ways, an
/// empty message, one-sided write and read of host memory, and a region
/// dropped while registered on the receiving side.
#[test]
fn endpoints_in_one_process_with_host_memory() {
    let a = Endpoint::new(0, 2).unwrap();
    let b = Endpoint::new(0, 2).unwrap();
    assert_eq!(a.config().threads, 2);
    let port = b.addr().port();
    let n = 300_007;
    let mut src = pattern(40, n);
    let mut dst = vec![POISON; n + 8];
    // SAFETY: both vectors outlive their regions (dropped at the end of this scope, regions first).
    let (smr, dmr) =
        unsafe { (a.reg(src.as_mut_ptr() as u64, n).unwrap(), b.reg(dst.as_mut_ptr() as u64, n + 8).unwrap()) };
    // SAFETY: refused before anything is registered (a null pointer, an empty span).
    let (null, empty) = unsafe { (a.reg(0, 10), a.reg(src.as_ptr() as u64, 0)) };
    assert!(matches!(null, Err(Error::InvalidArgument(_))));
    assert!(matches!(empty, Err(Error::InvalidArgument(_))));
    std::thread::scope(|s| {
        let acc = s.spawn(|| b.accept().unwrap());
        let conn = a.connect(("127.0.0.1", port), b.device().ordinal()).unwrap();
        let (_, _, bconn) = acc.join().unwrap();
        // A region of the other endpoint is refused.
        assert!(
            matches!(a.send(&conn, &dmr, dst.as_ptr() as u64, 1), Err(Error::InvalidArgument(m)) if m.contains("another endpoint"))
        );
        let id = b.recv_async(&bconn, &dmr, dst.as_ptr() as u64, n + 8).unwrap();
        assert!(id.get() > 0);
        a.send(&conn, &smr, src.as_ptr() as u64, n).unwrap();
        assert_eq!(b.wait_async(id).unwrap(), n);
        let id = b.recv_async(&bconn, &dmr, dst.as_ptr() as u64, 8).unwrap();
        a.send(&conn, &smr, src.as_ptr() as u64, 0).unwrap();
        assert_eq!(b.wait_async(id).unwrap(), 0);
        // One-sided, into and out of host memory.
        let region = b.advertise(&dmr, dst.as_ptr() as u64 + 8, n).unwrap();
        a.write(&conn, &smr, src.as_ptr() as u64 + 1, n - 1, &region, 0).unwrap();
        a.read(&conn, &smr, src.as_ptr() as u64, 1000, &region, 5).unwrap();
        // The receiver's region goes away: the writer is told, typed.
        drop(dmr);
        let e = a.write(&conn, &smr, src.as_ptr() as u64, 10, &region, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("not registered")), "{e:?}");
        a.close(&conn);
        let t = Instant::now();
        while bconn.error().is_none() {
            assert!(t.elapsed() < Duration::from_secs(10), "the peer's close never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(matches!(bconn.error(), Some(Error::RemoteError(m)) if m.contains("closed")));
    });
    drop(smr);
    // SAFETY: no region names the vectors any more; read them through volatile loads.
    let got: Vec<u8> = (0..n + 8).map(|i| unsafe { std::ptr::read_volatile(dst.as_ptr().add(i)) }).collect();
    let want = pattern(40, n);
    assert_bytes("send into host memory, then write at offset 8", &got[..8], &want[..8]);
    assert_bytes("write into host memory", &got[8..n + 7], &want[1..n]);
    let mut src_want = want.clone();
    src_want[..1000].copy_from_slice(&want[6..1006]);
    assert_bytes("read into host memory", &src, &src_want);
}
