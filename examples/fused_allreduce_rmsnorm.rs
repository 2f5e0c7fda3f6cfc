//! fused_allreduce_rmsnorm: all-reduce then RMSNorm in one kernel, the
//! headline use of a device API: `coll::reduce_scatter` gives each rank its
//! shard of rows summed, the kernel normalises only those rows, and
//! `coll::all_gather` assembles the result, all inside one launch of a
//! user's kernel (`allreduce_rmsnorm` in `examples/kernels`). Checked
//! against a host reference in f64, and timed against the unfused way (the
//! host `all_reduce`, then an RMSNorm kernel).
//!
//! ```text
//! cargo run --release -p devcomm-examples --example fused_allreduce_rmsnorm
//! ```

use devcomm::coll::Op;
use devcomm::prelude::*;
use devcomm::runtime::Event;
use devcomm_device::comm::SymPtr;
use devcomm_example_kernels::{allreduce_rmsnorm, rms_norm};
use std::process::ExitCode;

const ROWS: usize = 64; // a multiple of every rank count used (1, 2, 4, 8)
const COLS: usize = 1000;
const EPS: f32 = 1e-6;
/// Timed launches each way (on GPUs; the emulated runtime's times mean
/// nothing, so it only checks).
const ITERS: usize = 20;

fn value(rank: usize, i: usize) -> f32 {
    ((i * 7919 + rank * 104_729) % 1000) as f32 / 500.0 - 1.0
}

fn main() -> ExitCode {
    let nranks = |kind, gpus: usize| if kind == RuntimeKind::Cuda { gpus.clamp(2, 8) } else { 2 };
    devcomm_examples::main_with_ranks("fused_allreduce_rmsnorm", nranks, rank_main)
}

fn rank_main() -> Result<()> {
    let comm = Communicator::init_from_env()?;
    let (rank, n) = (comm.rank(), comm.count());
    let dev = comm.device().clone();
    let stream = dev.stream();
    let module = dev.load_module(devcomm_examples::EXAMPLE_PTX)?;
    let coll = comm.collectives()?;

    // x lives in a window (the reduce-scatter reads the peers' copies in place).
    let bytes = ROWS * COLS * 4;
    let mem = comm.mem_alloc(bytes)?;
    let window = comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC)?;
    let x: Vec<f32> = (0..ROWS * COLS).map(|i| value(rank, i)).collect();
    window.write(stream, 0, &x)?;
    let weight: Vec<f32> = (0..COLS).map(|c| 0.5 + (c % 13) as f32 / 13.0).collect();
    let weight_dev = dev.alloc_from(&weight)?;
    let shard = dev.alloc::<f32>(ROWS / n * COLS)?;
    let out = dev.alloc::<f32>(ROWS * COLS)?;
    let summed = dev.alloc::<f32>(ROWS * COLS)?;
    let out_unfused = dev.alloc::<f32>(ROWS * COLS)?;
    let errors = dev.alloc_from(&[0u32])?;
    let x_sym = SymPtr::<f32>::new(window.desc(), 0);
    let cfg = LaunchConfig::new(1, 256).with_shared_mem(128);

    let fused = || -> Result<()> {
        // SAFETY: the context is this program's alone and used on this
        // stream only; x holds ROWS × COLS floats in the window on every
        // rank; shard, out and weight have their sizes; ROWS is a multiple
        // of the rank count; one block with 128 bytes of shared memory.
        unsafe {
            stream.launch_in::<allreduce_rmsnorm>(
                &module,
                cfg,
                (
                    coll.context(),
                    x_sym,
                    shard.as_mut_ptr(),
                    out.as_mut_ptr(),
                    weight_dev.as_ptr(),
                    ROWS as u32,
                    COLS as u32,
                    EPS,
                    errors.as_mut_ptr(),
                ),
            )
        }
    };
    let unfused = || -> Result<()> {
        let x_op = devcomm::coll::Operand::window(&window, 0, ROWS * COLS)?;
        coll.all_reduce(x_op, &summed, Op::Sum, stream)?;
        // SAFETY: `summed`, `out_unfused`: ROWS × COLS floats; weight: COLS.
        unsafe {
            stream.launch_in::<rms_norm>(
                &module,
                LaunchConfig::new(ROWS as u32, 256).with_shared_mem(128),
                (summed.as_ptr(), out_unfused.as_mut_ptr(), weight_dev.as_ptr(), ROWS as u32, COLS as u32, EPS),
            )
        }
    };

    // Check both against the host: sum over ranks in f64, then the norm.
    fused()?;
    unfused()?;
    coll.synchronize(stream)?;
    if let Some(e) = Error::from_device_code(stream.read_vec(&errors)?[0], "allreduce_rmsnorm") {
        return Err(e);
    }
    let (got, got_unfused) = (stream.read_vec(&out)?, stream.read_vec(&out_unfused)?);
    let mut worst = 0.0f64;
    for r in 0..ROWS {
        let row: Vec<f64> = (0..COLS).map(|c| (0..n).map(|q| value(q, r * COLS + c) as f64).sum()).collect();
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / COLS as f64 + EPS as f64).sqrt();
        for c in 0..COLS {
            let want = row[c] * inv * weight[c] as f64;
            for g in [got[r * COLS + c], got_unfused[r * COLS + c]] {
                worst = worst.max((g as f64 - want).abs() / want.abs().max(1.0));
            }
        }
    }
    if worst > 1e-4 {
        return Err(Error::internal(format!("fused all-reduce + RMSNorm off the host reference by {worst:e}")));
    }

    if dev.kind() != RuntimeKind::Cuda {
        if rank == 0 {
            println!(
                "fused_allreduce_rmsnorm: {ROWS}×{COLS} floats over {n} ranks matched the host reference (worst relative error {worst:.1e}); \
                 timed on GPUs only ({} runtime)",
                dev.kind()
            );
        }
    } else {
        // Time both ways: warm-up, then the median of ITERS launches each.
        let (iters, warm) = (ITERS, 3);
        let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
            let mut t = Vec::new();
            for i in 0..iters + warm {
                comm.bootstrap_barrier()?;
                let (a, b) = (Event::new(&dev)?, Event::new(&dev)?);
                stream.record(&a)?;
                f()?;
                stream.record(&b)?;
                coll.synchronize(stream)?;
                if i >= warm {
                    t.push(a.elapsed_ms(&b)? as f64 * 1000.0);
                }
            }
            t.sort_by(f64::total_cmp);
            Ok(t[t.len() / 2])
        };
        let (tf, tu) = (time(&fused)?, time(&unfused)?);
        if rank == 0 {
            println!(
                "fused_allreduce_rmsnorm: {ROWS}×{COLS} floats over {n} ranks matched the host reference (worst relative error {worst:.1e}); \
                 median of {iters}: fused {tf:.1} µs, all_reduce then rms_norm {tu:.1} µs ({} runtime)",
                dev.kind()
            );
        }
    }
    drop(coll);
    window.deregister()?;
    comm.finalize()
}
