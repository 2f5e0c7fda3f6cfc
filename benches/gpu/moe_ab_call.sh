#!/usr/bin/env bash
# One call comparing a changed MoE build against the previous one on 2
# GPUs: bundle .device/$1 (bin/{moe_bench,moe_bench_old,devcomm_perf,
# devcomm-run,moe}, tests/moe), the old build's JIT cache carried as
# .device/jitcache.tar.xz (its moe_bench starts at once). The old build
# measures first, then the new PTX's JIT (alone), every moe test 1-8
# ranks, the example (LL and HT), and moe_bench LL new / old alternating,
# fp8 and token-major new, then per-expert combine and HT old / new: `bash benches/gpu/moe_ab_call.sh b23c.tar.xz`.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" c
exec > >(tee "$OUT/logs/moe_ab_call.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
D=$B/c
ptxas_report moe_dispatch moe_combine_bf16
MOE_BENCH=moe_bench_old moe_bench_run c old1 --tokens 128
WARM_TIMEOUT=420 warm_jit c
wait_jit c
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 60 $D/bin/moe
moe_bench_run c new1 --tokens 128
MOE_BENCH=moe_bench_old moe_bench_run c old2 --tokens 128
moe_bench_run c new2 --tokens 128
moe_bench_run c newfp8 --tokens 128 --fp8
moe_bench_run c newtm --tokens 128 --token-major-pack
# The per-expert combine (the shared reduce, weighted_rows) and the
# high-throughput mode (twice), old / new.
MOE_BENCH=moe_bench_old moe_bench_run c oldpe --tokens 128 --combine-per-expert
moe_bench_run c newpe --tokens 128 --combine-per-expert
MOE_BENCH=moe_bench_old moe_bench_run c oldht --mode ht --tokens 4096
moe_bench_run c newht --mode ht --tokens 4096
MOE_BENCH=moe_bench_old moe_bench_run c oldht2 --mode ht --tokens 4096
moe_bench_run c newht2 --mode ht --tokens 4096
date -u
echo "moe_ab_call: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
