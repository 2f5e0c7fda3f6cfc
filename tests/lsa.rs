//! The LSA device API across ranks in separate processes: puts to every
//! peer, put_value, reductions of every type and operator, barriers, signal
//! waits, and the error paths (barrier index out of range, timeout, abort,
//! a peer that dies while a kernel waits on it).
//!
//! Runs on the runtime `DEVCOMM_RUNTIME` names (default emulated): 2, 3, 4
//! and 8 ranks; on CUDA, ranks share the GPUs there are (see
//! `common::run_on_runtime`).

mod common;

use common::{child_job, is_child, run, runtime};
use devcomm::comm::Communicator;
use devcomm::runtime::{LaunchConfig, Module, Stream};
use devcomm::{DevCommRequirements, Window, WindowFlags};
use devcomm_device::comm::{DevComm, WindowDesc};
use devcomm_test_kernels::lsa::*;
use devcomm_tests::test_kernels;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

const BYTES: u64 = 100_003; // a multiple of nothing
const SLOT: u64 = 100_016; // BYTES rounded up to 16
const RED_COUNT: usize = 1001;
const SEED: u64 = 0xD0C0;

/// Runs child `child` in `n` processes on the parent's runtime.
fn ranks(child: &str, n: usize) {
    common::run_on_runtime(child, n, &[]);
}

fn pattern(rank: usize, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED ^ (rank as u64) << 8);
    (0..len).map(|_| rng.gen()).collect()
}

fn check_errors(stream: &Stream, errors: &devcomm::DeviceBuffer<u32>, what: &str) -> u32 {
    let e = stream.read_vec(errors).unwrap();
    assert!(e[0] == 0 || e[1] > 0, "{what}: error word without a count: {e:?}");
    e[0]
}

struct Setup<'c> {
    comm: &'c Communicator,
    stream: Stream,
    window: Window<'c>,
    win: WindowDesc,
    dc: DevComm,
    red_off: u64,
    /// The test kernels' module on this rank's device.
    kernels: Module,
}

fn poison_slots(s: &Setup) {
    let lsa = s.win.lsa_size() as u64;
    s.window.write(&s.stream, 0, &vec![0xCBu8; (lsa * SLOT) as usize]).unwrap();
}

fn put_all(s: &Setup) {
    let dev = s.comm.device();
    let me = s.comm.rank();
    let src = dev.alloc_from(&pattern(me, BYTES as usize)).unwrap();
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    poison_slots(s);
    s.comm.bootstrap_barrier().unwrap(); // nobody's poison may land after a peer's put
                                         // SAFETY: window holds lsa_size slots of SLOT >= BYTES bytes; src has BYTES.
    unsafe {
        s.stream
            .launch_in::<lsa_put_all>(
                &s.kernels,
                LaunchConfig::new(1, 256),
                (s.dc, s.win, src.as_ptr(), BYTES, SLOT, errors.as_mut_ptr()),
            )
            .unwrap();
    }
    assert_eq!(check_errors(&s.stream, &errors, "put_all"), 0);
    let lsa_world0 = me - s.win.lsa_rank() as usize;
    for p in 0..s.win.lsa_size() as usize {
        let mut got = vec![0u8; SLOT as usize];
        s.window.read(&s.stream, p * SLOT as usize, &mut got).unwrap();
        assert_eq!(&got[..BYTES as usize], &pattern(lsa_world0 + p, BYTES as usize)[..], "slot of LSA rank {p}");
        assert!(got[BYTES as usize..].iter().all(|&b| b == 0xCB), "slot of LSA rank {p}: wrote past the end");
    }
    s.comm.bootstrap_barrier().unwrap();
}

