//! Device-side `Gin::get` (read a peer's window into this rank's window)
//! through the proxy, across ranks in separate processes: random peers
//! (this rank included), random offsets and sizes (1 byte to more than a
//! TCP piece), poisoned destinations, completion by flush and by counter,
//! checked by the host and by the kernel itself after completion; a range
//! past the window is `OutOfWindow`. On the copy-engine transport (one LSA
//! team, and every rank its own node with `DEVCOMM_LSA_SIZE=1`) and on TCP.

mod common;

use common::{is_child, run_on_runtime};
use devcomm::comm::Communicator;
use devcomm::gin::GinConnectionType;
use devcomm::runtime::LaunchConfig;
use devcomm::{DevCommRequirements, WindowFlags};
use devcomm_device::error::DeviceError;
use devcomm_test_kernels::gin::gin_get_batch;
use devcomm_tests::test_kernels;
use rand::{Rng, SeedableRng};

/// Bytes of the source area (every rank's own random bytes).
const SRC: usize = 300_000;
/// Bytes of the destination area (poisoned before each round).
const DST: usize = 1_200_000;
const POISON: u8 = 0x5C;
/// Gets per round.
const GETS: usize = 40;

fn cases(n: usize, lsa1: bool, tcp: bool) {
    // Generous timeouts: ranks of a loaded 2-core CI machine can be seconds apart.
    let mut env =
        vec![("DEVCOMM_OP_TIMEOUT_MS", "30000".to_string()), ("DEVCOMM_BOOTSTRAP_TIMEOUT_MS", "30000".to_string())];
    if lsa1 {
        env.push(("DEVCOMM_LSA_SIZE", "1".to_string()));
    }
    if tcp {
        env.push(("DEVCOMM_GIN_TRANSPORT", "tcp".to_string()));
    }
    run_on_runtime("child_gin_get", n, &env);
}

fn source(rank: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6E7 ^ ((rank as u64) << 12));
    (0..SRC).map(|_| rng.gen()).collect()
}

fn weighted_sum(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0u64, |s, (j, &b)| s.wrapping_add((j as u64 + 1).wrapping_mul(b as u64)))
}

