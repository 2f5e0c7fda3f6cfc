//! moe: a toy mixture-of-experts layer on every rank: a router picks each
//! token's top-2 experts, `EpGroup::dispatch` sends the tokens to the ranks
//! holding them, each rank multiplies its experts' tokens by the expert's
//! matrix (a kernel), `EpGroup::combine` brings the outputs back weighted
//! by the gates. Checked exactly against the same layer on the host.
//!
//! ```text
//! cargo run --release -p devcomm-examples --example moe   # starts its own ranks
//! MOE_MODE=ht cargo run --release -p devcomm-examples --example moe   # high-throughput mode
//! ```

use devcomm::moe::{EpConfig, EpGroup, EpMode};
use devcomm::prelude::*;
use devcomm_example_kernels::expert_matmul_f32;
use std::process::ExitCode;

const EXPERTS_PER_RANK: usize = 2;
const HIDDEN: usize = 16;
const TOP_K: usize = 2;
const TOKENS: usize = 24;

/// Expert `e`'s matrix; rank `r`'s tokens; gates as small dyadic numbers (exact sums).
fn weight(e: usize, i: usize, c: usize) -> f32 {
    ((e * 7 + i * 3 + c) % 5) as f32 - 2.0
}
fn token(r: usize, t: usize, i: usize) -> f32 {
    ((r * 11 + t * 5 + i) % 9) as f32 * 0.25 - 1.0
}

/// The router: expert scores by a fixed rule, top-2, gates 0.75 / 0.25.
fn route(r: usize, t: usize, experts: usize) -> ([i32; TOP_K], [f32; TOP_K]) {
    let a = (r * 5 + t * 3) % experts;
    ([a as i32, ((a + 1 + t % (experts - 1).max(1)) % experts) as i32], [0.75, 0.25])
}

fn main() -> ExitCode {
    let nranks = |kind, gpus: usize| if kind == RuntimeKind::Cuda { gpus.clamp(2, 8) } else { 3 };
    devcomm_examples::main_with_ranks("moe", nranks, || {
        let comm = Communicator::init_from_env()?;
        let (dev, stream, me) = (comm.device(), comm.device().stream(), comm.rank());
        let experts = EXPERTS_PER_RANK * comm.count();
        let ht = std::env::var("MOE_MODE").is_ok_and(|m| m == "ht");
        let mode = if ht { EpMode::HighThroughput } else { EpMode::LowLatency };
        let ep = EpGroup::new(&comm, &EpConfig::new(experts, HIDDEN, TOP_K, TOKENS).with_mode(mode))?;
        let module = dev.load_module(devcomm_examples::EXAMPLE_PTX)?; // before kernels that wait on peers
        let (mut x, mut idx, mut gate) = (vec![], vec![], vec![]);
        for t in 0..TOKENS {
            x.extend((0..HIDDEN).map(|i| token(me, t, i)));
            let (e, g) = route(me, t, experts);
            idx.extend(e);
            gate.extend(g);
        }
        let (xd, idxd, gated) = (dev.alloc_from(&x)?, dev.alloc_from(&idx)?, dev.alloc_from(&gate)?);
        let d = ep.dispatch(&xd, &idxd, &gated, stream)?; // tokens packed per local expert
        let w: Vec<f32> = (0..EXPERTS_PER_RANK * HIDDEN * HIDDEN)
            .map(|k| weight(me * EXPERTS_PER_RANK + k / (HIDDEN * HIDDEN), k / HIDDEN % HIDDEN, k % HIDDEN))
            .collect();
        let (wd, out) = (dev.alloc_from(&w)?, dev.alloc::<f32>(d.recv_x.len())?);
        let rows = (comm.count() * TOKENS) as u32;
        let args = (
            d.recv_x.as_mut_ptr() as *const f32,
            wd.as_mut_ptr() as *const f32,
            d.recv_count.as_mut_ptr() as *const u32,
            out.as_mut_ptr(),
            EXPERTS_PER_RANK as u32,
            rows,
            HIDDEN as u32,
        );
        // SAFETY: the buffers hold the sizes the kernel documents (the group's layout).
        unsafe { stream.launch_in::<expert_matmul_f32>(&module, LaunchConfig::new(8, 128), args)? };
        let y = stream.read_vec(&ep.combine(&out, &d.handle, stream)?)?; // gate-weighted sums
        ep.synchronize(stream)?;
        // The same layer on the host, in the same order.
        let ok = (0..TOKENS).all(|t| {
            let (e, g) = route(me, t, experts);
            (0..HIDDEN).all(|c| {
                let mut want = 0.0f32;
                for j in 0..TOP_K {
                    let dot = (0..HIDDEN).fold(0.0f32, |a, i| a + token(me, t, i) * weight(e[j] as usize, i, c));
                    want += g[j] * dot;
                }
                y[t * HIDDEN + c] == want
            })
        });
        println!(
            "moe: rank {me}: {TOKENS} tokens through {experts} experts (top-{TOP_K}), {}",
            if ok { "matched the host reference" } else { "WRONG" }
        );
        drop(ep);
        comm.finalize()?;
        if ok {
            Ok(())
        } else {
            Err(Error::internal("the MoE layer differs from the host"))
        }
    })
}
