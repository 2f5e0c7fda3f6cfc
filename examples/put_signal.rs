//! put_signal: host-side one-sided communication (NCCL's `ncclPutSignal` /
//! `ncclWaitSignal`): two ranks bounce a buffer between their streams with
//! `HostRma::put_signal` and `HostRma::wait_signal` — no kernel of the
//! example's own, every call queued on the stream like a kernel launch —
//! check every element, and report the stream-to-stream round trip.
//!
//! ```text
//! cargo run --release -p devcomm-examples --example put_signal      # starts its own two ranks
//! DEVCOMM_LSA_SIZE=1 DEVCOMM_GIN_TRANSPORT=tcp cargo run --release -p devcomm-examples --example put_signal
//! ```

use devcomm::prelude::*;
use devcomm::rma::WaitSignal;
use std::process::ExitCode;
use std::time::Instant;

const ITERS: usize = 50;

fn main() -> ExitCode {
    devcomm_examples::main_with_ranks("put_signal", |_, _| 2, rank_main)
}

fn rank_main() -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let dev = comm.device().clone();
    let stream = dev.stream();
    let mem = comm.mem_alloc(1 << 20)?;
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
    // The windows put_signal may write to are named when the HostRma is made.
    let rma = comm.host_rma(&[&window])?;
    if rank == 0 {
        println!("put_signal: GIN backend {} on {}", rma.dev_comm().gin_type(), dev.kind());
        println!("  elements (u32)   round trip (us)");
    }
    for len in [2usize, 1000, 100_003] {
        let mine: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2654435761) ^ (rank as u32 + 1)).collect();
        let x = dev.alloc_from(&mine)?;
        comm.bootstrap_barrier()?;
        let t = Instant::now();
        for _ in 0..ITERS {
            // Rank 0 sends first; rank 1 answers each message it receives.
            if rank == 0 {
                rma.put_signal(&x, peer, &window, 0, 0, stream)?;
                rma.wait_signal(&[WaitSignal::new(peer, 1)], stream)?;
            } else {
                rma.wait_signal(&[WaitSignal::new(peer, 1)], stream)?;
                rma.put_signal(&x, peer, &window, 0, 0, stream)?;
            }
        }
        rma.synchronize(stream)?;
        let us = t.elapsed().as_secs_f64() * 1e6 / ITERS as f64;
        // The peer's elements landed at element 0 of this rank's window.
        let mut got = vec![0u32; len];
        window.read(stream, 0, &mut got)?;
        let want: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2654435761) ^ (peer as u32 + 1)).collect();
        if got != want {
            let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            return Err(Error::internal(format!("{len} elements: {bad} from rank {peer} are wrong")));
        }
        if rank == 0 {
            println!("{len:>16}   {us:>15.2}");
        }
        comm.bootstrap_barrier()?;
    }
    if rank == 0 {
        println!("every element checked");
    }
    rma.destroy()?;
    window.deregister()?;
    comm.finalize()
}
