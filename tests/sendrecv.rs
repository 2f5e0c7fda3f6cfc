//! Point-to-point operations of `devcomm::coll` across ranks in separate
//! processes: `send`/`recv`, groups (one launch), `all_to_all_v`. Random
//! data of several types, sizes 0, 1, odd and many chunks (the channels
//! are made tiny: 256-byte chunks, 2 slots, so that long messages wait
//! for their receive), outputs poisoned with guards checked; several
//! sends to one peer in order, send to self, eager sends outside a group,
//! mismatched counts reported on the device (and refused before launch in
//! checking mode), bad input.
//!
//! Runs on the runtime `DEVCOMM_RUNTIME` names (default emulated) with 1,
//! 2, 3, 4 and 8 ranks; on CUDA ranks share the GPUs there are.

mod common;

use common::is_child;
use devcomm::coll::{CollConfig, CollType, Collectives, Operand, P2pKind};
use devcomm::comm::Communicator;
use devcomm::runtime::LaunchConfig;
use devcomm::runtime::{DeviceBuffer, Stream};
use devcomm::Error;
use devcomm_device::coll::P2pOp;
use devcomm_test_kernels::coll_bench::{a2a_value, ll_a2a_exchange, p2p_exchange};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const GUARD: usize = 3;
const POISON: u8 = 0x5A;

/// Tiny channels: 256-byte chunks, 2 slots (eager up to 512 bytes) inside
/// an LSA team, 400-byte chunks and 3 slots over GIN; up to 3 CTAs per
/// operation.
fn tiny() -> CollConfig {
    CollConfig {
        p2p_chunk_bytes: 256,
        p2p_slots: 2,
        p2p_gin_chunk_bytes: 400,
        p2p_gin_slots: 3,
        p2p_max_ctas: 3,
        ..CollConfig::default()
    }
}

/// Message `case` from `src` to `dst`, `len` random elements (never all zero).
fn message<T: CollType + From<u8>>(case: u64, src: usize, dst: usize, len: usize) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(case << 20 ^ (src as u64) << 10 ^ dst as u64);
    (0..len).map(|_| T::from(rng.gen_range(1..=255u8))).collect()
}

/// A buffer of `len` elements with poisoned guards.
fn poisoned<T: CollType>(comm: &Communicator, stream: &Stream, len: usize) -> DeviceBuffer<T> {
    let mut b = comm.device().alloc::<T>(len + 2 * GUARD).unwrap();
    stream.memset(&mut b, POISON).unwrap();
    b
}

/// The elements between the guards, after checking the guards.
fn read_between<T: CollType>(stream: &Stream, b: &DeviceBuffer<T>, what: &str) -> Vec<T> {
    let all = stream.read_vec(b).unwrap();
    let size = std::mem::size_of::<T>();
    let bytes: &[u8] = bytemuck::cast_slice(&all);
    let len = all.len() - 2 * GUARD;
    assert!(
        bytes[..GUARD * size].iter().chain(&bytes[(GUARD + len) * size..]).all(|&x| x == POISON),
        "{what}: bytes around the output were written"
    );
    all[GUARD..GUARD + len].to_vec()
}

struct Ctx<'c> {
    comm: &'c Communicator,
    coll: Collectives<'c>,
    stream: Stream,
    n: usize,
    me: usize,
    case: u64,
}

/// A ring exchange in one group: send to `me + 1`, receive from `me - 1`,
/// `len` elements, and three messages to the same peer in order.
fn ring<T: CollType + From<u8> + std::fmt::Debug>(c: &mut Ctx, len: usize) {
    c.case += 1;
    let (n, me, case) = (c.n, c.me, c.case);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let what = format!("ring {:?} len {len} case {case}", T::DTYPE);
    let sends: Vec<DeviceBuffer<T>> = (0..3usize)
        .map(|k| c.comm.device().alloc_from(&message::<T>(case * 3 + k as u64, me, next, len + k)).unwrap())
        .collect();
    let recvs: Vec<DeviceBuffer<T>> = (0..3).map(|k| poisoned::<T>(c.comm, &c.stream, len + k)).collect();
    c.coll
        .group(&c.stream, |g| {
            for k in 0..3 {
                g.send(&sends[k], next)?;
                g.recv(Operand::range(&recvs[k], GUARD, len + k).unwrap(), prev)?;
            }
            Ok(())
        })
        .unwrap();
    if let Err(e) = c.coll.synchronize(&c.stream) {
        panic!("{what}: {e} (GIN: {:?})", c.coll.dev_comm().gin_error());
    }
    for (k, recv) in recvs.iter().enumerate() {
        let want = message::<T>(case * 3 + k as u64, prev, me, len + k);
        assert_eq!(read_between(&c.stream, recv, &what), want, "{what}: message {k} from {prev}");
    }
}

