//! Routed put / signal / wait (`devcomm_device::route::Router`) across
//! ranks in separate processes: every peer reached by LSA stores when it
//! shares the caller's LSA team and by GIN otherwise, on one routed signal
//! per purpose. `DEVCOMM_LSA_SIZE` splits the ranks into "nodes": all LSA
//! (one node), all GIN (one rank per node), and mixed (several nodes of
//! several ranks), over the copy-engine and the TCP transports; and the
//! calls that must fail, with and without GIN.

mod common;

use common::is_child;
use devcomm::comm::Communicator;
use devcomm::gin::GinConnectionType;
use devcomm::runtime::LaunchConfig;
use devcomm::{DevCommRequirements, WindowFlags};
use devcomm_device::error::DeviceError as D;
use devcomm_test_kernels::route::*;
use devcomm_tests::test_kernels;

/// Bytes of each message: a multiple of nothing.
const BYTES: u64 = 10_007;
/// Blocks of the exchange, each with its own area and signals.
const BLOCKS: u32 = 2;
/// Rounds per launch (two launches: the signals keep counting).
const ROUNDS: u32 = 3;
/// Where the routed signal words start in the window.
const SIG_OFF: u64 = 4096;
/// Where the blocks' areas start.
const AREA_OFF: u64 = 8192;

/// Runs `child_route` in `n` processes, `lsa_size` ranks per node, with
/// GIN (`gin`) or without, over TCP (`tcp`) or the copy engine.
fn ranks(n: usize, lsa_size: usize, gin: bool, tcp: bool) {
    let mut env = vec![
        ("DEVCOMM_LSA_SIZE", lsa_size.to_string()),
        ("DEVCOMM_OP_TIMEOUT_MS", "30000".to_string()),
        ("ROUTE_TEST_GIN", (gin as u32).to_string()),
    ];
    if tcp {
        env.push(("DEVCOMM_GIN_TRANSPORT", "tcp".to_string()));
    }
    common::run_on_runtime("child_route", n, &env);
}

