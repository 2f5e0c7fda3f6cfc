#!/usr/bin/env bash
# Session 8 call 1: pushed movement / reduce-scatter / two-shot all-reduce, NCCL beside; then the coll tests.
set -uo pipefail
source benches/gpu/common.sh
P="timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -b 8 -e 128M -f 4 --nccl"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
SECONDS=0; timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_reduce -n 2 -w 1 --reps 1 -e 8 > /dev/null 2>&1; echo "warm-up exit $? ${SECONDS}s"
for op in all_reduce all_gather reduce_scatter all_to_all broadcast; do run ${op}_1 -o $op; done
run all_reduce_2shot -o all_reduce --algorithm two_shot -b 32K
run all_reduce_inkernel -o all_reduce --in-kernel -e 8M
for op in all_gather reduce_scatter; do run ${op}_c64 -o $op --max-ctas 64 -b 2M; done
run all_reduce_2shot_c64 -o all_reduce --algorithm two_shot --max-ctas 64 -b 2M
for op in all_gather reduce_scatter; do run ${op}_s32 -o $op --stage-bytes 32M -b 2M; done
run all_reduce_2shot_s32 -o all_reduce --algorithm two_shot --stage-bytes 32M -b 2M
for op in all_reduce all_gather reduce_scatter all_to_all broadcast; do run ${op}_2 -o $op; done
export DEVCOMM_TEST_RANKS_PER_GPU=4
f=$(ls $B/tests/coll-* | head -1); SECONDS=0
timeout 250 env DEVCOMM_RUNTIME=cuda $f --test-threads=1 > $OUT/t_coll.log 2>&1; rc=$?
echo "coll exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_coll.log) $(grep -E '^test result' $OUT/t_coll.log | tail -1)"
} 2>&1 | tee $OUT/run1.log