/// all_to_all_v with random counts (some zero), displacements with gaps,
/// every pair including self.
fn all_to_all_v<T: CollType + From<u8> + std::fmt::Debug>(c: &mut Ctx, most: usize) {
    c.case += 1;
    let (n, me, case) = (c.n, c.me, c.case);
    let what = format!("all_to_all_v {:?} up to {most} case {case}", T::DTYPE);
    // counts[s][r]: the same matrix on every rank.
    let mut rng = StdRng::seed_from_u64(case ^ 0xA11);
    let counts: Vec<Vec<usize>> =
        (0..n).map(|_| (0..n).map(|_| if rng.gen_bool(0.2) { 0 } else { rng.gen_range(1..=most) }).collect()).collect();
    // Displacements leave a gap of 2 elements between blocks.
    let displs = |cs: &[usize]| -> Vec<usize> {
        cs.iter()
            .scan(1usize, |at, &c| {
                let d = *at;
                *at += c + 2;
                Some(d)
            })
            .collect()
    };
    let send_counts = counts[me].clone();
    let send_displs = displs(&send_counts);
    let recv_counts: Vec<usize> = (0..n).map(|s| counts[s][me]).collect();
    let recv_displs = displs(&recv_counts);
    let send_len = send_displs[n - 1] + send_counts[n - 1] + 2;
    let recv_len = recv_displs[n - 1] + recv_counts[n - 1] + 2;
    let mut send_host = vec![T::from(7); send_len];
    for p in 0..n {
        send_host[send_displs[p]..][..send_counts[p]].copy_from_slice(&message::<T>(case, me, p, send_counts[p]));
    }
    let send = c.comm.device().alloc_from(&send_host).unwrap();
    let recv = poisoned::<T>(c.comm, &c.stream, recv_len);
    c.coll
        .all_to_all_v(
            &send,
            &send_counts,
            &send_displs,
            Operand::range(&recv, GUARD, recv_len).unwrap(),
            &recv_counts,
            &recv_displs,
            &c.stream,
        )
        .unwrap();
    c.coll.synchronize(&c.stream).unwrap();
    let got = read_between(&c.stream, &recv, &what);
    let got_bytes: &[u8] = bytemuck::cast_slice(&got);
    let size = std::mem::size_of::<T>();
    let mut covered = vec![false; recv_len];
    for s in 0..n {
        let at = recv_displs[s];
        assert_eq!(got[at..at + recv_counts[s]], message::<T>(case, s, me, recv_counts[s]), "{what}: block from {s}");
        covered[at..at + recv_counts[s]].iter_mut().for_each(|x| *x = true);
    }
    // The gaps between blocks keep their poison.
    for (i, cov) in covered.iter().enumerate() {
        if !cov {
            assert!(
                got_bytes[i * size..(i + 1) * size].iter().all(|&x| x == POISON),
                "{what}: gap element {i} written"
            );
        }
    }
}

/// Eager sends outside a group: each rank sends a short message to every
/// peer (itself included), then receives them, each a group of one.
fn eager(c: &mut Ctx) {
    c.case += 1;
    let (n, me, case) = (c.n, c.me, c.case);
    // Up to 2 slots of 256 bytes: eager.
    let len = 100;
    let sends: Vec<_> =
        (0..n).map(|p| c.comm.device().alloc_from(&message::<u32>(case, me, p, len)).unwrap()).collect();
    for (p, s) in sends.iter().enumerate() {
        c.coll.send(s, p, &c.stream).unwrap();
    }
    for p in 0..n {
        let out = poisoned::<u32>(c.comm, &c.stream, len);
        c.coll.recv(Operand::range(&out, GUARD, len).unwrap(), p, &c.stream).unwrap();
        c.coll.synchronize(&c.stream).unwrap();
        assert_eq!(read_between(&c.stream, &out, "eager"), message::<u32>(case, p, me, len), "eager from {p}");
    }
}

