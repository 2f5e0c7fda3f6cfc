//! Symmetric memory, windows and device communicators across ranks:
//! separate processes (2, 3, 4 and 8 ranks, with and without an LSA size
//! override) and one process driving several emulated devices (`init_all`).

mod common;

use common::{child_job, is_child, run, run_ranks};
use devcomm::comm::{Communicator, Config};
use devcomm::dev_comm::{DevCommRequirements, REGION_ALIGN};
use devcomm::team::{Team, TeamKind};
use devcomm::window::WindowFlags;
use devcomm::Error;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// The bytes rank `rank` writes into window number `salt`.
fn pattern(rank: usize, salt: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rank as u64 * 1000 + salt);
    (0..len).map(|_| rng.gen()).collect()
}

/// Reads `len` bytes at an LSA pointer directly (emulated: a host address of this process).
fn read_direct(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: on the emulated runtime the window's LSA mapping is host memory
    // of this process, at least `len` bytes from `addr` (checked by the caller).
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

/// Everything one rank does; `expected_lsa` is the LSA size it must see.
fn exercise(comm: &Communicator, expected_lsa: usize) {
    let (n, rank) = (comm.count(), comm.rank());
    let stream = comm.device().stream();
    assert_eq!(comm.lsa_size().unwrap(), expected_lsa);
    assert_eq!(comm.lsa_rank().unwrap(), rank % expected_lsa);
    let (world, lsa, rail) = comm.teams().unwrap();
    assert_eq!(world, Team::world(n as u32, rank as u32));
    assert_eq!(lsa, Team::lsa(expected_lsa as u32, (rank % expected_lsa) as u32));
    assert_eq!(rail, Team::rail(n as u32, expected_lsa as u32, rank as u32));
    assert_eq!(comm.team(TeamKind::Rail).unwrap(), rail);
    let lsa_rank = rank % expected_lsa;
    let base = rank - lsa_rank;

    // Whole allocation, COLL_SYMMETRIC.
    let mem = comm.mem_alloc(3 * 4096 + 100).unwrap();
    assert_eq!(mem.size(), 3 * 4096 + 100);
    assert!(mem.allocated_size() >= mem.size());
    let w = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC | WindowFlags::STRICT_ORDERING).unwrap();
    let d = w.desc();
    assert_eq!((d.size() as usize, d.lsa_size() as usize, d.lsa_rank() as usize), (mem.size(), expected_lsa, lsa_rank));
    assert_eq!(d.flags(), (WindowFlags::COLL_SYMMETRIC | WindowFlags::STRICT_ORDERING).bits());
    assert_eq!(w.user_ptr(), mem.device_addr());
    assert!(d.stride() as usize >= mem.allocated_size());
    let mine = pattern(rank, 1, w.size());
    w.write(stream, 0, &mine).unwrap();
    comm.bootstrap_barrier().unwrap();
    for peer in 0..expected_lsa {
        let want = pattern(base + peer, 1, w.size());
        let mut got = vec![0u8; w.size()];
        w.read_lsa(stream, peer, 0, &mut got).unwrap();
        assert_eq!(got, want, "rank {rank}: LSA peer {peer} through read_lsa");
        let p = w.lsa_pointer(0, peer).unwrap();
        assert_eq!(p, d.lsa_base() + peer as u64 * d.stride());
        assert_eq!(read_direct(p, w.size()), want, "rank {rank}: LSA peer {peer} through the pointer");
        assert_eq!(w.peer_pointer(&world, base + peer, 17).unwrap(), p + 17);
        assert_eq!(d.lsa_ptr::<u8>(17, peer as u32) as u64, p + 17);
    }
    // Our own mapping aliases the original allocation.
    let mut via_mem = vec![0u8; 64];
    mem.read(stream, 0, &mut via_mem).unwrap();
    assert_eq!(via_mem, mine[..64]);
    comm.bootstrap_barrier().unwrap();
    w.deregister().unwrap();

    // A 4096-aligned sub-region, sizes differing per rank (DEFAULT: the smallest wins).
    let len = 8192 - 8 * rank;
    let sub = comm.register_window(mem.region(4096, len), WindowFlags::DEFAULT).unwrap();
    let sd = sub.desc();
    assert_eq!(sd.size() as usize, 8192 - 8 * (n - 1));
    assert_eq!(sub.user_ptr(), mem.device_addr() + 4096);
    let mine = pattern(rank, 2, sub.size());
    sub.write(stream, 0, &mine).unwrap();
    comm.bootstrap_barrier().unwrap();
    for peer in 0..expected_lsa {
        let p = sub.lsa_pointer(0, peer).unwrap();
        assert_eq!(read_direct(p, sub.size()), pattern(base + peer, 2, sub.size()), "rank {rank}: sub peer {peer}");
    }

    // A device communicator with barriers, two resource buffers and the sub window.
    let mut req = DevCommRequirements::new();
    req.lsa_barrier_count = 3;
    req.barrier_count = if expected_lsa == n { 2 } else { 0 };
    let r1 = req.add_resource(1000, 64);
    let r2 = req.add_resource(5000, 4096);
    req.require_team(TeamKind::Lsa, false);
    req.use_window(&sub);
    let dc = comm.create_dev_comm(&req).unwrap();
    let c = dc.dev_comm();
    assert_eq!((c.rank() as usize, c.nranks() as usize), (rank, n));
    assert_eq!((c.lsa_rank() as usize, c.lsa_size() as usize), (lsa_rank, expected_lsa));
    assert_eq!(c.lsa_barrier_count(), 3 + req.barrier_count);
    assert_eq!(dc.world_barrier_base(), 3);
    assert_eq!(c.lsa(), lsa);
    assert_eq!(c.world(), world);
    assert_eq!(c.rail(), rail);
    let res = c.resources();
    assert_eq!(dc.resource_window(), res);
    assert_eq!((res.lsa_rank(), res.lsa_size()), (c.lsa_rank(), c.lsa_size()));
    assert_eq!(res.flags(), WindowFlags::COLL_SYMMETRIC.bits());
    assert_ne!(res.id(), sd.id());
    let bar = c.lsa_barrier_offset();
    let ep = c.lsa_epoch_offset();
    let (o1, o2) = (dc.resource_offset(r1).unwrap(), dc.resource_offset(r2).unwrap());
    let barriers = c.lsa_barrier_count() as u64;
    assert_eq!(bar % REGION_ALIGN, 0);
    assert_eq!(ep % REGION_ALIGN, 0);
    assert!(ep >= bar + barriers * c.lsa_size() as u64 * 4);
    assert!(o1 >= ep + barriers * 4 && o1 % 64 == 0);
    assert!(o2 >= o1 + 1000 && o2 % 4096 == 0);
    assert!(o2 + 5000 <= res.size());
    assert_eq!(dc.window(&sub).unwrap(), sd);
    // Everything starts zeroed, on every LSA peer.
    for peer in 0..expected_lsa as u32 {
        let p = res.lsa_ptr::<u8>(0, peer) as u64;
        assert!(read_direct(p, res.size() as usize).iter().all(|&b| b == 0), "resources of LSA peer {peer}");
    }
    // The abort flag is a device-readable word, clear until raised.
    assert_ne!(c.abort().flag(), 0);
    assert_eq!(c.abort().timeout_ns(), comm.config().op_timeout.as_nanos() as u64);
    assert!(!dc.is_aborted());
    assert_eq!(read_direct(c.abort().flag(), 4), vec![0; 4]);
    dc.set_abort();
    assert!(dc.is_aborted());
    assert_eq!(read_direct(c.abort().flag(), 4), 1u32.to_ne_bytes().to_vec());
    comm.bootstrap_barrier().unwrap();
    dc.destroy().unwrap();
    sub.deregister().unwrap();
    let all = comm.bootstrap_allgather(&[rank as u8]).unwrap();
    assert_eq!(all.len(), n);
}