fn put_values(s: &Setup) {
    let dev = s.comm.device();
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    let (values, base) = (5u32, 7_000_000u64);
    poison_slots(s);
    s.comm.bootstrap_barrier().unwrap();
    // SAFETY: one block of 256 >= lsa_size * 5 threads; slots hold 5 u64s.
    unsafe {
        s.stream
            .launch_in::<lsa_put_values>(
                &s.kernels,
                LaunchConfig::new(1, 256),
                (s.dc, s.win, values, SLOT, base, errors.as_mut_ptr()),
            )
            .unwrap();
    }
    assert_eq!(check_errors(&s.stream, &errors, "put_values"), 0);
    for p in 0..s.win.lsa_size() as u64 {
        let mut got = [0u64; 5];
        s.window.read(&s.stream, (p * SLOT) as usize, &mut got).unwrap();
        let want: Vec<u64> = (0..5).map(|k| base + p * 1000 + k).collect();
        assert_eq!(&got[..], &want[..], "values from LSA rank {p}");
    }
    s.comm.bootstrap_barrier().unwrap();
}

/// Data of LSA peer `p` for type `T` (ranges chosen so products stay finite).
macro_rules! reduce_case {
    ($s:expr, $kernel:ident, $t:ty, $gen:expr, $check:expr) => {{
        let s: &Setup = $s;
        let dev = s.comm.device();
        let me = s.comm.rank();
        let lsa_world0 = me - s.win.lsa_rank() as usize;
        let data = |rank: usize| -> Vec<$t> {
            let mut rng = rand::rngs::StdRng::seed_from_u64(SEED ^ 0x5151 ^ rank as u64);
            (0..RED_COUNT).map(|_| $gen(&mut rng)).collect()
        };
        for op in 0..4u32 {
            s.window.write(&s.stream, s.red_off as usize, &data(me)).unwrap();
            s.comm.bootstrap_barrier().unwrap(); // every rank's input is in place
            let mut dst = dev.alloc::<$t>(RED_COUNT + 1).unwrap();
            s.stream.memset(&mut dst, 0xCB).unwrap();
            // SAFETY: every peer's window holds RED_COUNT elements at red_off.
            unsafe {
                s.stream
                    .launch_in::<$kernel>(
                        &s.kernels,
                        LaunchConfig::new(3, 64),
                        (s.win, s.red_off, RED_COUNT as u64, dst.as_mut_ptr(), op),
                    )
                    .unwrap();
            }
            let got = s.stream.read_vec(&dst).unwrap();
            let inputs: Vec<Vec<$t>> = (0..s.win.lsa_size() as usize).map(|p| data(lsa_world0 + p)).collect();
            for i in 0..RED_COUNT {
                let column: Vec<$t> = inputs.iter().map(|v| v[i]).collect();
                $check(op, &column, got[i], stringify!($t), i);
            }
            let poison: $t = bytemuck::cast_slice::<u8, $t>(&[0xCBu8; 8][..std::mem::size_of::<$t>()])[0];
            assert_eq!(bytemuck::bytes_of(&got[RED_COUNT]), bytemuck::bytes_of(&poison), "wrote past count");
            s.comm.bootstrap_barrier().unwrap(); // peers are done reading our input
        }
    }};
}

fn check_int<T: Copy + PartialEq + std::fmt::Debug + Into<i128>>(op: u32, col: &[T], got: T, ty: &str, i: usize) {
    // Sum and product wrap in T: work modulo 2^bits at every step.
    let bits = std::mem::size_of::<T>() as u32 * 8;
    let m = |v: i128| v.rem_euclid(1i128 << bits);
    let vals: Vec<i128> = col.iter().map(|&v| v.into()).collect();
    let want: i128 = match op {
        0 => vals.iter().fold(0, |a, &v| m(a + v)),
        // Low `bits` bits of the product survive u128 wrapping multiplication.
        1 => vals.iter().fold(1, |a, &v| m((m(a) as u128).wrapping_mul(m(v) as u128) as i128 & ((1i128 << bits) - 1))),
        2 => *vals.iter().min().unwrap(),
        _ => *vals.iter().max().unwrap(),
    };
    assert_eq!(m(got.into()), m(want), "{ty} op {op} element {i}: inputs {col:?}");
}

fn check_float(op: u32, col: &[f64], got: f64, ty: &str, i: usize, tol: f64) {
    let want = match op {
        0 => col.iter().sum::<f64>(),
        1 => col.iter().product::<f64>(),
        2 => col.iter().cloned().fold(f64::INFINITY, f64::min),
        _ => col.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    };
    assert!((got - want).abs() <= tol * want.abs().max(1.0), "{ty} op {op} element {i}: {got} vs {want} ({col:?})");
}

