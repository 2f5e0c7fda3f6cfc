#!/usr/bin/env bash
# Session 27, call 5: build h = build n + `F16`'s conversions by the
# hardware's `cvt` (32-bit asm operands). Bundle .device/s27c.tar.xz: build
# h's runtime, moe and coll tests, moe_bench, and build n's moe_bench
# (moe_bench_old); cubins of both builds' PTX. The f16 conversion test,
# the runtime binary, every moe test (1-8 ranks), coll 1-4 ranks, then
# moe_bench HT per source f16 old / h, and bf16 and LL on h.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s27c.tar.xz c
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
C=$B/c
step env DEVCOMM_RUNTIME=cuda timeout 60 $C/tests/runtime --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $C/tests/moe --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 60 $C/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 40 $C/tests/moe --exact moe_8_ranks --test-threads=1
date -u +%T
for round in 1 2; do
    for bin in moe_bench_old moe_bench; do
        echo; echo "== $bin round $round: HT per source f16"
        DEVCOMM_RUNTIME=cuda timeout 40 $C/bin/devcomm-run -n 2 $C/bin/$bin --nccl --stages --mode ht --per-source --tokens 4096 --dtype f16 2>&1 | tee -a $OUT/logs/moe_f16.log
    done
done
echo; echo "== moe_bench: HT per source bf16, LL f16"
DEVCOMM_RUNTIME=cuda timeout 40 $C/bin/devcomm-run -n 2 $C/bin/moe_bench --nccl --stages --mode ht --per-source --tokens 4096 2>&1 | tee -a $OUT/logs/moe_bf16.log
DEVCOMM_RUNTIME=cuda timeout 40 $C/bin/devcomm-run -n 2 $C/bin/moe_bench --nccl --stages --tokens 128 --dtype f16 2>&1 | tee -a $OUT/logs/moe_bf16.log
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $C/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
left=$(( 185 - ($(date +%s) - t0) ))
if [ $left -gt 50 ]; then
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout $left $C/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
else
    echo "!! no time left for coll 3-4 ranks ($left s)"
fi
date -u
echo "call5: overall status $status"
exit $status
