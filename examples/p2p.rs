//! Point-to-point transfers between two processes with `devcomm::p2p`, as
//! a KV-cache or weight transfer does it: no communicator, no launcher.
//!
//! `cargo run --example p2p` starts the server (GPU 0) and the server starts
//! its peer, this same program with `--peer <port>` (GPU 1 when there is
//! one). The peer connects; a connection carries transfers one way, so the
//! server connects back for the other direction. The server advertises
//! its KV cache; the peer writes four blocks into it one-sidedly, reads
//! one back, then sends three "weight" tensors as one vectored operation
//! (`sendv`), which the server receives with `recvv`. Every byte is
//! checked. On one host the bytes move on the copy engine (CUDA IPC);
//! `DEVCOMM_P2P_TRANSPORT=tcp` sends them over TCP.

use devcomm::p2p::{Endpoint, Mr, P2pConfig, RemoteRegion};
use devcomm::runtime::{Device, RuntimeSelection};
use devcomm::{Result, SymmetricMemory};
use std::process::ExitCode;
use std::time::Instant;

/// KV blocks: (offset in the cache, bytes), odd sizes on purpose.
const BLOCKS: [(usize, usize); 4] = [(0, 1_048_573), (1_100_000, 65_537), (1_200_000, 2_000_003), (3_300_000, 7)];
const CACHE: usize = 4 << 20;
/// Weight tensors sent with `sendv`.
const TENSORS: [usize; 3] = [3_000_001, 12_345, 777_777];

