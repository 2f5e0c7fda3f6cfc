#!/usr/bin/env bash
# Runs both pending patches on 2 GPUs in one call (one JIT): `bash
# docs/pending/gpu_call.sh BUNDLE DIR` after, on the build machine:
#   git apply docs/pending/moe-ht-wide-scan.patch docs/pending/p2p-copy-lock.patch
#   cargo fmt --all && cargo xtask ptx --update
#   build the bundle (docs/gpu.md): bin/{devcomm-run,devcomm_perf,moe_bench,
#   moe,p2p_bench,p2p}, tests/{moe,p2p}, and main's p2p_bench (built before
#   the patches) as bin/p2p_bench_old.
# Steps: the JIT in the background while the p2p tests run (no kernels, no
# warm-up with the patch); the moe tests 1-8 ranks; the examples; p2p_bench
# 1-64 KiB old and new, alternating, NCCL beside the new;
# moe_bench HT 4096 (the patch's target: session 22 measured 884.5 / 523.7
# µs, NCCL path 267.6 / 221.1) and LL 128 (35.5 / 30.4) with NCCL beside.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" "$2"
W=$2
D=$B/$W
exec > >(tee "$OUT/logs/gpu_call.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
ptxas_report moe_dispatch moe_ht_dispatch moe_ht_combine_bf16
WARM_TIMEOUT=480 warm_jit "$2"
step env DEVCOMM_RUNTIME=cuda timeout 150 $D/tests/p2p --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/p2p
wait_jit "$2"
moe_tests "$W"
step env DEVCOMM_RUNTIME=cuda timeout 30 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 30 $D/bin/moe
# After the JIT: small messages are sensitive to a busy CPU (session 19).
S="--min-bytes 1024 --max-bytes 65536 --factor 2"
for i in 1 2; do
    for b in p2p_bench_old p2p_bench; do
        echo; echo "== $b $i"
        DEVCOMM_RUNTIME=cuda timeout 90 $D/bin/$b $([ $b = p2p_bench ] && [ $i = 1 ] && echo --nccl) $S 2>&1 | tee $OUT/logs/${b}_$i.log || status=1
    done
done
moe_bench_run "$W" ht --mode ht --tokens 4096
moe_bench_run "$W" ll --tokens 128
moe_bench_run "$W" ht2 --mode ht --tokens 4096
date -u
echo "gpu_call: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
