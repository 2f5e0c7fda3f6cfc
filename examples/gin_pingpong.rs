//! gin_pingpong: two ranks bounce a message through GIN (GPU-initiated
//! networking: the kernel posts puts with a signal, here served by the proxy
//! backend) and report the round trip, with the kernel in a kernel crate of
//! the example's own (`examples/kernels`).
//!
//! ```text
//! cargo run --release -p devcomm-examples --example gin_pingpong      # starts its own two ranks
//! DEVCOMM_GIN_TRANSPORT=tcp cargo run --release -p devcomm-examples --example gin_pingpong
//! ```

use devcomm::prelude::*;
use devcomm_example_kernels::gin_pingpong;
use std::process::ExitCode;

const ITERS: u32 = 200;

fn main() -> ExitCode {
    devcomm_examples::main_with_ranks("gin_pingpong", |_, _| 2, rank_main)
}

fn rank_main() -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let rank = comm.rank();
    let dev = comm.device().clone();
    let stream = dev.stream();
    let module = dev.load_module(devcomm_examples::EXAMPLE_PTX)?;
    let mem = comm.mem_alloc(1 << 16)?;
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
    let mut req = DevCommRequirements::new();
    req.gin_connection_type = GinConnectionType::Full;
    req.gin_signal_count = 1;
    req.use_window(&window); // GIN reaches only the windows named here
    let handle = comm.create_dev_comm(&req)?;
    if rank == 0 {
        println!("gin_pingpong: GIN backend {} on {}", handle.gin_type(), dev.kind());
        println!("     bytes   round trip (us)");
    }
    let (out, errors) = (dev.alloc_from(&[0u64])?, dev.alloc_from(&[0u32])?);
    for bytes in [8u64, 4096, 32768] {
        let payload: Vec<u8> = (0..bytes).map(|i| (i as u8) ^ (rank as u8 * 31)).collect();
        window.write(stream, 0, &payload)?;
        // Signals count up across sizes: start each size from zero.
        handle.reset_gin_signal(0)?;
        comm.bootstrap_barrier()?;
        // SAFETY: the window is registered for GIN and holds 2 * bytes; one block.
        unsafe {
            stream.launch_in::<gin_pingpong>(
                &module,
                LaunchConfig::new(1, 128),
                (handle.dev_comm(), window.desc(), bytes, ITERS, out.as_mut_ptr(), errors.as_mut_ptr()),
            )?;
        }
        if let Some(e) = Error::from_device_code(stream.read_vec(&errors)?[0], "gin_pingpong") {
            return Err(e.context(format!("{bytes} B (GIN proxy: {:?})", handle.gin_error())));
        }
        // The peer's message landed at offset `bytes`.
        let mut got = vec![0u8; bytes as usize];
        window.read(stream, bytes as usize, &mut got)?;
        let peer = 1 - rank;
        let bad = got.iter().enumerate().filter(|&(i, &b)| b != (i as u8) ^ (peer as u8 * 31)).count();
        if bad != 0 {
            return Err(Error::internal(format!("{bytes} B: {bad} bytes from rank {peer} are wrong")));
        }
        if rank == 0 {
            let ns = stream.read_vec(&out)?[0];
            println!("{bytes:>10}   {:>14.2}", ns as f64 / 1000.0 / ITERS as f64);
        }
        comm.bootstrap_barrier()?;
    }
    handle.destroy()?;
    window.deregister()?;
    comm.finalize()
}