fn child_body(comm: &Communicator) {
    let (n, me) = (comm.count(), comm.rank());
    let dev = comm.device().clone();
    let kernels = test_kernels(&dev);
    let stream = dev.new_stream().unwrap();
    let mem = comm.mem_alloc(SRC + DST).unwrap();
    let win = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    req.gin_connection_type = GinConnectionType::Full;
    req.gin_signal_count = 1;
    req.gin_counter_count = 1;
    req.use_window(&win);
    let handle = comm.create_dev_comm(&req).unwrap();
    let dc = handle.dev_comm();
    let sources: Vec<Vec<u8>> = (0..n).map(source).collect();
    win.write(&stream, 0, &sources[me]).unwrap();
    stream.synchronize().unwrap();
    comm.bootstrap_barrier().unwrap();

    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6E70 ^ me as u64);
    let mut counted = 0u64;
    for round in 0..4 {
        let by_counter = round % 2 == 1;
        // Random gets into disjoint destination ranges with random gaps.
        let mut entries = Vec::new();
        let mut at = SRC as u64 + rng.gen_range(0..64);
        for i in 0..GETS {
            let bytes: u64 = match i % 5 {
                0 => rng.gen_range(1..=9),
                1 => rng.gen_range(10..1000),
                2 => rng.gen_range(1000..20_000),
                3 => 1 + (i as u64 % 8),
                _ => rng.gen_range(20_000..SRC as u64 / 2),
            };
            let peer = rng.gen_range(0..n) as u64;
            let src = rng.gen_range(0..=SRC as u64 - bytes);
            if at + bytes > (SRC + DST) as u64 {
                break;
            }
            entries.extend_from_slice(&[peer, src, at, bytes]);
            at += bytes + rng.gen_range(0..97);
        }
        let count = entries.len() / 4;
        win.write(&stream, SRC, &vec![POISON; DST]).unwrap();
        let list = dev.alloc_from(&entries).unwrap();
        let sums = dev.alloc_from(&vec![0u64; count]).unwrap();
        let errors = dev.alloc_from(&[0u32; 2]).unwrap();
        counted += count as u64;
        // SAFETY: one block; `list` holds 4 × count u64s and `sums` count, all
        // ranges inside the window (drawn above), destinations disjoint;
        // the device communicator has counter 0 and uses the window; the
        // buffers outlive the launch (read after the stream synchronises).
        unsafe {
            stream
                .launch_in::<gin_get_batch>(
                    &kernels,
                    LaunchConfig::new(1, 32),
                    (
                        dc,
                        win.desc(),
                        list.as_ptr(),
                        count as u32,
                        by_counter as u32,
                        counted,
                        sums.as_mut_ptr(),
                        errors.as_mut_ptr(),
                    ),
                )
                .unwrap()
        };
        let e = stream.read_vec(&errors).unwrap();
        assert_eq!(e[0], 0, "round {round}: device error {} (proxy: {:?})", e[0], handle.gin_error());
        if !by_counter {
            // Counter 0 counts only the gets that asked for it.
            counted -= count as u64;
        }
        let mut got = vec![0u8; DST];
        win.read(&stream, SRC, &mut got).unwrap();
        let mut want = vec![POISON; DST];
        for e in entries.chunks(4) {
            let (peer, src, dst, bytes) = (e[0] as usize, e[1] as usize, e[2] as usize - SRC, e[3] as usize);
            want[dst..dst + bytes].copy_from_slice(&sources[peer][src..src + bytes]);
        }
        if got != want {
            let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
            let entry =
                entries.chunks(4).find(|e| (e[2] as usize - SRC..e[2] as usize - SRC + e[3] as usize).contains(&first));
            panic!("round {round}: destination byte {first} wrong (entry {entry:?}, by counter {by_counter})");
        }
        let sums = stream.read_vec(&sums).unwrap();
        for (i, e) in entries.chunks(4).enumerate() {
            let (peer, src, bytes) = (e[0] as usize, e[1] as usize, e[3] as usize);
            assert_eq!(
                sums[i],
                weighted_sum(&sources[peer][src..src + bytes]),
                "round {round}: the kernel's view of get {i}"
            );
        }
        comm.bootstrap_barrier().unwrap();
    }

    // A range past the window: refused on the device.
    let size = win.size() as u64;
    let peer = ((me + 1) % n) as u64;
    let list = dev.alloc_from(&[peer, size - 3, SRC as u64, 8]).unwrap();
    let sums = dev.alloc_from(&[0u64]).unwrap();
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    // SAFETY: as above; the one entry's source runs past the window, which
    // the device API refuses before posting.
    unsafe {
        stream
            .launch_in::<gin_get_batch>(
                &kernels,
                LaunchConfig::new(1, 32),
                (dc, win.desc(), list.as_ptr(), 1u32, 0u32, 0u64, sums.as_mut_ptr(), errors.as_mut_ptr()),
            )
            .unwrap()
    };
    assert_eq!(stream.read_vec(&errors).unwrap()[0], DeviceError::OutOfWindow as u32);
    assert!(handle.gin_error().is_none(), "{:?}", handle.gin_error());
    comm.bootstrap_barrier().unwrap();

    // A window not declared with use_window: the copy-engine transport has
    // no mapping of the peer's, so the proxy fails the ring and the kernel's
    // flush says so (no timeout); TCP reads any registered window of the peer.
    let other_mem = comm.mem_alloc(4096).unwrap();
    let other = comm.register_window(&other_mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    other.write(&stream, 0, &sources[me][..4096]).unwrap();
    other.write(&stream, 0, &[POISON; 64]).unwrap();
    stream.synchronize().unwrap();
    comm.bootstrap_barrier().unwrap();
    let tcp = std::env::var("DEVCOMM_GIN_TRANSPORT").is_ok_and(|v| v == "tcp");
    let list = dev.alloc_from(&[peer, 100, 0, 64]).unwrap();
    let errors = dev.alloc_from(&[0u32; 2]).unwrap();
    // SAFETY: as above, with `other` as the kernel's window: the get reads
    // bytes 100..164 of the peer's `other` into bytes 0..64 of this rank's.
    unsafe {
        stream
            .launch_in::<gin_get_batch>(
                &kernels,
                LaunchConfig::new(1, 32),
                (dc, other.desc(), list.as_ptr(), 1u32, 0u32, 0u64, sums.as_mut_ptr(), errors.as_mut_ptr()),
            )
            .unwrap()
    };
    let code = stream.read_vec(&errors).unwrap()[0];
    if tcp {
        assert_eq!(code, 0, "TCP gets read any registered window");
        let mut got = [0u8; 64];
        other.read(&stream, 0, &mut got).unwrap();
        assert_eq!(&got[..], &sources[peer as usize][100..164]);
    } else {
        assert_eq!(code, DeviceError::RingFailed as u32, "copy engine: the window is not mapped here");
        let mut got = [0u8; 64];
        other.read(&stream, 0, &mut got).unwrap();
        assert_eq!(got, [POISON; 64], "nothing landed");
        let e = handle.gin_error().expect("the proxy says why the ring failed");
        assert!(e.to_string().contains("use_window"), "{e}");
    }
    comm.bootstrap_barrier().unwrap();
    drop(handle);
    drop(other);
    win.deregister().unwrap();
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_gin_get() {
    if !is_child("child_gin_get") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_body(&comm);
}

#[test]
fn gin_get_2_ranks() {
    cases(2, false, false);
}

#[test]
fn gin_get_3_ranks_lsa1() {
    cases(3, true, false);
}

#[test]
fn gin_get_2_ranks_tcp() {
    cases(2, true, true);
}

#[test]
fn gin_get_3_ranks_tcp() {
    cases(3, true, true);
}
