#!/usr/bin/env bash
# Session 20, call 3: build b (MoE low-latency: ballot scans over 4 groups
# of headers at once, a span of warps per expert, the header wait ending
# with a memory-ordering barrier; the all-reduce back to session 19's
# pushed path but for the reduce's initial value). JIT first, then
# moe_bench low-latency (bf16 with and without stage stamps, fp8) with the
# NCCL path; the all-reduce graphed with NCCL and in kernel with stages;
# the tests on the GPUs: moe 1-8 ranks, the moe example, coll 1-8 ranks.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b20b.tar.xz b
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
warm_jit b
wait_jit b
date -u +%T
R="$B/b/bin/devcomm-run -n 2"
for a in "ll --tokens 128" "ll_stages --tokens 128 --stages" "ll_fp8 --tokens 128 --fp8 --stages"; do
    set -- $a; name=$1; shift
    echo; echo "== moe_bench $name"
    DEVCOMM_RUNTIME=cuda timeout 150 $R $B/b/bin/moe_bench --nccl "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log || { echo "!! moe_bench $name failed"; status=1; }
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda timeout 90 $R $B/b/bin/devcomm_perf -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl
step env DEVCOMM_RUNTIME=cuda timeout 90 $R $B/b/bin/devcomm_perf -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --in-kernel --stages
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/b/tests/moe --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 120 $B/b/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 120 $B/b/tests/moe --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/b/bin/moe
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/b/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 120 $B/b/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 120 $B/b/tests/coll --exact coll_8_ranks --test-threads=1
date -u
echo "call3: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
