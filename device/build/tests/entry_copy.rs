//! The committed library PTX: the kernels behind the host collectives,
//! send/recv groups and MoE dispatch/combine do not copy their arguments to
//! local memory at entry.
//!
//! A kernel parameter whose address escapes into a function compiled out of
//! line is copied to local memory in the kernel's first block, by every
//! thread, on every path: the 552-byte `CollArgs` cost an 8-byte graphed
//! all-reduce on an H200 2.1 µs of 5.5 (`docs/gpu.md`, lessons of session
//! 14). The all-reduce and reduce kernels keep their LL path free of such
//! calls, and their other paths (and reduce-scatter, the send/recv group and
//! the MoE kernels) hand the device functions a copy of the context in
//! shared memory, made once per CTA (`device/kernels/src/shared.rs`);
//! `benches/gpu/entry_copy.py` lists the kernels that still copy.

use std::path::PathBuf;

/// Bytes each thread stores to local memory before the first branch of
/// every kernel of `ptx`, by kernel name.
fn entry_local_stores(ptx: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (at, _) in ptx.match_indices(".visible .entry ") {
        let rest = &ptx[at + ".visible .entry ".len()..];
        let name = rest[..rest.find('(').unwrap()].to_string();
        let body = &rest[..rest.find("\n}\n").unwrap_or(rest.len())];
        let mut bytes = 0;
        for line in body.lines().skip(3) {
            let l = line.trim();
            if l.starts_with("$L__BB") || l.starts_with('@') || l.starts_with("bra") || l.starts_with("brx") {
                break;
            }
            if let Some(op) = l.strip_prefix("st.local.") {
                let (lanes, ty) = match op.strip_prefix('v') {
                    Some(v) => (v[..1].parse::<usize>().unwrap(), &v[2..]),
                    None => (1, op),
                };
                let width: usize = ty
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                bytes += lanes * width / 8;
            }
        }
        out.push((name, bytes));
    }
    out
}

#[test]
fn collective_and_moe_kernels_start_without_copying_their_arguments() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../host/ptx/devcomm_kernels.sm_90.ptx");
    let ptx = std::fs::read_to_string(&path).unwrap();
    let kernels = entry_local_stores(&ptx);
    let checked: Vec<_> = kernels
        .iter()
        .filter(|(k, _)| {
            (k.starts_with("all_reduce_")
                || k.starts_with("reduce_")
                || k.starts_with("moe_")
                || k == "broadcast"
                || k == "p2p_group")
                && !k.starts_with("reduce_local_")
        })
        .collect();
    // 12 datatypes of all-reduce, the pushed one-shot all-reduce, reduce
    // and reduce-scatter, broadcast, the send/recv group, and the MoE
    // kernels (4 dispatch: low-latency, its single-node form
    // `moe_dispatch_lsa`, two high-throughput; 5 × 3 combine: low-latency,
    // its single-node form `moe_combine_lsa_*`, high-throughput per expert,
    // per source and in the window).
    assert_eq!(checked.len(), 69, "{checked:?}");
    let copying: Vec<_> = checked.iter().filter(|(_, b)| *b >= 64).collect();
    assert!(
        copying.is_empty(),
        "these kernels copy their arguments to local memory at entry (bytes a thread): {copying:?}; keep \
         their LL path free of out-of-line calls that take the context by reference, and give the other \
         paths the shared-memory copy of the context"
    );
    // The check sees a copy where there is one: the local reduction of
    // fp8 (a helper of the hierarchical collectives) still makes it (f16's
    // stopped when its conversions became the hardware's, session 27).
    let local = kernels.iter().find(|(k, _)| k == "reduce_local_fp8e4m3").unwrap();
    assert!(local.1 >= 256, "{local:?}");
}
