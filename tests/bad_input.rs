//! Bad input gets a typed error, never a panic, and never stops the root
//! from serving the good ranks.

mod common;

use common::{cfg, TIMEOUT};
use devcomm::bootstrap::wire::{encode_header, Msg, PROTOCOL_VERSION};
use devcomm::bootstrap::{Root, UniqueId};
use devcomm::comm::{Communicator, Config};
use devcomm::env::LaunchEnv;
use devcomm::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Starts the good ranks of a 2-rank job on threads; each checks an allgather.
fn good_ranks(id: UniqueId) -> Vec<JoinHandle<()>> {
    (0..2)
        .map(|r| {
            std::thread::spawn(move || {
                let c = Communicator::init_rank_with_config(2, id, r, cfg(r)).expect("good rank init");
                let all = c.bootstrap_allgather(&[r as u8]).expect("good rank allgather");
                assert_eq!(all, vec![vec![0], vec![1]]);
                c.finalize().expect("good rank finalize");
            })
        })
        .collect()
}

fn join_all(h: Vec<JoinHandle<()>>) {
    for h in h {
        h.join().expect("good rank panicked");
    }
}

#[test]
fn rank_out_of_range() {
    let id = UniqueId::new().unwrap();
    let r = Communicator::init_rank_with_config(2, id, 2, cfg(0));
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("out of range")));
}

#[test]
fn zero_ranks() {
    let id = UniqueId::new().unwrap();
    let r = Communicator::init_rank_with_config(0, id, 0, cfg(0));
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("nranks")));
    assert!(matches!(Communicator::init_all(&[]), Err(Error::InvalidArgument(_))));
}

#[test]
fn zero_timeout_config() {
    let id = UniqueId::new().unwrap();
    let c = Config::default().with_bootstrap_timeout(Duration::ZERO).with_device(common::emu(0));
    assert!(matches!(Communicator::init_rank_with_config(1, id, 0, c), Err(Error::InvalidArgument(_))));
}

#[test]
fn malformed_unique_id_string() {
    for s in ["", "hello", "dcid1-zz@127.0.0.1:1", "dcid1-00000000000000000000000000000001@nohost"] {
        let r = s.parse::<UniqueId>();
        assert!(matches!(r, Err(Error::InvalidArgument(ref m)) if m.contains("malformed unique id")), "{s:?}: {r:?}");
    }
    assert!(matches!(UniqueId::from_bytes(&[0u8; 7]), Err(Error::InvalidArgument(_))));
    let env = LaunchEnv::from_lookup(|k| match k {
        "RANK" => Some("0".into()),
        "WORLD_SIZE" => Some("1".into()),
        "DEVCOMM_UNIQUE_ID" => Some("not-an-id".into()),
        _ => None,
    });
    assert!(matches!(env, Err(Error::InvalidArgument(m)) if m.contains("DEVCOMM_UNIQUE_ID")));
}

/// A rank holding an id with the right address but another magic (another
/// job's id, or a stale one) is refused; the root keeps serving the good ranks.
#[test]
fn id_of_another_job_on_same_root() {
    let id = UniqueId::new().unwrap();
    let first = std::thread::spawn(move || {
        let c = Communicator::init_rank_with_config(2, id, 0, cfg(0)).unwrap();
        assert_eq!(c.bootstrap_allgather(b"a").unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
        c.finalize().unwrap();
    });
    let other = UniqueId::from_parts(id.addr(), id.magic() ^ 0xdead_beef);
    let t = Instant::now();
    let r = Communicator::init_rank_with_config(2, other, 1, cfg(1));
    assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("does not belong to this root")), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
    let c = Communicator::init_rank_with_config(2, id, 1, cfg(1)).unwrap();
    assert_eq!(c.bootstrap_allgather(b"b").unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
    c.finalize().unwrap();
    first.join().unwrap();
}

/// A rank that disagrees on the size, or takes a rank already taken, is
/// refused; the good ranks complete.
#[test]
fn wrong_size_and_duplicate_rank() {
    let root = Root::spawn("127.0.0.1:0".parse().unwrap(), 77).unwrap();
    let id = *root.id();
    let first = std::thread::spawn(move || {
        let c = Communicator::init_rank_with_config(2, id, 0, cfg(0)).unwrap();
        c.bootstrap_barrier().unwrap();
        c.finalize().unwrap();
    });
    // Wait until rank 0 joined, so the size and its slot are known to the root.
    let t = Instant::now();
    while root.registered_ranks() < 1 {
        assert!(t.elapsed() < TIMEOUT, "rank 0 did not join");
        std::thread::sleep(Duration::from_millis(2));
    }
    let r = Communicator::init_rank_with_config(3, id, 1, cfg(1));
    assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("3 ranks")), "{r:?}");
    let r = Communicator::init_rank_with_config(2, id, 0, cfg(0));
    assert!(matches!(&r, Err(Error::InvalidUsage(m)) if m.contains("already joined")), "{r:?}");
    let c = Communicator::init_rank_with_config(2, id, 1, cfg(1)).unwrap();
    c.bootstrap_barrier().unwrap();
    c.finalize().unwrap();
    first.join().unwrap();
}

