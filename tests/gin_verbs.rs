//! The GIN proxy's RDMA Verbs transport selected with
//! `DEVCOMM_GIN_TRANSPORT=verbs`, ranks in separate processes.
//!
//! Built with the `verbs` feature (`cargo test -p devcomm-tests --features
//! verbs --test gin_verbs`): on a machine without an RDMA device (the
//! project's machines, CI) every rank's `create_dev_comm` returns
//! `InvalidUsage` naming the cause, promptly; where a device exists, the
//! transport connects and the test says so. Built without it: `verbs` is an
//! `InvalidArgument` saying the build lacks the feature. Either way the
//! communicator keeps working (TCP connects afterwards), and ranks asking
//! for different transports fail on every rank.

mod common;

use common::is_child;
use devcomm::comm::Communicator;
use devcomm::gin::{GinConnectionType, GIN_TRANSPORT_ENV, VERBS_BUILT};
use devcomm::{DevCommRequirements, Error, WindowFlags};
use std::time::{Duration, Instant};

fn requirements() -> DevCommRequirements {
    let mut req = DevCommRequirements::new();
    req.gin_connection_type = GinConnectionType::Full;
    req.gin_signal_count = 2;
    req.gin_counter_count = 1;
    req
}

/// Child: `verbs` gives every rank the typed error (or connects where an
/// RDMA device exists); then TCP works, and mixed choices fail everywhere.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_gin_verbs() {
    if !is_child("child_gin_verbs") {
        return;
    }
    std::env::set_var(GIN_TRANSPORT_ENV, "verbs");
    let comm = Communicator::init_from_env().unwrap();
    let rank = comm.rank();
    let mem = comm.mem_alloc(1 << 20).unwrap();
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    let mut req = requirements();
    req.use_window(&window);

    let t = Instant::now();
    let r = comm.create_dev_comm(&req);
    let took = t.elapsed();
    match r {
        Ok(handle) if VERBS_BUILT => {
            eprintln!("rank {rank}: an RDMA device exists here: the verbs transport connected");
            handle.destroy().unwrap();
        }
        Err(Error::InvalidUsage(m)) if VERBS_BUILT => {
            assert!(m.contains("verbs") && (m.contains("RDMA") || m.contains("libibverbs")), "rank {rank}: {m}");
            eprintln!("rank {rank}: {m}");
        }
        Err(Error::InvalidArgument(m)) if !VERBS_BUILT => {
            assert!(m.contains("`verbs` cargo feature"), "rank {rank}: {m}");
        }
        other => panic!("rank {rank}: unexpected outcome of create_dev_comm with verbs: {other:?}"),
    }
    assert!(took < Duration::from_secs(10), "rank {rank}: create_dev_comm took {took:?}");

    // Nothing is left half-connected: the communicator and TCP still work.
    assert_eq!(comm.bootstrap_allgather(b"alive").unwrap().len(), comm.count());
    std::env::set_var(GIN_TRANSPORT_ENV, "tcp");
    comm.create_dev_comm(&req).unwrap().destroy().unwrap();

    // Ranks that ask for different transports: an error on every rank.
    std::env::set_var(GIN_TRANSPORT_ENV, if rank == 0 { "verbs" } else { "tcp" });
    let r = comm.create_dev_comm(&req);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "rank {rank}: {r:?}");
    if VERBS_BUILT {
        let m = r.unwrap_err().to_string();
        assert!(m.contains("every rank must ask for the same"), "rank {rank}: {m}");
    }
    assert_eq!(comm.bootstrap_allgather(b"still alive").unwrap().len(), comm.count());
    window.deregister().unwrap();
    comm.finalize().unwrap();
}

/// Every rank its own node: the verbs transport would serve remote peers.
#[test]
fn gin_verbs_across_nodes() {
    common::run_on_runtime("child_gin_verbs", 3, &[("DEVCOMM_LSA_SIZE", "1".to_string())]);
}

/// One node: the verbs transport serves same-host peers too.
#[test]
fn gin_verbs_one_node() {
    common::run_on_runtime("child_gin_verbs", 2, &[]);
}
