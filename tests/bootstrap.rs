//! Bootstrap, split, abort and finalize with ranks as separate processes on
//! loopback (1, 2, 3, 4 and 8 ranks), and `init_all` in one process.

mod common;

use common::{is_child, run_ranks, TIMEOUT};
use devcomm::comm::{CommState, Communicator, Config};
use devcomm::runtime::RuntimeSelection;
use devcomm::Error;
use std::time::{Duration, Instant};

fn payload(rank: usize) -> Vec<u8> {
    format!("rank {rank} says hello").into_bytes()
}

/// Checks allgather, broadcast, barrier and topology of `comm`.
fn check_collectives(comm: &Communicator) {
    let n = comm.count();
    let all = comm.bootstrap_allgather(&payload(comm.rank())).unwrap();
    assert_eq!(all, (0..n).map(payload).collect::<Vec<_>>());
    let root = n - 1;
    let b = comm.bootstrap_broadcast(root, &payload(comm.rank())).unwrap();
    assert_eq!(b, payload(root));
    comm.bootstrap_barrier().unwrap();
    // A larger allgather.
    let big = vec![comm.rank() as u8; 100_000];
    let all = comm.bootstrap_allgather(&big).unwrap();
    for (r, v) in all.iter().enumerate() {
        assert_eq!(v, &vec![r as u8; 100_000]);
    }
}

/// Child: init from the environment, collectives, split, finalize.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_world() {
    if !is_child("child_world") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let n: usize = std::env::var("WORLD_SIZE").unwrap().parse().unwrap();
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    assert_eq!((comm.count(), comm.rank()), (n, rank));
    let ndev = devcomm::runtime::device_count(RuntimeSelection::Emulated).unwrap().1;
    assert_eq!(comm.device().ordinal(), rank % ndev);
    assert_eq!(comm.comm_state(), CommState::Ready);
    check_collectives(&comm);

    // Topology: every rank is on this host, in another process.
    assert_eq!(comm.local_ranks().unwrap(), (0..n).collect::<Vec<_>>());
    assert_eq!(comm.num_hosts().unwrap(), 1);
    assert!(comm.same_host(n - 1).unwrap());
    let infos = comm.rank_infos().unwrap();
    assert_eq!(infos.len(), n);
    for (r, i) in infos.iter().enumerate() {
        assert_eq!(i.rank, r);
        assert_eq!(i.device_ordinal, r % ndev);
        assert_eq!(i.pid == std::process::id(), r == rank);
    }

    // Split even/odd, keys reversed: new rank order is descending old rank.
    let color = (rank % 2) as u32;
    let sub = comm.split(Some(color), -(rank as i32)).unwrap().expect("a colored rank gets a communicator");
    let members: Vec<usize> = (0..n).rev().filter(|r| r % 2 == rank % 2).collect();
    assert_eq!(sub.count(), members.len());
    assert_eq!(sub.rank(), members.iter().position(|&r| r == rank).unwrap());
    let all = sub.bootstrap_allgather(&payload(rank)).unwrap();
    assert_eq!(all, members.iter().map(|&r| payload(r)).collect::<Vec<_>>());
    check_collectives(&sub);

    // Split with NOCOLOR for rank 0: it gets nothing, the others one group.
    let sub2 = comm.split(if rank == 0 { None } else { Some(7) }, 0).unwrap();
    assert_eq!(sub2.is_none(), rank == 0);
    if let Some(s) = &sub2 {
        assert_eq!((s.count(), s.rank()), (n - 1, rank - 1));
        check_collectives(s);
        s.finalize().unwrap();
    }

    // The parent still works after splits.
    comm.bootstrap_barrier().unwrap();
    sub.finalize().unwrap();
    comm.finalize().unwrap();
    assert_eq!(comm.comm_state(), CommState::Finalized);
    assert_eq!(comm.get_async_error(), Ok(()));
}

#[test]
fn world_1_rank() {
    run_ranks("child_world", 1);
}

#[test]
fn world_2_ranks() {
    run_ranks("child_world", 2);
}

#[test]
fn world_3_ranks() {
    run_ranks("child_world", 3);
}

#[test]
fn world_4_ranks() {
    run_ranks("child_world", 4);
}

#[test]
fn world_8_ranks() {
    run_ranks("child_world", 8);
}

/// Child: the last rank aborts; the others see a RemoteError naming it.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_abort() {
    if !is_child("child_abort") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let n = comm.count();
    comm.bootstrap_barrier().unwrap();
    if comm.rank() == n - 1 {
        comm.abort_with_reason("test abort");
        assert!(comm.abort_flag().load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(comm.comm_state(), CommState::Aborted);
        assert!(matches!(comm.bootstrap_barrier(), Err(Error::InvalidUsage(_))));
        return;
    }
    let t = Instant::now();
    let e = comm.bootstrap_allgather(b"x").unwrap_err();
    assert!(t.elapsed() < TIMEOUT / 2, "took {:?}", t.elapsed());
    let who = format!("rank {} aborted", n - 1);
    assert!(matches!(&e, Error::RemoteError(m) if m.contains(&who) && m.contains("test abort")), "{e}");
    assert!(matches!(comm.get_async_error(), Err(Error::RemoteError(m)) if m.contains(&who)));
    assert!(comm.abort_flag().load(std::sync::atomic::Ordering::SeqCst));
    assert!(matches!(comm.finalize(), Err(Error::RemoteError(_))));
}

#[test]
fn abort_2_ranks() {
    run_ranks("child_abort", 2);
}

#[test]
fn abort_3_ranks() {
    run_ranks("child_abort", 3);
}

#[test]
fn abort_4_ranks() {
    run_ranks("child_abort", 4);
}

#[test]
fn abort_8_ranks() {
    run_ranks("child_abort", 8);
}

/// One process, four emulated devices.
#[test]
fn init_all_4_devices() {
    let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 4).unwrap();
    assert_eq!(comms.len(), 4);
    std::thread::scope(|s| {
        for (i, c) in comms.iter().enumerate() {
            s.spawn(move || {
                assert_eq!((c.count(), c.rank(), c.device().ordinal()), (4, i, i));
                check_collectives(c);
                assert_eq!(c.local_ranks().unwrap(), vec![0, 1, 2, 3]);
                let sub = c.split(Some((i % 2) as u32), i as i32).unwrap().unwrap();
                assert_eq!((sub.count(), sub.rank()), (2, i / 2));
                assert_eq!(sub.device().ordinal(), i);
                check_collectives(&sub);
                sub.finalize().unwrap();
                c.finalize().unwrap();
            });
        }
    });
}

/// Same, with explicit devices and config; dropping without finalize does not hang.
#[test]
fn init_all_drop_without_finalize() {
    let devs: Vec<_> = (0..4).map(common::emu).collect();
    let comms = Communicator::init_all_with_config(&devs, Config::default().with_timeouts(TIMEOUT)).unwrap();
    let t = Instant::now();
    drop(comms);
    assert!(t.elapsed() < Duration::from_secs(2));
}
