#!/usr/bin/env bash
# Session 20, call 4: build c (MoE low-latency receive in one pass per
# source, rows over every warp, the wait timed apart, one fence per token's
# headers). JIT of the library and test kernels first (the moe test binary
# loads both), then moe_bench low-latency (bf16 with and without stages,
# fp8) with the NCCL path, the moe tests 1-8 ranks, the moe example, coll 1-2.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b20c.tar.xz c
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 420 $B/c/tests/moe --exact moe_1_rank --test-threads=1 > $OUT/logs/warm_c.log 2>&1; echo "warm c: rc $? at $(date -u +%T)" >> $OUT/logs/warm_c.log)
tail -2 $OUT/logs/warm_c.log
date -u +%T
R="$B/c/bin/devcomm-run -n 2"
for a in "ll --tokens 128" "ll_stages --tokens 128 --stages" "ll_fp8 --tokens 128 --fp8 --stages"; do
    set -- $a; name=$1; shift
    echo; echo "== moe_bench $name"
    DEVCOMM_RUNTIME=cuda timeout 150 $R $B/c/bin/moe_bench --nccl "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log || { echo "!! moe_bench $name failed"; status=1; }
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/c/tests/moe --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 120 $B/c/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 120 $B/c/tests/moe --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/c/bin/moe
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/c/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
date -u
echo "call4: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
