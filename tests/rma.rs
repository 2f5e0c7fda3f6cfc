//! Host RMA (`devcomm::rma`: NCCL's `ncclPutSignal` / `ncclSignal` /
//! `ncclWaitSignal`) across ranks in separate processes: put_signal of every
//! size class (one element, odd sizes, more than one staging chunk) at odd
//! offsets, from device buffers and from windows, on two contexts; waits on
//! every peer at once; host signals mixed with device-side GIN signals on
//! the same words, a kernel waiting for host put_signals; bad input as
//! typed errors; a wait nobody answers as a kept `Timeout`. Each case runs
//! with one LSA team (puts from 4 KiB as direct stream copies into the
//! peer's window, smaller ones as one SM-copy kernel; also every put by the
//! copy engine, every put by SM copy, and every put through the proxy's
//! copy-engine transport),
//! with every rank its own node (`DEVCOMM_LSA_SIZE=1`), and over TCP
//! (`DEVCOMM_GIN_TRANSPORT=tcp`).

mod common;

use common::{is_child, run_on_runtime};
use devcomm::comm::Communicator;
use devcomm::rma::{HostRma, RmaConfig, RmaSource, WaitSignal};
use devcomm::runtime::{LaunchConfig, Stream};
use devcomm::{Error, Window, WindowFlags};
use devcomm_test_kernels::rma::{rma_device_signal, rma_device_wait, rma_read_shadows};
use devcomm_tests::test_kernels;
use rand::{Rng, SeedableRng};

/// Bytes of the region each sender owns in every receiver's window.
const REGION: usize = 200_000;
/// Staging chunk: sources of more than this many bytes take several chunks.
const STAGE: usize = 65_536;
/// Poison of destinations.
const POISON: u8 = 0xA7;

fn cases(child: &str, n: usize, lsa1: bool, tcp: bool) {
    cases_with(child, n, lsa1, tcp, None);
}

/// As [`cases`], with the thresholds of the direct paths within the node:
/// (`DEVCOMM_RMA_SM_COPY_MAX_BYTES`, `DEVCOMM_RMA_DIRECT_MIN_BYTES`).
fn cases_with(child: &str, n: usize, lsa1: bool, tcp: bool, direct: Option<(usize, usize)>) {
    // Generous timeouts: ranks of a loaded 2-core CI machine can be seconds apart.
    let mut env =
        vec![("DEVCOMM_OP_TIMEOUT_MS", "30000".to_string()), ("DEVCOMM_BOOTSTRAP_TIMEOUT_MS", "30000".to_string())];
    if let Some((sm, ce)) = direct {
        env.push(("DEVCOMM_RMA_SM_COPY_MAX_BYTES", sm.to_string()));
        env.push(("DEVCOMM_RMA_DIRECT_MIN_BYTES", ce.to_string()));
    }
    if lsa1 {
        env.push(("DEVCOMM_LSA_SIZE", "1".to_string()));
    }
    if tcp {
        env.push(("DEVCOMM_GIN_TRANSPORT", "tcp".to_string()));
    }
    run_on_runtime(child, n, &env);
}

/// The random elements rank `from` sends to rank `to` in round `round`.
fn data(from: usize, to: usize, round: usize, len: usize) -> Vec<u32> {
    let mut rng =
        rand::rngs::StdRng::seed_from_u64(0x5157 ^ ((from as u64) << 8) ^ ((to as u64) << 16) ^ ((round as u64) << 24));
    (0..len).map(|_| rng.gen::<u32>() | 1).collect()
}

/// The device-side shadows of host signal `signal` from every rank: how many
/// signal operations waits have consumed.
fn shadows(rma: &HostRma<'_>, stream: &Stream, kernels: &devcomm::Module, signal: u32) -> Vec<u64> {
    let n = rma.comm().count();
    let dev = rma.comm().device();
    let ids: Vec<u32> = (0..n).map(|p| rma.gin_signal(signal, p).unwrap()).collect();
    let ids = dev.alloc_from(&ids).unwrap();
    let out = dev.alloc_from(&vec![u64::MAX; n]).unwrap();
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    // SAFETY: the HostRma's live device communicator; `ids` and `out` hold `n`
    // elements, `errors` two; all outlive the launch (read after the stream
    // is synchronised).
    unsafe {
        stream
            .launch_in::<rma_read_shadows>(
                kernels,
                LaunchConfig::new(1, 1),
                (rma.dev_comm().dev_comm(), ids.as_ptr(), n as u32, out.as_mut_ptr(), errors.as_mut_ptr()),
            )
            .unwrap()
    };
    errors_ok(stream, &errors, "rma_read_shadows");
    stream.read_vec(&out).unwrap()
}