fn data(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn config() -> Result<P2pConfig> {
    Ok(P2pConfig::from_env()?.with_bind("127.0.0.1:0".parse().expect("an address")))
}

/// A small message: `bytes` through a registered mailbox.
fn send_small(ep: &Endpoint, conn: &devcomm::p2p::Conn, mail: &SymmetricMemory, mr: &Mr, bytes: &[u8]) -> Result<()> {
    mail.write(ep.device().stream(), 0, bytes)?;
    ep.send(conn, mr, mail.device_addr(), bytes.len())
}

fn recv_small(ep: &Endpoint, conn: &devcomm::p2p::Conn, mail: &SymmetricMemory, mr: &Mr) -> Result<Vec<u8>> {
    let n = ep.recv(conn, mr, mail.device_addr(), mail.size())?;
    let mut b = vec![0u8; n];
    mail.read(ep.device().stream(), 0, &mut b)?;
    Ok(b)
}

fn server() -> Result<()> {
    let dev = Device::open(RuntimeSelection::from_env()?, 0)?;
    let ep = Endpoint::with_config(&dev, config()?)?;
    let exe = std::env::current_exe().map_err(|e| devcomm::Error::system("locating this program", e))?;
    let mut peer_proc = std::process::Command::new(exe)
        .args(["--peer", &ep.addr().port().to_string()])
        .spawn()
        .map_err(|e| devcomm::Error::system("starting the peer", e))?;
    let r = (|| -> Result<String> {
        let (peer, peer_gpu, from_peer) = ep.accept()?;
        let mail = SymmetricMemory::alloc(&dev, 4096)?;
        let mail_mr = ep.reg_symmetric(&mail)?;
        // The peer's first message is its own port: connect back for the other direction.
        let port = recv_small(&ep, &from_peer, &mail, &mail_mr)?;
        let to_peer = ep.connect((peer.ip(), u16::from_le_bytes([port[0], port[1]])), peer_gpu)?;
        // Advertise the KV cache and ship the descriptor.
        let cache = SymmetricMemory::alloc(&dev, CACHE)?;
        cache.write(dev.stream(), 0, &vec![0u8; CACHE])?;
        let cache_mr = ep.reg_symmetric(&cache)?;
        let region = ep.advertise(&cache_mr, cache.device_addr(), CACHE)?;
        send_small(&ep, &to_peer, &mail, &mail_mr, &region.to_bytes())?;
        // Post the tensors' receives, then wait for "blocks written".
        let weights = SymmetricMemory::alloc(&dev, 8 << 20)?;
        let weights_mr = ep.reg_symmetric(&weights)?;
        let mut off = 0;
        let mut parts = Vec::new();
        for n in TENSORS {
            parts.push((&weights_mr, weights.device_addr() + off as u64, n + 1000));
            off += n + 1000;
        }
        assert_eq!(recv_small(&ep, &from_peer, &mail, &mail_mr)?, b"blocks written");
        for (i, &(at, n)) in BLOCKS.iter().enumerate() {
            let mut got = vec![0u8; n];
            cache.read(dev.stream(), at, &mut got)?;
            assert!(got == data(i as u64, n), "KV block {i} differs");
        }
        let t = Instant::now();
        let lens = ep.recvv(&from_peer, &parts)?;
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(lens, TENSORS.to_vec());
        for (i, (_, addr, _)) in parts.iter().enumerate() {
            let mut got = vec![0u8; TENSORS[i]];
            weights.read(dev.stream(), (*addr - weights.device_addr()) as usize, &mut got)?;
            assert!(got == data(100 + i as u64, TENSORS[i]), "tensor {i} differs");
        }
        let total: usize = TENSORS.iter().sum();
        Ok(format!(
            "p2p on the {} runtime, {:?} transport: the peer (GPU {peer_gpu}) wrote {} KV blocks one-sidedly and read \
             one back; {} tensors ({total} bytes) arrived with recvv in {:.1} ms; every byte checked",
            dev.kind(),
            from_peer.transport(),
            BLOCKS.len(),
            TENSORS.len(),
            secs * 1e3
        ))
    })();
    if r.is_err() {
        let _ = peer_proc.kill();
    }
    let st = peer_proc.wait().map_err(|e| devcomm::Error::system("waiting for the peer", e))?;
    println!("{}", r?);
    if !st.success() {
        return Err(devcomm::Error::remote(format!("the peer failed: {st}")));
    }
    Ok(())
}

fn peer(port: u16) -> Result<()> {
    let sel = RuntimeSelection::from_env()?;
    let gpu = usize::from(devcomm::runtime::device_count(sel)?.1 > 1);
    let dev = Device::open(sel, gpu)?;
    let ep = Endpoint::with_config(&dev, config()?)?;
    let to_server = ep.connect(("127.0.0.1", port), 0)?;
    let mail = SymmetricMemory::alloc(&dev, 4096)?;
    let mail_mr = ep.reg_symmetric(&mail)?;
    send_small(&ep, &to_server, &mail, &mail_mr, &ep.addr().port().to_le_bytes())?;
    let (_, _, from_server) = ep.accept()?;
    let region = RemoteRegion::from_bytes(&recv_small(&ep, &from_server, &mail, &mail_mr)?)?;
    // The KV blocks, written one-sidedly, all in flight at once.
    let src = SymmetricMemory::alloc(&dev, 8 << 20)?;
    let src_mr = ep.reg_symmetric(&src)?;
    let mut ids = Vec::new();
    for (i, &(at, n)) in BLOCKS.iter().enumerate() {
        src.write(dev.stream(), at, &data(i as u64, n))?;
        ids.push(ep.write_async(&to_server, &src_mr, src.device_addr() + at as u64, n, &region, at)?);
    }
    for id in ids {
        ep.wait_async(id)?;
    }
    // Read block 1 back into the upper half of our buffer.
    let (at, n) = BLOCKS[1];
    ep.read(&to_server, &src_mr, src.device_addr() + (4 << 20) as u64, n, &region, at)?;
    let mut back = vec![0u8; n];
    src.read(dev.stream(), 4 << 20, &mut back)?;
    assert!(back == data(1, n), "the block read back differs");
    send_small(&ep, &to_server, &mail, &mail_mr, b"blocks written")?;
    // Three tensors in one vectored send.
    let mut off = 0;
    let mut parts = Vec::new();
    for (i, n) in TENSORS.into_iter().enumerate() {
        src.write(dev.stream(), off, &data(100 + i as u64, n))?;
        parts.push((&src_mr, src.device_addr() + off as u64, n));
        off += n;
    }
    ep.sendv(&to_server, &parts)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let r = match args.get(1).map(String::as_str) {
        Some("--peer") => match args.get(2).and_then(|p| p.parse().ok()) {
            Some(port) => peer(port),
            None => Err(devcomm::Error::invalid_argument("--peer needs the server's port")),
        },
        _ => server(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("p2p: {e}");
            ExitCode::FAILURE
        }
    }
}
