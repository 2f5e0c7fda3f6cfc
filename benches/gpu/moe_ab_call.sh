#!/usr/bin/env bash
# One call comparing a changed MoE build against the previous one on 2
# GPUs: bundle .device/$1 (bin/{moe_bench,moe_bench_old,devcomm_perf,
# devcomm-run,moe}, tests/moe), the old build's JIT cache carried as
# .device/jitcache.tar.xz (its moe_bench starts at once). The old build
# measures first, then the new PTX's JIT (alone), every moe test 1-8
# ranks, the example (LL and HT), and moe_bench LL new / old alternating,
# fp8 and token-major new: `bash benches/gpu/moe_ab_call.sh b23c.tar.xz`.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" c
exec > >(tee "$OUT/logs/moe_ab_call.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
D=$B/c
# moe_bench from bundle c: `bench LOGNAME BINARY ARGS...` (NCCL path, stages).
bench() {
    local name=$1 bin=$2; shift 2
    echo; echo "== $bin $name: $*"
    DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/devcomm-run -n 2 $D/bin/$bin --nccl --stages "$@" 2>&1 \
        | tee $OUT/logs/bench_$name.log || { echo "!! $name failed"; status=1; }
}
ptxas_report moe_dispatch moe_combine_bf16
bench old1 moe_bench_old --tokens 128
WARM_TIMEOUT=420 warm_jit c
wait_jit c
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 60 $D/bin/moe
bench new1 moe_bench --tokens 128
bench old2 moe_bench_old --tokens 128
bench new2 moe_bench --tokens 128
bench newfp8 moe_bench --tokens 128 --fp8
bench newtm moe_bench --tokens 128 --token-major-pack
date -u
echo "moe_ab_call: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
