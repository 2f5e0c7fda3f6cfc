//! GIN failures that must end as errors, never as silent stalls, across
//! ranks in separate processes (every rank its own node, TCP transport):
//!
//! * a device producer whose wait for ring credit times out leaves the
//!   ticket it took unwritten (its peer is frozen, the proxy blocked in a
//!   TCP write); once the peer thaws, the proxy must fail the ring at that
//!   hole — a later put's flush ends with `RingFailed` at once, not with a
//!   timeout, and `gin_error()` / the communicator's `get_async_error()`
//!   say why.

mod common;

use common::{is_child, run_on_runtime};
use devcomm::comm::{Communicator, Config};
use devcomm::gin::GinConnectionType;
use devcomm::runtime::LaunchConfig;
use devcomm::{DevCommRequirements, Error, WindowFlags};
use devcomm_device::error::DeviceError;
use devcomm_test_kernels::gin::gin_put_stream;
use devcomm_tests::test_kernels;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// Rank 0's op timeout: its device waits give up after this.
const SHORT: Duration = Duration::from_millis(1500);
/// Bytes per put: a few dozen fill any TCP socket buffer of a frozen peer.
const PUT_BYTES: u64 = (1 << 20) + 13;

/// The state letter of process `pid` (`/proc/pid/stat`), e.g. `T` when stopped.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Child: rank 1 freezes itself (SIGSTOP) once the device communicators
/// exist; rank 0 streams large puts to it with a short op timeout until
/// a credit wait gives up (the proxy is blocked writing to the frozen
/// peer), thaws rank 1 (SIGCONT), then puts once more and flushes.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_gin_abandoned_ticket() {
    if !is_child("child_gin_abandoned_ticket") {
        return;
    }
    let mut cfg = Config::from_env().unwrap();
    let me: usize = std::env::var("RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if me == 0 {
        cfg = cfg.with_op_timeout(SHORT);
    }
    let comm = Communicator::init_from_env_with_config(cfg).unwrap();
    assert_eq!(comm.rank(), me);
    let dev = comm.device().clone();
    let stream = dev.new_stream().unwrap();
    let kernels = test_kernels(&dev);
    let mem = comm.mem_alloc(PUT_BYTES as usize).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5709 + me as u64);
    let data: Vec<u8> = (0..PUT_BYTES).map(|_| rng.gen()).collect();
    mem.write(dev.stream(), 0, &data).unwrap();
    dev.stream().synchronize().unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    req.gin_connection_type = GinConnectionType::Full;
    req.gin_signal_count = 1;
    req.gin_queue_depth = 2;
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req).unwrap();
    let pids = comm.bootstrap_allgather(&std::process::id().to_le_bytes()).unwrap();
    if me == 1 {
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP).unwrap();
        // Thawed by rank 0.
        comm.bootstrap_barrier().unwrap();
        assert!(handle.gin_error().is_none(), "{:?}", handle.gin_error());
        handle.destroy().unwrap();
        comm.finalize().unwrap();
        return;
    }
    let peer = i32::from_le_bytes(pids[1][..4].try_into().unwrap());
    let t = Instant::now();
    while proc_state(peer) != Some('T') {
        assert!(t.elapsed() < Duration::from_secs(20), "rank 1 (pid {peer}) did not stop: {:?}", proc_state(peer));
        std::thread::sleep(Duration::from_millis(5));
    }
    let launch = |count: u32, flush: u32| {
        let codes = dev.alloc_from(&[u32::MAX; 2]).unwrap();
        // SAFETY: the window holds PUT_BYTES; peer 1 of 2 ranks; `codes` holds 2 words; one thread.
        unsafe {
            stream
                .launch_in::<gin_put_stream>(
                    &kernels,
                    LaunchConfig::new(1, 1),
                    (handle.dev_comm(), window.desc(), 1u32, PUT_BYTES, count, flush, codes.as_mut_ptr()),
                )
                .unwrap()
        };
        let got = stream.read_vec(&codes).unwrap();
        (got[0], got[1])
    };
    // Far more than the socket buffers hold: a credit wait times out while
    // the proxy is blocked writing to the frozen peer.
    let (code, posted) = launch(256, 0);
    eprintln!("stream to a frozen peer: device error {code} after {posted} puts, {:?}", t.elapsed());
    assert_eq!(code, DeviceError::Timeout.code(), "a credit wait must time out ({posted} posted)");
    assert!(posted < 256);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(peer), nix::sys::signal::Signal::SIGCONT).unwrap();
    // One more put and a flush: the ticket given up above is a hole the
    // proxy can never serve past in order. The flush must say so at once.
    let t = Instant::now();
    let (code, posted) = launch(1, 1);
    eprintln!("put + flush after the hole: device error {code} ({posted} posted), {:?}", t.elapsed());
    assert_eq!(code, DeviceError::RingFailed.code(), "the flush must end with the ring's failure, not a timeout");
    assert!(t.elapsed() < SHORT, "took {:?}: a timeout, not the ring's failure", t.elapsed());
    // The proxy reaches the hole once the peer has taken what came before it.
    let t = Instant::now();
    let why = loop {
        if let Some(e) = handle.gin_error() {
            break e;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the proxy never reported the abandoned ticket");
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!("gin_error: {why}");
    assert!(matches!(&why, Error::Timeout(m) if m.contains("gave up ticket")), "{why:?}");
    // The communicator reports it too, while the device communicator lives.
    assert_eq!(comm.get_async_error(), Err(why.clone()));
    comm.bootstrap_barrier().unwrap();
    // Destroy returns it; afterwards the communicator no longer does.
    assert_eq!(handle.destroy(), Err(why));
    assert_eq!(comm.get_async_error(), Ok(()));
    comm.finalize().unwrap();
}

#[test]
fn gin_abandoned_ticket_fails_the_ring_not_a_timeout() {
    let env = [
        ("DEVCOMM_LSA_SIZE", "1".to_string()),
        ("DEVCOMM_GIN_TRANSPORT", "tcp".to_string()),
        ("DEVCOMM_OP_TIMEOUT_MS", "10000".to_string()),
    ];
    run_on_runtime("child_gin_abandoned_ticket", 2, &env);
}
