#!/usr/bin/env bash
# Session 26, call 1: the pushed one-shot all-reduce by packs (first input
# loads before the barrier's epoch load, one division, the reduce's
# addresses before the barrier). Bundle .device/s26a.tar.xz: new
# devcomm_perf + coll tests, and main's (HEAD e7a4757) devcomm_perf as
# devcomm_perf_old, both builds' cubins. Tests first (coll 1-8 ranks), then
# the all-reduce graphed old/new/old/new with NCCL and stages, then the
# plain floor (os, osc) for reference.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s26a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
R="$B/a/bin/devcomm-run -n 2"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/a/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
date -u +%T
for v in old new old new; do
    bin=devcomm_perf; [ $v = old ] && bin=devcomm_perf_old
    echo; echo "== $v: graphed 8 B - 8 MiB with NCCL"
    DEVCOMM_RUNTIME=cuda timeout 90 $R $B/a/bin/$bin -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_${v}.log
    echo; echo "== $v: stages"
    DEVCOMM_RUNTIME=cuda timeout 60 $R $B/a/bin/$bin -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --in-kernel --stages 2>&1 | tee $OUT/logs/stages_${v}.log
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/a/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $B/a/tests/coll --exact coll_8_ranks --test-threads=1
date -u +%T
echo; echo "== new: graphed 8 B - 8 MiB with NCCL"
DEVCOMM_RUNTIME=cuda timeout 90 $R $B/a/bin/devcomm_perf -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_all_new.log
left=$(( 560 - ($(date +%s) - t0) ))
if [ $left -gt 90 ]; then
    (cd benches/gpu && nvcc -O3 -arch=sm_90 -o /tmp/allreduce_floor allreduce_floor.cu) && timeout $((left - 10)) /tmp/allreduce_floor os osc 2>&1 | tee $OUT/logs/floor.log
fi
date -u
echo "call1: overall status $status"
exit $status