fn reductions(s: &Setup) {
    reduce_case!(
        s,
        lsa_reduce_f32,
        f32,
        |r: &mut rand::rngs::StdRng| r.gen_range(0.5f32..2.0),
        |op, c: &[f32], g: f32, ty, i| {
            let c64: Vec<f64> = c.iter().map(|&v| v as f64).collect();
            check_float(op, &c64, g as f64, ty, i, 1e-5)
        }
    );
    reduce_case!(
        s,
        lsa_reduce_f64,
        f64,
        |r: &mut rand::rngs::StdRng| r.gen_range(0.5f64..2.0),
        |op, c: &[f64], g: f64, ty, i| { check_float(op, c, g, ty, i, 1e-12) }
    );
    reduce_case!(s, lsa_reduce_i32, i32, |r: &mut rand::rngs::StdRng| r.gen::<i32>(), check_int::<i32>);
    reduce_case!(s, lsa_reduce_u32, u32, |r: &mut rand::rngs::StdRng| r.gen::<u32>(), check_int::<u32>);
    reduce_case!(s, lsa_reduce_i64, i64, |r: &mut rand::rngs::StdRng| r.gen::<i64>(), check_int::<i64>);
    reduce_case!(s, lsa_reduce_u64, u64, |r: &mut rand::rngs::StdRng| r.gen::<u64>(), check_int::<u64>);
    reduce_case!(s, lsa_reduce_i8, i8, |r: &mut rand::rngs::StdRng| r.gen::<i8>(), check_int::<i8>);
    reduce_case!(s, lsa_reduce_u8, u8, |r: &mut rand::rngs::StdRng| r.gen::<u8>(), check_int::<u8>);
}

/// Runs `lsa_barrier_rounds` on one block of 64 threads; returns the first
/// error code and how many threads reported an error.
fn barrier_rounds_counted(s: &Setup, index: u32, rounds: u32, order: u32, timeout_ns: u64) -> (u32, u32) {
    let errors = s.comm.device().alloc_from(&[0u32; 2]).unwrap();
    // SAFETY: the device communicator is live.
    unsafe {
        s.stream
            .launch_in::<lsa_barrier_rounds>(
                &s.kernels,
                LaunchConfig::new(1, 64),
                (s.dc, index, rounds, order, timeout_ns, errors.as_mut_ptr()),
            )
            .unwrap();
    }
    let code = check_errors(&s.stream, &errors, "barrier");
    (code, s.stream.read_vec(&errors).unwrap()[1])
}

fn barrier_rounds(s: &Setup, index: u32, rounds: u32, order: u32, timeout_ns: u64) -> u32 {
    barrier_rounds_counted(s, index, rounds, order, timeout_ns).0
}

fn barriers(s: &Setup) {
    for order in 0..4 {
        assert_eq!(barrier_rounds(s, 0, 25, order, 0), 0, "order {order}");
    }
    // More barriers than requested: an error on the device, not a fault,
    // seen by every thread of the coop.
    assert_eq!(barrier_rounds_counted(s, 2, 1, 3, 0), (16, 64));
    s.comm.bootstrap_barrier().unwrap();
    // Only rank 0 enters barrier 1: it times out instead of hanging, and all
    // 64 threads of the CTA get the timeout, not only those that watched
    // the missing peers.
    if s.comm.rank() == 0 {
        let t = Instant::now();
        let (code, threads) = barrier_rounds_counted(s, 1, 1, 3, 50_000_000);
        assert_eq!((code, threads), (1, 64), "timeout code, threads that saw it");
        assert!(t.elapsed() < Duration::from_secs(10), "timeout took {:?}", t.elapsed());
    }
    s.comm.bootstrap_barrier().unwrap();
}

