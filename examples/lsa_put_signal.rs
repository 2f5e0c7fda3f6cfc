//! lsa_put_signal: ranks in a ring, each copying a block of data into the
//! next rank's window over NVLink (LSA stores) and then signalling it, with
//! the kernel in a kernel crate of the example's own (`examples/kernels`).
//!
//! ```text
//! cargo run --release -p devcomm-examples --example lsa_put_signal   # starts its own ranks
//! devcomm-run -n 4 target/release/examples/lsa_put_signal            # or under a launcher
//! ```

use devcomm::prelude::*;
use devcomm_example_kernels::lsa_put_signal;
use rand::{Rng, SeedableRng};
use std::process::ExitCode;

const BYTES: usize = 100_003 * 8; // a size that is a multiple of nothing useful
const ROUNDS: u64 = 5;

fn main() -> ExitCode {
    // At least two ranks (two share a GPU when there is one), one per GPU up to 8.
    let nranks = |kind, devices: usize| match kind {
        RuntimeKind::Cuda => devices.clamp(2, 8),
        RuntimeKind::Emulated => 4,
    };
    devcomm_examples::main_with_ranks("lsa_put_signal", nranks, rank_main)
}

fn rank_main() -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let (rank, n) = (comm.rank(), comm.count());
    let dev = comm.device().clone();
    let stream = dev.stream();
    let module = dev.load_module(devcomm_examples::EXAMPLE_PTX)?;

    // Window: [my data | what the previous rank sent | signal word].
    let (src_off, dst_off, sig_off) = (0, BYTES, 2 * BYTES);
    let mem = comm.mem_alloc(2 * BYTES + 8)?;
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
    let mut req = DevCommRequirements::new();
    req.use_window(&window);
    let handle = comm.create_dev_comm(&req)?;
    let lsa = window.desc().lsa_size() as usize;
    if lsa != n {
        return Err(Error::invalid_usage(format!("this example needs every rank in one LSA team ({lsa} of {n})")));
    }

    // Window memory is not zeroed: the signal starts at 0 on every rank
    // before anyone can add to it (the barrier in the first round).
    window.write(stream, sig_off, &[0u64])?;
    let errors = dev.alloc_from(&[0u32])?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x1ea5 + rank as u64);
    for round in 1..=ROUNDS {
        let data: Vec<u64> = (0..BYTES / 8).map(|_| rng.gen()).collect();
        window.write(stream, src_off, &data)?;
        window.write(stream, dst_off, &vec![0xA5A5_A5A5_A5A5_A5A5u64; BYTES / 8])?; // poison
        comm.bootstrap_barrier()?; // everyone's poison is down before anyone sends
                                   // SAFETY: the window holds the three regions; one block; `errors` one word.
        unsafe {
            stream.launch_in::<lsa_put_signal>(
                &module,
                LaunchConfig::new(1, 256),
                (
                    handle.dev_comm(),
                    window.desc(),
                    src_off as u64,
                    dst_off as u64,
                    sig_off as u64,
                    BYTES as u64,
                    round,
                    errors.as_mut_ptr(),
                ),
            )?;
        }
        if let Some(e) = Error::from_device_code(stream.read_vec(&errors)?[0], "lsa_put_signal") {
            return Err(e);
        }
        // What arrived is what the previous rank sent this round.
        let prev = (rank + n - 1) % n;
        let mut prev_rng = rand::rngs::StdRng::seed_from_u64(0x1ea5 + prev as u64);
        let want: Vec<u64> =
            (0..round).map(|_| (0..BYTES / 8).map(|_| prev_rng.gen()).collect::<Vec<u64>>()).last().unwrap();
        let mut got = vec![0u64; BYTES / 8];
        window.read(stream, dst_off, &mut got)?;
        let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        if bad != 0 {
            return Err(Error::internal(format!("round {round}: {bad} words from rank {prev} are wrong")));
        }
        comm.bootstrap_barrier()?; // everyone checked before the next round overwrites
    }
    if rank == 0 {
        println!(
            "lsa_put_signal: {n} ranks on {}, {ROUNDS} rounds of {BYTES} B to the next rank, every byte checked",
            dev.kind()
        );
    }
    handle.destroy()?;
    window.deregister()?;
    comm.finalize()
}