/// A kernel of the tests' own calls `coll::send` and `coll::recv` (one
/// CTA each) on the collectives' context, with sequence numbers from
/// `reserve_p2p`: a ring exchange of a message longer than the channel's
/// slots (the two CTAs must run at once).
fn device_callable(c: &mut Ctx) {
    c.case += 1;
    let (n, me, case) = (c.n, c.me, c.case);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let len = 777;
    let bytes = (len * 4) as u64;
    let src = c.comm.device().alloc_from(&message::<u32>(case, me, next, len)).unwrap();
    let dst = poisoned::<u32>(c.comm, &c.stream, len);
    let errors = c.comm.device().alloc_from(&[0u32]).unwrap();
    let send = P2pOp {
        ptr: src.device_addr(),
        bytes,
        first_seq: c.coll.reserve_p2p(P2pKind::Send, next, bytes).unwrap(),
        peer: next as u32,
        kind: P2pKind::Send as u32,
    };
    let recv = P2pOp {
        ptr: dst.device_addr() + (GUARD * 4) as u64,
        bytes,
        first_seq: c.coll.reserve_p2p(P2pKind::Recv, prev, bytes).unwrap(),
        peer: prev as u32,
        kind: P2pKind::Recv as u32,
    };
    let kernels = devcomm_tests::test_kernels(c.comm.device());
    // SAFETY: the context is the live collectives'; `src` and `dst` hold
    // `bytes` (past the guard); the sequence numbers were reserved above
    // and the peers reserve theirs alike; `errors` is a device u32.
    unsafe {
        c.stream
            .launch_in::<p2p_exchange>(
                &kernels,
                LaunchConfig::new(2, 64).co_resident(),
                (c.coll.context(), send, recv, errors.device_addr()),
            )
            .unwrap();
    }
    c.stream.synchronize().unwrap();
    assert_eq!(c.stream.read_vec(&errors).unwrap(), vec![0], "device-callable send/recv reported an error");
    assert_eq!(read_between(&c.stream, &dst, "device-callable"), message::<u32>(case, prev, me, len));
}

/// The LL all-to-all session from a kernel of the tests' own: 5 epochs
/// (both parities, twice), 2 blocks, every rank sends a distinct value to
/// every rank's slot and broadcasts one; each receives them all and the
/// lane-wise sum of the broadcasts.
fn ll_a2a(c: &mut Ctx) {
    // The session's ranks are the LSA team's.
    let (n, me) = (c.coll.context().scratch().lsa_size(), c.coll.context().scratch().lsa_rank());
    let (blocks, nt, epochs) = (2u32, 64u32, 5u32);
    let len = (epochs * blocks * n * nt * 3) as usize;
    let out = c.comm.device().alloc::<u64>(len).unwrap();
    let errors = c.comm.device().alloc_from(&[0u32]).unwrap();
    let kernels = devcomm_tests::test_kernels(c.comm.device());
    // SAFETY: the live collectives' context (2048 slots >= 2 * n * nt, 64
    // parts); `out` holds every output; every rank launches alike.
    unsafe {
        c.stream
            .launch_in::<ll_a2a_exchange>(
                &kernels,
                LaunchConfig::new(blocks, nt).co_resident(),
                (c.coll.context(), out.as_mut_ptr(), epochs, errors.device_addr()),
            )
            .unwrap();
    }
    c.stream.synchronize().unwrap();
    assert_eq!(c.stream.read_vec(&errors).unwrap(), vec![0], "LL all-to-all session reported an error");
    let got = c.stream.read_vec(&out).unwrap();
    for e in 0..epochs {
        for b in 0..blocks {
            for t in 0..nt {
                let mut lanes = [0u32; 2];
                for s in 0..n {
                    let v = a2a_value(e, s, 0xff, b, t);
                    lanes[0] = lanes[0].wrapping_add(v as u32);
                    lanes[1] = lanes[1].wrapping_add((v >> 32) as u32);
                }
                let sum = lanes[0] as u64 | (lanes[1] as u64) << 32;
                for s in 0..n {
                    let at = ((((e * blocks + b) * n + s) * nt + t) * 3) as usize;
                    let want = [a2a_value(e, s, me, b, t), a2a_value(e, s, 0xff, b, t), sum];
                    assert_eq!(got[at..at + 3], want, "LL all-to-all epoch {e} block {b} source {s} thread {t}");
                }
            }
        }
    }
}