fn child_body(comm: &Communicator, gin: bool) {
    let (n, me) = (comm.count(), comm.rank());
    let lsa = comm.lsa_size().unwrap();
    let dev = comm.device().clone();
    let stream = dev.new_stream().unwrap();
    let kernels = test_kernels(&dev);
    let slot = (BYTES + 1).next_multiple_of(64);
    let area = area_bytes(n as u64, slot);
    let total = AREA_OFF + BLOCKS as u64 * area;
    let mem = comm.mem_alloc(total as usize).unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = DevCommRequirements::new();
    if gin {
        req.gin_connection_type = GinConnectionType::Full;
        req.gin_signal_count = SIGNALS_PER_BLOCK * BLOCKS;
    }
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req).unwrap();
    let (dc, win) = (handle.dev_comm(), window.desc());
    window.write(&stream, 0, &vec![0xCBu8; total as usize]).unwrap();
    window.write(&stream, SIG_OFF as usize, &vec![0u64; (SIGNALS_PER_BLOCK * BLOCKS) as usize]).unwrap();
    stream.synchronize().unwrap();
    comm.bootstrap_barrier().unwrap();

    // The exchange works wherever every peer is reachable: with GIN, or
    // with all ranks in one LSA team.
    if gin || lsa == n {
        for launch in 0..2u32 {
            let errors = dev.alloc_from(&[0u32; 3]).unwrap();
            // SAFETY: the window holds the signal words at SIG_OFF (zeroed above) and BLOCKS areas
            // from AREA_OFF; GIN (when present) has SIGNALS_PER_BLOCK * BLOCKS signals; slot > BYTES
            // and a multiple of 8; every rank launches the same co-resident grid; `errors` holds 3
            // words and outlives the launch (read back below).
            unsafe {
                stream
                    .launch_in::<route_exchange>(
                        &kernels,
                        LaunchConfig::new(BLOCKS, 128).co_resident(),
                        (dc, win, SIG_OFF, AREA_OFF, slot, BYTES, launch * ROUNDS, ROUNDS, errors.as_mut_ptr()),
                    )
                    .unwrap()
            };
            let e = stream.read_vec(&errors).unwrap();
            assert_eq!(e, [0, 0, 0], "launch {launch}: [first error code, errors, mismatches] (lsa {lsa} of {n})");
            comm.bootstrap_barrier().unwrap();
        }
        // What the last round left, read back by the host.
        let last = 2 * ROUNDS - 1;
        for b in 0..BLOCKS {
            let base = AREA_OFF + b as u64 * area;
            for p in 0..n {
                let mut got = vec![0u8; slot as usize];
                window.read(&stream, (base + p as u64 * slot) as usize, &mut got).unwrap();
                for (i, &g) in got.iter().enumerate() {
                    let want = if (i as u64) < BYTES { pattern(p as u32, b, last, i as u64) } else { 0xCB };
                    assert_eq!(g, want, "block {b}, slot of rank {p}, byte {i}");
                }
            }
            let mut words = vec![0u64; n];
            window.read(&stream, (base + (n as u64 + 1) * slot) as usize, &mut words).unwrap();
            assert_eq!(words, (0..n as u32).map(|p| word(p, last)).collect::<Vec<_>>(), "block {b}: words");
        }
    }

    // Calls that must fail. The probe: the next rank, reached by LSA or GIN
    // (succeeds), or off the node without GIN (`NoGin`).
    let probe = ((me + 1) % n) as u32;
    let codes = dev.alloc_from(&[u32::MAX; 8]).unwrap();
    // SAFETY: the window holds 2 routed signal words at SIG_OFF; `codes`
    // holds the 8 words the kernel writes and outlives the launch.
    unsafe {
        stream
            .launch_in::<route_bad_calls>(
                &kernels,
                LaunchConfig::new(1, 64),
                (dc, win, SIG_OFF, probe, codes.as_mut_ptr()),
            )
            .unwrap()
    };
    let probe_off_node = (probe as usize) / lsa != me / lsa;
    let probe_code = if probe_off_node && !gin { D::NoGin.code() } else { 0 };
    let want = [
        D::OutOfWindow.code(),
        D::OutOfWindow.code(),
        D::PeerNotInTeam.code(),
        D::SignalOutOfRange.code(),
        D::ValueTooWide.code(),
        D::SignalOutOfRange.code(),
        D::OutOfWindow.code(),
        probe_code,
    ];
    assert_eq!(stream.read_vec(&codes).unwrap(), want, "bad calls (lsa {lsa} of {n}, gin {gin})");
    comm.bootstrap_barrier().unwrap();

    handle.destroy().unwrap();
    window.deregister().unwrap();
    comm.finalize().unwrap();
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_route() {
    if !is_child("child_route") {
        return;
    }
    let gin = std::env::var("ROUTE_TEST_GIN").is_ok_and(|v| v == "1");
    let comm = Communicator::init_from_env().unwrap();
    child_body(&comm, gin);
}

#[test]
fn route_1_rank() {
    ranks(1, 1, true, false);
}

#[test]
fn route_2_ranks_all_gin() {
    ranks(2, 1, true, false);
}

#[test]
fn route_2_ranks_all_lsa() {
    ranks(2, 2, true, false);
}

#[test]
fn route_2_ranks_lsa_without_gin() {
    ranks(2, 2, false, false);
}

#[test]
fn route_2_nodes_without_gin_fail_typed() {
    ranks(2, 1, false, false);
}

#[test]
fn route_4_ranks_two_nodes() {
    ranks(4, 2, true, false);
}

#[test]
fn route_4_ranks_two_nodes_tcp() {
    ranks(4, 2, true, true);
}

#[test]
fn route_3_ranks_one_per_node_tcp() {
    ranks(3, 1, true, true);
}

#[test]
fn route_8_ranks_two_nodes() {
    ranks(8, 4, true, false);
}