fn errors_ok(stream: &Stream, errors: &devcomm::DeviceBuffer<u32>, what: &str) {
    let e = stream.read_vec(errors).unwrap();
    assert_eq!(e[0], 0, "{what}: device error code {} ({} errors)", e[0], e[1]);
}

/// (elements, element offset in the region, source from a window) per round:
/// one element, odd sizes, one at exactly a staging chunk, more than one chunk.
const ROUNDS: [(usize, usize, bool); 9] = [
    (0, 4, false), // nothing to put: the signal alone
    (1, 0, false),
    (1, 7, true),
    (3, 1, false),
    (2, 5, true), // 8 bytes: the largest inline put
    (1001, 13, false),
    (STAGE / 4, 3, false),
    (16_411, 9, false), // 65 644 bytes: two chunks
    (40_009, 2, true),
];

fn child_body(comm: &Communicator) {
    let (n, me) = (comm.count(), comm.rank());
    let dev = comm.device().clone();
    let kernels = test_kernels(&dev);
    let stream = dev.new_stream().unwrap();
    // Window: n regions (one per sender), then this rank's window source area.
    let src_area = n * REGION;
    let total = src_area + REGION;
    let mem = comm.mem_alloc(total).unwrap();
    let win = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let config = RmaConfig { signals: 2, contexts: 2, stage_bytes: STAGE, ..RmaConfig::default() };
    let rma = comm.host_rma_with(&[&win], &config).unwrap();
    assert_eq!(rma.dev_comm().gin_type(), devcomm::GinType::Proxy);

    // 1. put_signal of every size class, from every rank to every rank
    // (itself included), each receiver waiting on all senders at once.
    for (round, &(len, offset, from_window)) in ROUNDS.iter().enumerate() {
        win.write(&stream, 0, &vec![POISON; src_area]).unwrap();
        stream.synchronize().unwrap();
        comm.bootstrap_barrier().unwrap();
        // Keep the device buffers alive until the stream has passed the puts.
        let mut bufs = Vec::new();
        for k in 0..n {
            let to = (me + k) % n; // every rank starts with a different peer
            let x = data(me, to, round, len);
            let context = ((round + k) % 2) as u32;
            // Element offset of the sender's region plus the round's odd offset.
            let dst = me * REGION / 4 + offset;
            if from_window {
                let at = src_area / 4 + (to % 3);
                win.write(&stream, at * 4, &x).unwrap();
                let src = RmaSource::<u32>::window(&win, at, len).unwrap();
                rma.put_signal_on(src, to, &win, dst, 0, context, &stream).unwrap();
                // The source area is rewritten for the next peer: wait until
                // this put has read it (the stream passed it).
                stream.synchronize().unwrap();
            } else {
                let b = dev.alloc_from(&x).unwrap();
                rma.put_signal_on(&b, to, &win, dst, 0, context, &stream).unwrap();
                bufs.push(b);
            }
        }
        let waits: Vec<WaitSignal> =
            (0..n).map(|p| WaitSignal { peer: p, op_count: 1, signal: 0, context: 0 }).collect();
        rma.wait_signal(&waits, &stream).unwrap();
        rma.synchronize(&stream).unwrap_or_else(|e| panic!("round {round} ({len} elements): {e}"));
        for from in 0..n {
            let mut got = vec![0u8; REGION];
            win.read(&stream, from * REGION, &mut got).unwrap();
            let want: Vec<u8> = bytemuck::cast_slice(&data(from, me, round, len)).to_vec();
            let (a, b) = (offset * 4, offset * 4 + len * 4);
            assert!(got[..a].iter().all(|&v| v == POISON), "round {round}: bytes before the put from {from} changed");
            assert_eq!(&got[a..b], &want[..], "round {round}: {len} elements from rank {from} at element {offset}");
            assert!(got[b..].iter().all(|&v| v == POISON), "round {round}: bytes after the put from {from} changed");
        }
        drop(bufs);
        comm.bootstrap_barrier().unwrap();
    }

    // 2. Host signals mixed with device-side GIN signals on the same words:
    // every rank's kernel signals every peer twice on the GIN id of host
    // signal 1 from this rank, then the host signals once more; each
    // receiver's host waits for 3 from every sender at once.
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    let dc = rma.dev_comm().dev_comm();
    for to in 0..n {
        let id = rma.gin_signal(1, me).unwrap();
        // SAFETY: `dc` is the HostRma's live device communicator with GIN, `id`
        // one of its signals; `errors` holds two u32s and outlives the launch
        // (read after the stream is synchronised).
        unsafe {
            stream
                .launch_in::<rma_device_signal>(
                    &kernels,
                    LaunchConfig::new(1, 1),
                    (dc, to as u32, id, 2u32, errors.as_mut_ptr()),
                )
                .unwrap()
        };
        rma.signal(to, 1, &stream).unwrap();
    }
    // Three entries of one operation per sender (9 or 12 entries with 3 or 4
    // ranks: more than one wait kernel's list, split on the stream).
    let waits: Vec<WaitSignal> = (0..3)
        .flat_map(|k| (0..n).map(move |p| WaitSignal { peer: p, op_count: 1, signal: 1, context: (k % 2) as u32 }))
        .collect();
    rma.wait_signal(&waits, &stream).unwrap();
    rma.synchronize(&stream).unwrap();
    errors_ok(&stream, &errors, "rma_device_signal");
    comm.bootstrap_barrier().unwrap();
    for p in 0..n {
        let v = rma.dev_comm().read_gin_signal(rma.gin_signal(1, p).unwrap()).unwrap();
        assert_eq!(v, 3, "signal 1 from rank {p}: two device signals and one host signal");
    }
    assert_eq!(shadows(&rma, &stream, &kernels, 1), vec![3; n], "signal 1: every entry of the long wait list consumed");
    assert_eq!(shadows(&rma, &stream, &kernels, 0), vec![ROUNDS.len() as u64; n], "signal 0: one per round");

    // 3. A kernel waits for host put_signals (and consumes them as the
    // host's wait_signal does: the next host wait counts from there).
    win.write(&stream, 0, &vec![POISON; src_area]).unwrap();
    stream.synchronize().unwrap();
    comm.bootstrap_barrier().unwrap();
    let len = 777;
    let mut bufs = Vec::new();
    for to in 0..n {
        let b = dev.alloc_from(&data(me, to, 99, len)).unwrap();
        rma.put_signal(&b, to, &win, me * REGION / 4, 0, &stream).unwrap();
        bufs.push(b);
    }
    for from in 0..n {
        let id = rma.gin_signal(0, from).unwrap();
        // SAFETY: as for `rma_device_signal` above.
        unsafe {
            stream
                .launch_in::<rma_device_wait>(&kernels, LaunchConfig::new(1, 1), (dc, id, 1u64, errors.as_mut_ptr()))
                .unwrap()
        };
    }
    // Then one more host signal on signal 0 from every rank, waited by the host:
    // the kernel's consumption must leave exactly this one to wait for.
    for to in 0..n {
        rma.signal(to, 0, &stream).unwrap();
    }
    let waits: Vec<WaitSignal> = (0..n).map(|p| WaitSignal::new(p, 1)).collect();
    rma.wait_signal(&waits, &stream).unwrap();
    rma.synchronize(&stream).unwrap();
    errors_ok(&stream, &errors, "rma_device_wait");
    let consumed = ROUNDS.len() as u64 + 2; // the rounds, the kernel's wait, the host's
    assert_eq!(
        shadows(&rma, &stream, &kernels, 0),
        vec![consumed; n],
        "signal 0 after the kernel's and the host's waits"
    );
    for from in 0..n {
        let mut got = vec![0u32; len];
        win.read(&stream, from * REGION, &mut got).unwrap();
        assert_eq!(got, data(from, me, 99, len), "put_signal waited for by a kernel, from rank {from}");
    }
    drop(bufs);
    comm.bootstrap_barrier().unwrap();
    bad_input(comm, &rma, &win, &stream);
    rma.destroy().unwrap();
}