/// Bad input: typed errors, nothing launched.
fn bad_input(c: &mut Ctx) {
    let n = c.n;
    let a = c.comm.device().alloc::<f32>(10).unwrap();
    let inv = |r: devcomm::Result<()>, what: &str| match r {
        Err(Error::InvalidArgument(m)) => assert!(!m.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    inv(c.coll.send(&a, n, &c.stream), "send to a peer out of range");
    inv(c.coll.recv(&a, n + 5, &c.stream), "recv from a peer out of range");
    let counts = vec![1; n];
    let displs: Vec<usize> = (0..n).collect();
    inv(c.coll.all_to_all_v(&a, &counts[1..], &displs, &a, &counts, &displs, &c.stream), "short counts");
    let far: Vec<usize> = vec![10; n];
    inv(c.coll.all_to_all_v(&a, &counts, &far, &a, &counts, &displs, &c.stream), "send range past the end");
    inv(
        c.coll.group(&c.stream, |g| {
            for _ in 0..=devcomm_device::coll::MAX_GROUP_OPS {
                g.send(&a, 0)?;
            }
            Ok(())
        }),
        "too many operations in a group",
    );
}

fn child_body(comm: &Communicator) {
    let coll = comm.collectives_with(&tiny()).unwrap();
    // Several LSA teams: the channels to other teams go over GIN.
    assert_eq!(coll.context().has_p2p_gin(), comm.lsa_size().unwrap() < comm.count());
    let stream = comm.device().new_stream().unwrap();
    let mut c = Ctx { comm, coll, stream, n: comm.count(), me: comm.rank(), case: 0 };
    let quick = std::env::var("DEVCOMM_COLL_TEST_QUICK").is_ok();
    for len in [0, 1, 37, 1000] {
        ring::<u8>(&mut c, len);
        ring::<f32>(&mut c, len);
    }
    if !quick {
        ring::<f64>(&mut c, 333);
        ring::<bf16>(&mut c, 777);
        ring::<u8>(&mut c, 5000);
    }
    for most in [1, 70, 600] {
        all_to_all_v::<u32>(&mut c, most);
    }
    if !quick {
        all_to_all_v::<u8>(&mut c, 1001);
        all_to_all_v::<bf16>(&mut c, 300);
    }
    eager(&mut c);
    device_callable(&mut c);
    ll_a2a(&mut c);
    ll_a2a(&mut c);
    // The host's operations continue the channels after the kernel's.
    ring::<u32>(&mut c, 300);
    bad_input(&mut c);
    c.stream.synchronize().unwrap();
    assert!(c.coll.error().is_none(), "{:?}", c.coll.error());
    drop(c);
    comm.finalize().unwrap();
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_sendrecv() {
    if !is_child("child_sendrecv") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_body(&comm);
}

/// Device waits get 60 s: 8 emulated ranks on a 2-core machine are slow.
fn slow() -> Vec<(&'static str, String)> {
    vec![("DEVCOMM_OP_TIMEOUT_MS", "60000".to_string())]
}

#[test]
fn sendrecv_1_rank() {
    common::run_on_runtime("child_sendrecv", 1, &slow());
}

#[test]
fn sendrecv_2_ranks() {
    common::run_on_runtime("child_sendrecv", 2, &slow());
}

#[test]
fn sendrecv_3_ranks() {
    common::run_on_runtime("child_sendrecv", 3, &slow());
}

#[test]
fn sendrecv_4_ranks() {
    common::run_on_runtime("child_sendrecv", 4, &slow());
}

/// Several LSA teams: channels to the other teams' ranks go over GIN
/// (copy engine), 2 teams of 2.
#[test]
fn sendrecv_4_ranks_in_two_lsa_teams() {
    let mut env = slow();
    env.push(("DEVCOMM_LSA_SIZE", "2".to_string()));
    env.push(("DEVCOMM_COLL_TEST_QUICK", "1".to_string()));
    common::run_on_runtime("child_sendrecv", 4, &env);
}

/// Every rank its own LSA team, GIN over TCP.
#[test]
fn sendrecv_3_ranks_over_gin_tcp() {
    let mut env = slow();
    env.push(("DEVCOMM_LSA_SIZE", "1".to_string()));
    env.push(("DEVCOMM_GIN_TRANSPORT", "tcp".to_string()));
    env.push(("DEVCOMM_COLL_TEST_QUICK", "1".to_string()));
    common::run_on_runtime("child_sendrecv", 3, &env);
}

/// Every rank its own LSA team, GIN over the copy engine, the full battery.
#[test]
fn sendrecv_2_ranks_over_gin() {
    let mut env = slow();
    env.push(("DEVCOMM_LSA_SIZE", "1".to_string()));
    common::run_on_runtime("child_sendrecv", 2, &env);
}

#[test]
fn sendrecv_8_ranks() {
    let mut env = slow();
    if common::runtime() != "cuda" {
        env.push(("DEVCOMM_COLL_TEST_QUICK", "1".to_string()));
    }
    common::run_on_runtime("child_sendrecv", 8, &env);
}

/// A receive whose count differs from the send's: the receiver's device
/// reports it (sticky, on the next call), nothing is written past its
/// buffer; in checking mode the group is refused on every rank before
/// anything runs.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_sendrecv_mismatch() {
    if !is_child("child_sendrecv_mismatch") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let stream = comm.device().new_stream().unwrap();
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    // Checking mode: refused everywhere, then matching groups still run.
    {
        let coll = comm.collectives_with(&CollConfig { check_arguments: true, ..tiny() }).unwrap();
        let x = comm.device().alloc_from(&vec![1u32; 10 + me]).unwrap();
        let y = comm.device().alloc::<u32>(10).unwrap();
        match coll.group(&stream, |g| {
            g.send(&x, peer)?;
            g.recv(&y, peer)
        }) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("do not match"), "{m}"),
            other => panic!("mismatched send/recv in checking mode: expected InvalidArgument, got {other:?}"),
        }
        let x = comm.device().alloc_from(&[me as u32 + 1; 10]).unwrap();
        coll.group(&stream, |g| {
            g.send(&x, peer)?;
            g.recv(&y, peer)
        })
        .unwrap();
        coll.synchronize(&stream).unwrap();
        assert_eq!(stream.read_vec(&y).unwrap(), vec![peer as u32 + 1; 10]);
    }
    // Without checking: rank 0 sends 12 elements, rank 1 expects 9.
    let coll = comm.collectives_with(&tiny()).unwrap();
    if me == 0 {
        let x = comm.device().alloc_from(&[3u32; 12]).unwrap();
        coll.send(&x, 1, &stream).unwrap();
        coll.synchronize(&stream).unwrap();
    } else {
        let out = poisoned::<u32>(&comm, &stream, 9);
        coll.recv(Operand::range(&out, GUARD, 9).unwrap(), 0, &stream).unwrap();
        match coll.synchronize(&stream) {
            Err(e) => assert!(e.to_string().contains("count"), "{e}"),
            Ok(()) => panic!("a receive of 9 elements matched a send of 12"),
        }
        let got = read_between(&stream, &out, "mismatched recv");
        assert!(bytemuck::cast_slice::<u32, u8>(&got).iter().all(|&b| b == POISON), "mismatched recv wrote data");
        // Sticky: the next call returns it too.
        assert!(coll.recv(Operand::range(&out, GUARD, 9).unwrap(), 0, &stream).is_err());
    }
    comm.bootstrap_barrier().unwrap();
    drop(coll);
    comm.finalize().unwrap();
}

#[test]
fn sendrecv_mismatched_counts_are_errors() {
    common::run_on_runtime("child_sendrecv_mismatch", 2, &[]);
}

#[test]
fn sendrecv_mismatched_counts_over_gin_are_errors() {
    common::run_on_runtime("child_sendrecv_mismatch", 2, &[("DEVCOMM_LSA_SIZE", "1".to_string())]);
}
