//! Bad input to windows and device communicators: a typed error on every
//! rank, never a panic or a hang, and the communicator keeps working.

mod common;

use common::{child_job, is_child, run};
use devcomm::comm::{Communicator, Config};
use devcomm::dev_comm::{DevCommRequirements, MAX_BARRIERS};
use devcomm::team::TeamKind;
use devcomm::window::WindowFlags;
use devcomm::Error;

/// The communicator still works: an allgather returns every rank's byte.
fn alive(comm: &Communicator) {
    let all = comm.bootstrap_allgather(&[comm.rank() as u8]).expect("communicator still usable");
    assert_eq!(all, (0..comm.count()).map(|r| vec![r as u8]).collect::<Vec<_>>());
}

macro_rules! assert_err {
    ($comm:expr, $e:expr, $variant:ident) => {{
        let r = $e;
        assert!(
            matches!(r, Err(Error::$variant(_))),
            "{}: expected {}, got {:?}",
            stringify!($e),
            stringify!($variant),
            r
        );
        alive($comm);
    }};
}

/// Bad input when the LSA team is the world.
fn bad_inputs(comm: &Communicator) {
    let (n, rank) = (comm.count(), comm.rank());
    let mem = comm.mem_alloc(4 * 4096).unwrap();
    assert!(matches!(comm.mem_alloc(0), Err(Error::InvalidArgument(_))));

    // Registration: unaligned offset, zero length, past the end, COLL_SYMMETRIC with different sizes.
    assert_err!(comm, comm.register_window(mem.region(100, 4096), WindowFlags::DEFAULT), InvalidArgument);
    assert_err!(comm, comm.register_window(mem.region(0, 0), WindowFlags::DEFAULT), InvalidArgument);
    assert_err!(comm, comm.register_window(mem.region(8192, 4 * 4096), WindowFlags::DEFAULT), InvalidArgument);
    assert_err!(comm, comm.register_window(mem.region(usize::MAX - 4095, 4096), WindowFlags::DEFAULT), InvalidArgument);
    assert_err!(
        comm,
        comm.register_window(mem.region(0, 4096 * (1 + rank % 2)), WindowFlags::COLL_SYMMETRIC),
        InvalidArgument
    );
    // Only rank 0 is wrong: every rank gets the error.
    let off = if rank == 0 { 100 } else { 0 };
    let r = comm.register_window(mem.region(off, 4096), WindowFlags::DEFAULT);
    match r {
        Err(Error::InvalidArgument(m)) => assert!(rank == 0 || m.contains("rank 0"), "{m}"),
        other => panic!("rank {rank}: expected InvalidArgument, got {other:?}"),
    }
    alive(comm);
    // Different offsets on different ranks.
    assert_err!(comm, comm.register_window(mem.region(4096 * (rank % 2), 4096), WindowFlags::DEFAULT), InvalidArgument);

    // A good window; the same buffer (an overlapping region) again.
    let w = comm.register_window(&mem, WindowFlags::DEFAULT).unwrap();
    assert_err!(comm, comm.register_window(mem.region(4096, 4096), WindowFlags::DEFAULT), InvalidUsage);
    assert_err!(comm, comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC), InvalidUsage);

    // Pointers: offset past the end, LSA rank out of range, team peer out of range.
    let (world, lsa, _) = comm.teams().unwrap();
    assert!(matches!(w.lsa_pointer(w.size(), 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.lsa_pointer(0, lsa.nranks as usize), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.peer_pointer(&world, 0, w.size()), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.peer_pointer(&world, n, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.sym_ptr::<u32>(w.size()), Err(Error::InvalidArgument(_))));
    let mut buf = [0u8; 16];
    assert!(matches!(w.read_lsa(comm.device().stream(), 0, w.size() - 8, &mut buf), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.write(comm.device().stream(), usize::MAX, &buf), Err(Error::InvalidArgument(_))));
    assert!(matches!(mem.write(comm.device().stream(), mem.size() - 8, &buf), Err(Error::InvalidArgument(_))));

    // Bad requirements.
    let bad_req = |f: &dyn Fn(&mut DevCommRequirements)| {
        let mut r = DevCommRequirements::new();
        f(&mut r);
        comm.create_dev_comm(&r).map(|_| ())
    };
    assert_err!(
        comm,
        bad_req(&|r| {
            r.require_team(TeamKind::Lsa, true);
        }),
        InvalidUsage
    );
    assert_err!(comm, bad_req(&|r| r.lsa_barrier_count = MAX_BARRIERS + 1), InvalidArgument);
    assert_err!(comm, bad_req(&|r| r.barrier_count = u32::MAX), InvalidArgument);
    assert_err!(
        comm,
        bad_req(&|r| {
            r.add_resource(64, 3);
        }),
        InvalidArgument
    );
    assert_err!(
        comm,
        bad_req(&|r| {
            r.add_resource(64, 8192);
        }),
        InvalidArgument
    );
    assert_err!(
        comm,
        bad_req(&|r| {
            r.add_resource(0, 8);
        }),
        InvalidArgument
    );
    // Requirements that differ between ranks.
    assert_err!(comm, bad_req(&|r| r.lsa_barrier_count = rank as u32), InvalidArgument);

    // A window in use by a live device communicator cannot be deregistered.
    let mut req = DevCommRequirements::new();
    req.lsa_barrier_count = 1;
    let res = req.add_resource(128, 128);
    req.use_window(&w);
    let dc = comm.create_dev_comm(&req).unwrap();
    let other = DevCommRequirements::new().add_resource(8, 8);
    assert!(matches!(dc.resource_offset(other), Err(Error::InvalidArgument(_))));
    assert!(dc.resource_offset(res).is_ok());
    assert_err!(comm, w.deregister(), InvalidUsage);
    // The mapping lives on for the device communicator; destroying it works.
    dc.destroy().unwrap();
    alive(comm);
    // The region is free again once both are gone.
    let w = comm.register_window(&mem, WindowFlags::DEFAULT).unwrap();
    // Requirements naming a window released since: refused.
    let mut req = DevCommRequirements::new();
    req.use_window(&w);
    w.deregister().unwrap();
    alive(comm);
    assert_err!(comm, comm.create_dev_comm(&req).map(|_| ()), InvalidArgument);
}

/// Bad input that needs an LSA team smaller than the world (run with `DEVCOMM_LSA_SIZE=1`).
fn bad_inputs_multi_node(comm: &Communicator) {
    let (n, rank) = (comm.count(), comm.rank());
    assert_eq!(comm.lsa_size().unwrap(), 1);
    let mem = comm.mem_alloc(4096).unwrap();
    let w = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let (world, _, rail) = comm.teams().unwrap();
    let other = (rank + 1) % n;
    assert!(matches!(w.peer_pointer(&world, other, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.peer_pointer(&rail, other, 0), Err(Error::InvalidArgument(_))));
    assert_eq!(w.peer_pointer(&world, rank, 0).unwrap(), w.lsa_pointer(0, 0).unwrap());
    let mut req = DevCommRequirements::new();
    req.barrier_count = 1;
    let r = comm.create_dev_comm(&req);
    assert!(matches!(&r, Err(Error::InvalidUsage(m)) if m.contains("GIN")), "{r:?}");
    alive(comm);
    let mut req = DevCommRequirements::new();
    req.require_team(TeamKind::World, false);
    assert_err!(comm, comm.create_dev_comm(&req).map(|_| ()), InvalidUsage);
    let mut req = DevCommRequirements::new();
    req.require_team(TeamKind::Rail, false);
    assert_err!(comm, comm.create_dev_comm(&req).map(|_| ()), InvalidUsage);
    w.deregister().unwrap();
    alive(comm);
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_bad_inputs() {
    if !is_child("child_bad_inputs") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    if comm.lsa_size().unwrap() == comm.count() {
        bad_inputs(&comm);
    } else {
        bad_inputs_multi_node(&comm);
    }
    comm.finalize().unwrap();
}

fn run_job(n: usize, lsa: Option<usize>) {
    let mut job = child_job("child_bad_inputs", n);
    if let Some(l) = lsa {
        job = job.env("DEVCOMM_LSA_SIZE", l.to_string());
    }
    for (r, s) in run(&job).iter().enumerate() {
        assert!(s.success(), "rank {r} of {n}: {}", devcomm::launch::describe(s));
    }
}

#[test]
fn bad_inputs_2_processes() {
    run_job(2, None);
}

#[test]
fn bad_inputs_3_processes_multi_node() {
    run_job(3, Some(1));
}

#[test]
fn bad_inputs_threads() {
    let devs: Vec<_> = (0..2).map(common::emu).collect();
    let comms = Communicator::init_all_with_config(&devs, Config::default().with_timeouts(common::TIMEOUT)).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || bad_inputs(c));
        }
    });
}

/// A bad LSA size override is refused (single rank: nothing to agree with).
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_bad_lsa_override() {
    if !is_child("child_bad_lsa_override") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    assert!(matches!(comm.lsa_size(), Err(Error::InvalidArgument(m)) if m.contains("DEVCOMM_LSA_SIZE")));
    let mem = comm.mem_alloc(4096).unwrap();
    assert_err!(&comm, comm.register_window(&mem, WindowFlags::DEFAULT), InvalidArgument);
    comm.finalize().unwrap();
}

#[test]
fn bad_lsa_override() {
    for (n, v) in [(2, "3"), (2, "0"), (2, "x"), (4, "8")] {
        let job = child_job("child_bad_lsa_override", n).env("DEVCOMM_LSA_SIZE", v);
        for (r, s) in run(&job).iter().enumerate() {
            assert!(s.success(), "DEVCOMM_LSA_SIZE={v}, rank {r} of {n}: {}", devcomm::launch::describe(s));
        }
    }
}
