//! hello: every rank bootstraps, launches a kernel on its device (a GPU, or an
//! emulated one when there is none), checks the result against the host, and
//! the ranks compare notes over the bootstrap.
//!
//! ```text
//! cargo run --release -p devcomm-examples --example hello     # starts its own ranks
//! devcomm-run -n 2 target/release/examples/hello              # or under a launcher
//! DEVCOMM_RUNTIME=emulated cargo run -p devcomm-examples --example hello
//! ```

use devcomm::comm::Communicator;
use devcomm::runtime::{Event, LaunchConfig, RuntimeKind};
use devcomm::{Error, Result};
use devcomm_kernels::util::block_sum_u64;
use rand::{Rng, SeedableRng};
use std::process::ExitCode;

fn main() -> ExitCode {
    // One rank per GPU (up to 8), or 4 emulated ranks.
    let nranks = |kind, devices: usize| match kind {
        RuntimeKind::Cuda => devices.clamp(1, 8),
        RuntimeKind::Emulated => 4,
    };
    devcomm_examples::main_with_ranks("hello", nranks, rank_main)
}

fn rank_main() -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let (rank, nranks) = (comm.rank(), comm.count());
    let dev = comm.device().clone();
    let stream = dev.stream();

    // Rank-seeded random data; a size that is a multiple of nothing.
    let n: u32 = 100_003;
    let threads = 256u32;
    let blocks = n.div_ceil(threads);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed + rank as u64);
    let input: Vec<u64> = (0..n).map(|_| rng.gen()).collect();

    let d_in = dev.alloc_from(&input)?;
    let mut d_sums = dev.alloc::<u64>(blocks as usize)?;
    let mut d_echo = dev.alloc::<u64>((blocks * threads) as usize)?;
    stream.memset(&mut d_sums, 0xA5)?; // poison: every block must write its sum
    stream.memset(&mut d_echo, 0xA5)?;

    let (start, end) = (Event::new(&dev)?, Event::new(&dev)?);
    stream.record(&start)?;
    // SAFETY: the buffers have the sizes block_sum_u64 requires and live until
    // after the stream is synchronised by the reads below.
    unsafe {
        stream.launch::<block_sum_u64>(
            LaunchConfig::new(blocks, threads).with_shared_mem(threads * 8),
            (d_in.as_ptr(), n, d_sums.as_mut_ptr(), d_echo.as_mut_ptr()),
        )?;
    }
    stream.record(&end)?;
    let sums = stream.read_vec(&d_sums)?;
    let echo = stream.read_vec(&d_echo)?;
    let ms = start.elapsed_ms(&end)?;

    // Host reference: block b sums input[(b*T + t) % n]; echo is the block reversed.
    let mut bad = 0usize;
    for b in 0..blocks {
        let vals: Vec<u64> = (0..threads).map(|t| input[((b * threads + t) % n) as usize]).collect();
        let want = vals.iter().fold(0u64, |a, v| a.wrapping_add(*v));
        bad += (sums[b as usize] != want) as usize;
        for t in 0..threads {
            bad += (echo[(b * threads + t) as usize] != vals[(threads - 1 - t) as usize]) as usize;
        }
    }
    let total = sums.iter().fold(0u64, |a, v| a.wrapping_add(*v));

    // Compare notes: every rank learns every rank's verdict.
    let note = format!("{}|{}|{}|{:016x}|{:.3}", dev.kind(), dev.name(), bad, total, ms);
    let notes = comm.bootstrap_allgather(note.as_bytes())?;
    let mut failed = 0;
    if rank == 0 {
        println!("rank  runtime   device                 mismatches  checksum          kernel ms");
    }
    for (r, bytes) in notes.iter().enumerate() {
        let text = String::from_utf8_lossy(bytes);
        let f: Vec<&str> = text.split('|').collect();
        if f.len() != 5 {
            return Err(Error::remote(format!("rank {r} sent a malformed note {text:?}")));
        }
        failed += (f[2] != "0") as usize;
        if rank == 0 {
            println!("{r:>4}  {:<9} {:<22} {:>10}  {}  {:>9}", f[0], f[1], f[2], f[3], f[4]);
        }
    }
    comm.finalize()?;
    if failed > 0 {
        return Err(Error::internal(format!("{failed} of {nranks} ranks computed wrong sums")));
    }
    if rank == 0 {
        println!("hello: all {nranks} ranks launched block_sum_u64 and matched the host reference");
    }
    Ok(())
}
