#!/usr/bin/env bash
# Ready for the first session that gets `nvidia-h200-x2` (not run yet;
# written in session 35, updated in session 36): issue 15's EP2
# measurement. One call: every `moe` test on 2 GPUs, then moe_bench with
# NCCL beside for n (HEAD: the streamed receive and session 36's send),
# c (6a93f13: the streamed receive with session 35's send) and p
# (0b46ccf: the per-expert pack) alternating, fp8, 64/256 tokens, then
# the floors on 2 GPUs: the dispatch's `pe`, `stream`, `stream_warp`,
# `sendonly` and the combine's `pr` (the floors last: `-DRANKS=2` of
# `stream` has compiled, never run).
#
# The bundle .device/ep2.tar.xz (keep it under ~20 MB). Session 36 left
# one for HEAD 931bcd3's kernels on the build machine it ran on:
# /work/old-bundles/ep2-s36.tar.xz (7 MB; n, c, p and their images); a
# new machine, or a later kernel change, builds it here from a clean tree:
#   cargo test --release -p devcomm-tests --test moe --no-run
#   cargo build --release -p devcomm --bin devcomm-run -p devcomm-benches --bin moe_bench
#   mkdir -p /tmp/ep2/{bin,tests,cubin}; cp target/release/{moe_bench,devcomm-run} /tmp/ep2/bin/
#   cp target/release/deps/moe-<hash> /tmp/ep2/tests/moe       # the test binary just built
#   for r in c:6a93f13 p:0b46ccf; do git worktree add /tmp/${r%%:*} ${r#*:} && (cd /tmp/${r%%:*} && CARGO_TARGET_DIR=/work/main/target-old \
#       cargo build --release -p devcomm-benches --bin moe_bench) && cp target-old/release/moe_bench /tmp/ep2/bin/moe_bench_${r%%:*}; done
#   for F in host/ptx/devcomm_kernels.sm_90.ptx tests/kernels/ptx/devcomm_test_kernels.sm_90.ptx /tmp/c/host/ptx/devcomm_kernels.sm_90.ptx \
#       /tmp/p/host/ptx/devcomm_kernels.sm_90.ptx; do
#       $PTXAS -arch=sm_90 -O3 --split-compile 2 $F -o /tmp/ep2/cubin/$(sha256sum $F | cut -c1-64).cubin; done   # ~4 min a library PTX
#   strip /tmp/ep2/bin/* /tmp/ep2/tests/moe; tar -C /tmp/ep2 -c . | xz -T2 -6 > .device/ep2.tar.xz
# run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/results/raw/2026-12-01-s35/ep2-next/run.sh")
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=560
unpack_bundle ep2.tar.xz a
exec > >(tee "$OUT/logs/ep2.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
(nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_floor2 benches/gpu/moe_floor.cu -lcuda &&
 nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_combine_floor benches/gpu/moe_combine_floor.cu -lcuda) > "$OUT/logs/nvcc.log" 2>&1 &
NVCC_PID=$!
moe_tests a
for round in 1 2; do
    moe_bench_run a n_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a c_$round --tokens 128
    MOE_BENCH=moe_bench_p moe_bench_run a p_$round --tokens 128
done
moe_bench_run a n_fp8 --tokens 128 --fp8
moe_bench_run a n_64 --tokens 64
MOE_BENCH=moe_bench_c moe_bench_run a c_64 --tokens 64
moe_bench_run a n_256 --tokens 256
wait "$NVCC_PID"; cat "$OUT/logs/nvcc.log"
step timeout 60 /tmp/moe_floor2 pe stream stream_warp sendonly
step timeout 60 /tmp/moe_combine_floor pr
date -u
echo "ep2: overall status $status"
pack_logs
exit $status