/// Launches `lsa_wait_signal` (asynchronously); returns its `seen` and error buffers.
fn launch_wait_signal(
    s: &Setup,
    sig_off: u64,
    least: u64,
    timeout_ns: u64,
) -> (devcomm::DeviceBuffer<u64>, devcomm::DeviceBuffer<u32>) {
    let dev = s.comm.device();
    let seen = dev.alloc_from(&[0u64]).unwrap();
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    // SAFETY: sig_off is inside the window; the buffers outlive the reads that follow.
    unsafe {
        s.stream
            .launch_in::<lsa_wait_signal>(
                &s.kernels,
                LaunchConfig::new(1, 1),
                (s.dc, s.win, sig_off, least, timeout_ns, seen.as_mut_ptr(), errors.as_mut_ptr()),
            )
            .unwrap();
    }
    (seen, errors)
}

/// Waits on the device for the signal; returns (error code, value seen).
fn wait_signal(s: &Setup, sig_off: u64, least: u64, timeout_ns: u64) -> (u32, u64) {
    let (seen, errors) = launch_wait_signal(s, sig_off, least, timeout_ns);
    (check_errors(&s.stream, &errors, "wait_signal"), s.stream.read_vec(&seen).unwrap()[0])
}

/// Every other LSA rank signals LSA rank 0 from its GPU; rank 0 waits for
/// all of them, then waits for one more that never comes and times out.
fn signals(s: &Setup) {
    let sig_off = s.red_off + 16 * 1024;
    let lsa = s.win.lsa_size() as u64;
    s.window.write(&s.stream, sig_off as usize, &[0u64]).unwrap();
    s.comm.bootstrap_barrier().unwrap();
    if s.win.lsa_rank() != 0 {
        // SAFETY: sig_off is inside the window; peer 0 exists.
        unsafe {
            s.stream
                .launch_in::<lsa_signal>(&s.kernels, LaunchConfig::new(1, 32), (s.win, 0u32, sig_off, 1u64))
                .unwrap()
        };
        s.stream.synchronize().unwrap();
    } else {
        let (err, seen) = wait_signal(s, sig_off, lsa - 1, 10_000_000_000);
        assert_eq!((err, seen), (0, lsa - 1));
        let t = Instant::now();
        let (err, _) = wait_signal(s, sig_off, lsa, 50_000_000);
        assert_eq!(err, 1, "a signal that never comes times out");
        assert!(t.elapsed() < Duration::from_secs(10));
    }
    s.comm.bootstrap_barrier().unwrap();
}

/// Every LSA rank sends an LL message to the next; twice per size, reusing
/// the slot with a new flag.
fn ll_ring(s: &Setup) {
    let dev = s.comm.device();
    let (src_off, dst_off, slot_off) = (s.red_off + 32 * 1024, s.red_off + 40 * 1024, s.red_off + 48 * 1024);
    let me = s.comm.rank();
    let lsa = s.win.lsa_size() as usize;
    let prev_world = me - s.win.lsa_rank() as usize + (s.win.lsa_rank() as usize + lsa - 1) % lsa;
    s.window.write(&s.stream, slot_off as usize, &vec![0u8; 8 * 1024]).unwrap();
    let mut flag = 0u32;
    for &bytes in &[1usize, 13, 4099] {
        for round in 0..2 {
            flag += 1;
            let data: Vec<u8> = pattern(me * 100 + round, bytes);
            s.window.write(&s.stream, src_off as usize, &data).unwrap();
            s.window.write(&s.stream, dst_off as usize, &vec![0xCBu8; bytes + 1]).unwrap();
            s.comm.bootstrap_barrier().unwrap();
            let errors = dev.alloc_from(&[0u32; 2]).unwrap();
            // SAFETY: the regions are inside the window (see child_body's layout).
            unsafe {
                s.stream
                    .launch_in::<lsa_ll_ring>(
                        &s.kernels,
                        LaunchConfig::new(1, 32),
                        (s.dc, s.win, src_off, dst_off, slot_off, bytes as u64, flag, errors.as_mut_ptr()),
                    )
                    .unwrap();
            }
            assert_eq!(check_errors(&s.stream, &errors, "ll ring"), 0);
            let mut got = vec![0u8; bytes + 1];
            s.window.read(&s.stream, dst_off as usize, &mut got).unwrap();
            assert_eq!(&got[..bytes], &pattern(prev_world * 100 + round, bytes)[..], "LL {bytes} B round {round}");
            assert_eq!(got[bytes], 0xCB, "LL wrote past the payload");
            s.comm.bootstrap_barrier().unwrap();
        }
    }
}