/// Child: one rank of a multi-process job.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_windows() {
    if !is_child("child_windows") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let lsa = std::env::var("DEVCOMM_LSA_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(comm.count());
    exercise(&comm, lsa);
    comm.finalize().unwrap();
}

#[test]
fn windows_2_ranks() {
    run_ranks("child_windows", 2);
}

#[test]
fn windows_3_ranks() {
    run_ranks("child_windows", 3);
}

#[test]
fn windows_4_ranks() {
    run_ranks("child_windows", 4);
}

#[test]
fn windows_8_ranks() {
    run_ranks("child_windows", 8);
}

fn run_with_lsa(n: usize, lsa: usize) {
    let st = run(&child_job("child_windows", n).env("DEVCOMM_LSA_SIZE", lsa.to_string()));
    for (r, s) in st.iter().enumerate() {
        assert!(s.success(), "rank {r} of {n} with LSA size {lsa}: {}", devcomm::launch::describe(s));
    }
}

/// Every rank its own "node": only its own window is mapped.
#[test]
fn windows_lsa_size_1() {
    run_with_lsa(4, 1);
}

/// Two pretend nodes of two ranks.
#[test]
fn windows_lsa_size_2_of_4() {
    run_with_lsa(4, 2);
}

/// One process, four emulated devices, one thread per rank.
#[test]
fn windows_init_all_threads() {
    let devs: Vec<_> = (0..4).map(common::emu).collect();
    let comms = Communicator::init_all_with_config(&devs, Config::default().with_timeouts(common::TIMEOUT)).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                exercise(c, 4);
                c.finalize().unwrap();
            });
        }
    });
}

/// Aborting one communicator raises the device-visible flag of its device
/// communicators at once, and the peers' (a remote failure) shortly after.
#[test]
fn abort_reaches_dev_comm_flags() {
    let devs: Vec<_> = (0..2).map(common::emu).collect();
    let comms = Communicator::init_all_with_config(&devs, Config::default().with_timeouts(common::TIMEOUT)).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut req = DevCommRequirements::new();
                    req.lsa_barrier_count = 1;
                    let dc = c.create_dev_comm(&req).unwrap();
                    assert!(!dc.is_aborted());
                    c.bootstrap_barrier().unwrap();
                    if c.rank() == 1 {
                        c.abort();
                        assert!(dc.is_aborted(), "local abort sets the flag synchronously");
                    } else {
                        let t = Instant::now();
                        while !dc.is_aborted() {
                            assert!(t.elapsed() < Duration::from_secs(5), "remote abort never reached the flag");
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        assert!(matches!(c.get_async_error(), Err(Error::RemoteError(_))));
                    }
                    drop(dc);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}
