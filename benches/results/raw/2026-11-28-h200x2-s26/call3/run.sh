#!/usr/bin/env bash
# Session 26, call 3: build c = build b with the pushed kernels' reduction
# (operator decode, device scalar) made after the first pushes instead of
# before them (`all_reduce_pushed_by`). Bundle .device/s26c.tar.xz: build
# c's devcomm_perf, moe_bench and tests (coll, moe, lsa); main's (e7a4757)
# devcomm_perf_old; both builds' cubins. Tests, the all-reduce old / c
# three times (graphed with NCCL; stages), every moe test, lsa, moe_bench,
# the 8 B - 8 MiB sweep.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s26c.tar.xz c
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
R="$B/c/bin/devcomm-run -n 2"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/c/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
date -u +%T
for round in 1 2 3; do
    for v in old c; do
        bin=devcomm_perf; [ $v = old ] && bin=devcomm_perf_old
        echo; echo "== $v round $round: graphed with NCCL"
        DEVCOMM_RUNTIME=cuda timeout 90 $R $B/c/bin/$bin -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_${v}_$round.log
        echo; echo "== $v round $round: stages"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $B/c/bin/$bin -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --in-kernel --stages 2>&1 | tee $OUT/logs/stages_${v}_$round.log
    done
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/c/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $B/c/tests/coll --exact coll_8_ranks --test-threads=1
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 120 $B/c/tests/lsa --test-threads=1
date -u +%T
moe_bench_run c ps --mode ht --per-source --tokens 4096
moe_bench_run c ll --tokens 128
echo; echo "== c: graphed 8 B - 8 MiB with NCCL"
DEVCOMM_RUNTIME=cuda timeout 90 $R $B/c/bin/devcomm_perf -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_all_c.log
date -u
echo "call3: overall status $status"
# Every log in one file (a call returns at most 8 files).
tar -czf $OUT/logs.tar.gz -C $OUT logs && find $OUT/logs -name "*.log" ! -name call3.log -delete
exit $status
