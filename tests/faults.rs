//! Failures never hang: dead ranks, a dead root, ranks that never come,
//! collectives some rank never calls. Every wait is bounded and typed.

mod common;

use common::{cfg, child_job, is_child, run, TIMEOUT};
use devcomm::bootstrap::{Root, UniqueId};
use devcomm::comm::{Communicator, Config};
use devcomm::Error;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn die_now() -> ! {
    let _ = kill(Pid::this(), Signal::SIGKILL);
    unreachable!("SIGKILL returned")
}

/// Child: join (rank/size/id from the environment) and wait to be killed.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_join_and_wait() {
    if !is_child("child_join_and_wait") {
        return;
    }
    // Never completes: the parent expects more ranks than it starts.
    let r = Communicator::init_from_env();
    panic!("init returned {r:?}");
}

/// 3 ranks expected, 2 started; one is SIGKILLed after it joined: the
/// survivor's init returns RemoteError long before its timeout.
#[test]
fn rank_killed_during_init() {
    let root = Root::spawn("127.0.0.1:0".parse().unwrap(), 0x1234_5678).unwrap();
    let id = *root.id();
    let survivor = std::thread::spawn(move || {
        let t = Instant::now();
        let r = Communicator::init_rank_with_config(3, id, 0, cfg(0));
        (r, t.elapsed())
    });
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["child_join_and_wait", "--exact", "--include-ignored", "--nocapture", "--test-threads=1", "-q"])
        .env(common::ROLE_ENV, "child_join_and_wait")
        .env("RANK", "1")
        .env("WORLD_SIZE", "3")
        .env("DEVCOMM_UNIQUE_ID", id.to_string())
        .env("DEVCOMM_RUNTIME", "emulated")
        .env("DEVCOMM_BOOTSTRAP_TIMEOUT_MS", "20000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while root.registered_ranks() < 2 {
        assert!(t.elapsed() < TIMEOUT, "ranks did not join");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let killed_at = Instant::now();
    child.wait().unwrap();
    let (r, elapsed) = survivor.join().unwrap();
    assert!(matches!(&r, Err(Error::RemoteError(m)) if m.contains("rank 1")), "{r:?}");
    assert!(elapsed < TIMEOUT, "survivor took {elapsed:?}");
    assert!(killed_at.elapsed() < Duration::from_secs(2));
    // The root gives up once nobody is connected.
    let t = Instant::now();
    while !root.is_finished() {
        assert!(t.elapsed() < Duration::from_secs(2), "root did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Child: the last rank SIGKILLs itself after init; the others' next
/// bootstrap op fails with RemoteError naming it.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_killed_after_init() {
    if !is_child("child_killed_after_init") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let n = comm.count();
    comm.bootstrap_barrier().unwrap();
    if comm.rank() == n - 1 {
        die_now();
    }
    let t = Instant::now();
    let e = comm.bootstrap_allgather(b"after").unwrap_err();
    assert!(t.elapsed() < TIMEOUT / 2, "took {:?}", t.elapsed());
    let who = format!("rank {} failed", n - 1);
    assert!(matches!(&e, Error::RemoteError(m) if m.contains(&who)), "{e}");
    assert!(matches!(comm.get_async_error(), Err(Error::RemoteError(m)) if m.contains(&who)));
    assert!(comm.abort_flag().load(std::sync::atomic::Ordering::SeqCst));
    // Later ops fail fast too.
    assert!(matches!(comm.bootstrap_barrier(), Err(Error::RemoteError(_))));
}

#[test]
fn rank_killed_after_init() {
    let t = Instant::now();
    let st = run(&child_job("child_killed_after_init", 3).kill_on_failure(false));
    assert_eq!(st[2].signal(), Some(9), "{:?}", st[2]);
    assert!(st[0].success() && st[1].success(), "{st:?}");
    assert!(t.elapsed() < Duration::from_secs(20));
}

/// Child: rank 0 hosts the root (MASTER_ADDR rendezvous, no DEVCOMM_UNIQUE_ID)
/// and dies; rank 1 reports the lost root.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_root_host_dies() {
    if !is_child("child_root_host_dies") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    comm.bootstrap_barrier().unwrap();
    if comm.rank() == 0 {
        die_now();
    }
    let e = comm.bootstrap_barrier().unwrap_err();
    assert!(matches!(&e, Error::RemoteError(_)), "{e}");
    assert!(matches!(comm.get_async_error(), Err(Error::RemoteError(_))));
}

#[test]
fn root_host_killed_after_init() {
    let st = run(&child_job("child_root_host_dies", 2).kill_on_failure(false).host_root(false));
    assert_eq!(st[0].signal(), Some(9), "{:?}", st[0]);
    assert!(st[1].success(), "{:?}", st[1]);
}

/// Only one of two ranks arrives: Timeout after the bootstrap timeout.
#[test]
fn missing_rank_times_out() {
    let id = UniqueId::new().unwrap();
    let t = Instant::now();
    let c = Config::default().with_bootstrap_timeout(Duration::from_millis(400)).with_device(common::emu(0));
    let r = Communicator::init_rank_with_config(2, id, 0, c);
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(t.elapsed() >= Duration::from_millis(400) && t.elapsed() < Duration::from_secs(3));
}

/// Nobody listens at the id's address: Timeout, after retrying.
#[test]
fn unreachable_root_times_out() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let id = UniqueId::from_parts(([127, 0, 0, 1], port).into(), 99);
    let t = Instant::now();
    let c = Config::default().with_bootstrap_timeout(Duration::from_millis(300)).with_device(common::emu(0));
    let r = Communicator::init_rank_with_config(1, id, 0, c);
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
}

/// A collective one rank never calls: Timeout after the op timeout, not a hang.
#[test]
fn collective_not_called_times_out() {
    let devs: Vec<_> = (0..2).map(common::emu).collect();
    let cfg = Config::default().with_bootstrap_timeout(TIMEOUT).with_op_timeout(Duration::from_millis(300));
    let comms = Communicator::init_all_with_config(&devs, cfg).unwrap();
    let t = Instant::now();
    let r = comms[0].bootstrap_barrier();
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
    // The same for finalize.
    assert!(matches!(comms[0].finalize(), Err(Error::Timeout(_))));
}

/// A rank that drops its communicator (destroy) is reported to the others.
#[test]
fn destroyed_peer_is_reported() {
    let devs: Vec<_> = (0..3).map(common::emu).collect();
    let mut comms = Communicator::init_all_with_config(&devs, Config::default().with_timeouts(TIMEOUT)).unwrap();
    drop(comms.remove(1));
    let t = Instant::now();
    let e = comms[0].bootstrap_barrier().unwrap_err();
    assert!(matches!(&e, Error::RemoteError(m) if m.contains("rank 1")), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2));
    // The other survivor hears about it asynchronously.
    while comms[1].get_async_error().is_ok() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(matches!(
        comms[1].get_async_error(),
        Err(Error::RemoteError(m)) if m.contains("rank 1")
    ));
}