fn child_body(comm: &Communicator) {
    let stream = comm.device().new_stream().unwrap();
    let lsa = comm.lsa_size().unwrap() as u64;
    let red_off = (lsa * SLOT).next_multiple_of(4096);
    let mem = comm.mem_alloc((red_off + 64 * 1024) as usize).unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    req.lsa_barrier_count = 2;
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req).unwrap();
    let kernels = test_kernels(comm.device());
    let s = Setup { comm, stream, win: window.desc(), dc: handle.dev_comm(), window, red_off, kernels };
    assert_eq!(s.win.lsa_size() as u64, lsa);
    put_all(&s);
    put_values(&s);
    reductions(&s);
    barriers(&s);
    signals(&s);
    ll_ring(&s);
    // A signal wait that only the host's abort flag can end (no timeout).
    let sig_off = s.red_off + 24 * 1024;
    s.window.write(&s.stream, sig_off as usize, &[0u64]).unwrap();
    // Launches are asynchronous: the kernel is waiting while the host raises the flag.
    let (_seen, errors) = launch_wait_signal(&s, sig_off, 1, 0);
    std::thread::sleep(Duration::from_millis(100));
    handle.set_abort();
    assert_eq!(check_errors(&s.stream, &errors, "aborted wait"), 2, "abort code");
    comm.bootstrap_barrier().unwrap();
    drop(s);
    handle.destroy().unwrap();
    comm.finalize().unwrap();
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_lsa() {
    if !is_child("child_lsa") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_body(&comm);
}

#[test]
fn lsa_2_ranks() {
    ranks("child_lsa", 2);
}

#[test]
fn lsa_3_ranks() {
    ranks("child_lsa", 3);
}

#[test]
fn lsa_4_ranks() {
    ranks("child_lsa", 4);
}

#[test]
fn lsa_8_ranks() {
    ranks("child_lsa", 8);
}

/// Child: rank 0's kernel waits on a signal that rank 1 would send; rank 1
/// dies instead. The remote failure raises the device abort flag and the
/// kernel ends with the abort code.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_peer_dies() {
    if !is_child("child_peer_dies") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let stream = comm.device().new_stream().unwrap();
    let mem = comm.mem_alloc(1 << 16).unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    req.lsa_barrier_count = 1;
    let handle = comm.create_dev_comm(&req).unwrap();
    window.write(&stream, 0, &[0u64]).unwrap();
    comm.bootstrap_barrier().unwrap();
    if comm.rank() == 1 {
        std::thread::sleep(Duration::from_millis(200));
        std::process::exit(3); // dies without finalize
    }
    let dev = comm.device();
    let seen = dev.alloc_from(&[0u64]).unwrap();
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    let t = Instant::now();
    // SAFETY: offset 0 is inside the window; no timeout: only the abort flag ends it.
    unsafe {
        stream
            .launch_in::<lsa_wait_signal>(
                &test_kernels(dev),
                LaunchConfig::new(1, 1),
                (handle.dev_comm(), window.desc(), 0u64, 1u64, 0u64, seen.as_mut_ptr(), errors.as_mut_ptr()),
            )
            .unwrap();
    }
    assert_eq!(check_errors(&stream, &errors, "wait on a dead peer"), 2);
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
    assert!(comm.get_async_error().is_err());
    std::process::exit(0);
}

#[test]
fn a_dead_peer_ends_a_device_wait() {
    let opts = child_job("child_peer_dies", 2).env("DEVCOMM_RUNTIME", runtime()).kill_on_failure(false);
    let statuses = run(&opts);
    assert!(statuses[0].success(), "rank 0: {statuses:?}");
    assert_eq!(statuses[1].code(), Some(3), "rank 1 should have died with 3: {statuses:?}");
}
