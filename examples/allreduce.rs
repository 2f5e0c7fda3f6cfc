//! allreduce: NCCL's `ncclAllReduce` from Rust, on every rank: each rank
//! contributes a vector, every rank gets the sum.
//!
//! ```text
//! cargo run --release -p devcomm-examples --example allreduce   # starts its own ranks
//! devcomm-run -n 4 target/release/examples/allreduce            # or under a launcher
//! ```

use devcomm::coll::Op;
use devcomm::prelude::*;
use std::process::ExitCode;

fn main() -> ExitCode {
    // One rank per GPU (two sharing a GPU when there is one), 4 emulated.
    let nranks = |kind, gpus: usize| if kind == RuntimeKind::Cuda { gpus.clamp(2, 8) } else { 4 };
    devcomm_examples::main_with_ranks("allreduce", nranks, || {
        let comm = Communicator::init_from_env()?;
        let coll = comm.collectives()?; // once per communicator: scratch and barriers
        let stream = comm.device().stream();
        let n = 1_000_003; // floats per rank
        let mine: Vec<f32> = (0..n).map(|i| (comm.rank() + 1) as f32 * (i % 7) as f32).collect();
        let send = comm.device().alloc_from(&mine)?;
        let recv = comm.device().alloc::<f32>(n)?;
        coll.all_reduce(&send, &recv, Op::Sum, stream)?; // stream-ordered
        coll.synchronize(stream)?;
        let got = stream.read_vec(&recv)?;
        let ranks = comm.count() as f32;
        let ok = got.iter().enumerate().all(|(i, &v)| v == ranks * (ranks + 1.0) / 2.0 * (i % 7) as f32);
        if comm.rank() == 0 {
            println!(
                "allreduce: {n} floats summed over {} ranks: {}",
                comm.count(),
                if ok { "matched" } else { "WRONG" }
            );
        }
        drop(coll);
        comm.finalize()?;
        if ok {
            Ok(())
        } else {
            Err(Error::internal("all_reduce gave a wrong sum"))
        }
    })
}