fn is_invalid(r: devcomm::Result<()>, what: &str) {
    match r {
        Err(Error::InvalidArgument(m)) => assert!(!m.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

fn bad_input(comm: &Communicator, rma: &HostRma<'_>, win: &Window<'_>, stream: &Stream) {
    let n = comm.count();
    let dev = comm.device();
    let b = dev.alloc_from(&[5u32; 10]).unwrap();
    let words = win.size() / 4;
    is_invalid(rma.put_signal(&b, n, win, 0, 0, stream), "peer out of range");
    is_invalid(rma.put_signal(&b, 0, win, 0, 2, stream), "signal out of range");
    is_invalid(rma.put_signal_on(&b, 0, win, 0, 0, 2, stream), "context out of range");
    is_invalid(rma.put_signal(&b, 0, win, words - 9, 0, stream), "offset + len past the window");
    is_invalid(rma.put_signal(&b, 0, win, usize::MAX / 2, 0, stream), "offset overflowing");
    let me = comm.rank();
    is_invalid(
        rma.put_signal(RmaSource::<u32>::window(win, 100, 10).unwrap(), me, win, 105, 0, stream),
        "a put to oneself overlapping its source",
    );
    is_invalid(RmaSource::range(&b, 3, 8).map(|_| ()), "source range past the buffer");
    is_invalid(RmaSource::<u32>::window(win, words - 1, 2).map(|_| ()), "source past its window");
    is_invalid(rma.signal(n, 0, stream), "signal: peer out of range");
    is_invalid(rma.signal(0, 7, stream), "signal: signal out of range");
    is_invalid(rma.wait_signal(&[WaitSignal::new(n, 1)], stream), "wait: peer out of range");
    is_invalid(
        rma.wait_signal(&[WaitSignal { peer: 0, op_count: 1, signal: 2, context: 0 }], stream),
        "wait: signal out of range",
    );
    is_invalid(
        rma.wait_signal(&[WaitSignal { peer: 0, op_count: 1, signal: 0, context: 5 }], stream),
        "wait: context out of range",
    );
    is_invalid(rma.gin_signal(0, n).map(|_| ()), "gin_signal: rank out of range");
    // A window not passed to host_rma (collective registration on every rank).
    let mem = comm.mem_alloc(4096).unwrap();
    let other = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    is_invalid(rma.put_signal(&b, 0, &other, 0, 0, stream), "window not declared");
    // Configs out of range.
    for (cfg, what) in [
        (RmaConfig { signals: 0, ..RmaConfig::default() }, "no signals"),
        (RmaConfig { contexts: 0, ..RmaConfig::default() }, "no contexts"),
        (RmaConfig { stage_bytes: 100, ..RmaConfig::default() }, "stage_bytes not a multiple of 16"),
    ] {
        is_invalid(comm.host_rma_with(&[win], &cfg).map(|_| ()), what);
    }
    // Nothing was queued by the refused calls: the object still works.
    rma.synchronize(stream).unwrap();
    comm.bootstrap_barrier().unwrap();
    other.deregister().unwrap();
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_rma() {
    if !is_child("child_rma") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_body(&comm);
}

#[test]
fn rma_2_ranks() {
    cases("child_rma", 2, false, false);
}

#[test]
fn rma_3_ranks() {
    cases("child_rma", 3, false, false);
}

/// Every put to another GPU of the node through the copy-engine direct path
/// (a stream copy into the peer's window, then the signal), even one byte.
#[test]
fn rma_3_ranks_copy_engine_always() {
    cases_with("child_rma", 3, false, false, Some((0, 1)));
}

/// Every put to another GPU of the node through the SM-copy direct path (one
/// kernel: stores into the peer's window, release, signal), even 160 KB.
#[test]
fn rma_3_ranks_sm_copy_always() {
    cases_with("child_rma", 3, false, false, Some((usize::MAX, usize::MAX)));
}

/// No direct path: every put through the proxy, also within the node.
#[test]
fn rma_2_ranks_proxy_only() {
    cases_with("child_rma", 2, false, false, Some((0, usize::MAX)));
}

#[test]
fn rma_2_ranks_lsa1() {
    cases("child_rma", 2, true, false);
}

#[test]
fn rma_4_ranks_lsa1() {
    cases("child_rma", 4, true, false);
}

#[test]
fn rma_2_ranks_tcp() {
    cases("child_rma", 2, true, true);
}

#[test]
fn rma_3_ranks_tcp() {
    cases("child_rma", 3, true, true);
}

/// Each rank waits for a signal the other never sends: the wait times out on
/// the device (no hang), and the error is kept and returned by every later call.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_rma_timeout() {
    if !is_child("child_rma_timeout") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let mem = comm.mem_alloc(4096).unwrap();
    let win = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let rma = comm.host_rma(&[&win]).unwrap();
    let stream = comm.device().stream();
    {
        let start = std::time::Instant::now();
        rma.wait_signal(&[WaitSignal::new(1 - comm.rank(), 1)], stream).unwrap();
        match rma.synchronize(stream) {
            Err(Error::Timeout(_)) => {}
            other => panic!("a wait nobody answers: expected Timeout, got {other:?}"),
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "the wait took {:?}", start.elapsed());
        let b = comm.device().alloc_from(&[1u8]).unwrap();
        assert!(
            matches!(rma.put_signal(&b, 1 - comm.rank(), &win, 0, 0, stream), Err(Error::Timeout(_))),
            "the error is kept"
        );
        assert!(matches!(rma.error(), Some(Error::Timeout(_))));
    }
    comm.bootstrap_barrier().unwrap();
}

#[test]
fn rma_wait_times_out_with_a_kept_error() {
    run_on_runtime("child_rma_timeout", 2, &[("DEVCOMM_OP_TIMEOUT_MS", "1000".to_string())]);
}