/// Junk on the bootstrap port: random bytes, an oversized frame, a wrong
/// version, a non-Hello first message, a truncated frame, a silent
/// connection. The root drops those and keeps serving the good ranks.
#[test]
fn garbage_on_the_bootstrap_port() {
    let id = UniqueId::new().unwrap();
    let addr = id.addr();
    let send = |bytes: &[u8]| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(bytes).unwrap();
        s
    };
    let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut c1 = send(&junk);
    let mut c2 = send(&encode_header(1, u32::MAX));
    let mut bad_version = encode_header(1, 0);
    bad_version[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    let mut c3 = send(&bad_version);
    let mut c4 = send(&Msg::Finalize.encode().unwrap());
    let mut hello = Msg::Hello { magic: id.magic(), nranks: 2, rank: 0, pid: 1, info: vec![1; 64] }.encode().unwrap();
    hello.truncate(30);
    drop(send(&hello));
    let _silent = TcpStream::connect(addr).unwrap();
    // A Hello whose info is garbage takes a slot: that must fail the job,
    // so it is *not* sent here; see `garbage_rank_info` below.

    // The root closes each junk connection.
    for s in [&mut c1, &mut c2, &mut c3, &mut c4] {
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf); // EOF (or reset) once the root dropped it
    }
    let t = Instant::now();
    join_all(good_ranks(id));
    assert!(t.elapsed() < TIMEOUT);
}

/// A peer that joins with a well-formed Hello but garbage rank info: the
/// good rank gets a RemoteError, not a panic.
#[test]
fn garbage_rank_info() {
    let id = UniqueId::new().unwrap();
    let mut s = TcpStream::connect(id.addr()).unwrap();
    let hello = Msg::Hello { magic: id.magic(), nranks: 2, rank: 1, pid: 1, info: b"garbage".to_vec() };
    s.write_all(&hello.encode().unwrap()).unwrap();
    let r = Communicator::init_rank_with_config(2, id, 0, cfg(0));
    assert!(matches!(&r, Err(Error::RemoteError(m)) if m.contains("malformed rank info")), "{r:?}");
}

#[test]
fn bad_arguments_on_a_live_communicator() {
    let id = UniqueId::new().unwrap();
    let c = Communicator::init_rank_with_config(1, id, 0, cfg(0)).unwrap();
    assert!(matches!(c.bootstrap_broadcast(1, b"x"), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.rank_info(5), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.same_host(1), Err(Error::InvalidArgument(_))));
    // Still usable afterwards.
    assert_eq!(c.bootstrap_broadcast(0, b"x").unwrap(), b"x".to_vec());
    // Joining a finished job's root again is refused or times out, never hangs.
    c.finalize().unwrap();
    let c2 = Config::default().with_bootstrap_timeout(Duration::from_millis(500)).with_device(common::emu(0));
    let r = Communicator::init_rank_with_config(1, id, 0, c2);
    assert!(r.is_err());
}
