#!/usr/bin/env bash
# Session 7 call 3: coll tests on CUDA (final device code), then devcomm_perf with NCCL beside.
set -uo pipefail
source benches/gpu/common.sh
export DEVCOMM_TEST_RANKS_PER_GPU=4
P="timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
run_perf() { name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/perf_$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv
run_perf warm -o all_reduce -b 8 -e 8 -n 2 -w 1 --reps 1
run_perf ar_auto -o all_reduce -b 8 -e 128M -f 4 --nccl --in-kernel
run_perf ar_bf16 -o all_reduce -d bf16 -b 8 -e 128M -f 4 --nccl
run_perf ar_two -o all_reduce -b 16K -e 128M -f 4 --nccl --algorithm two_shot
run_perf ar_win -o all_reduce -b 16K -e 128M -f 4 --window --nccl
run_perf ag -o all_gather -b 8 -e 128M -f 4 --nccl
run_perf rs -o reduce_scatter -b 8 -e 128M -f 4 --nccl
run_perf a2a -o all_to_all -b 8 -e 128M -f 4 --nccl
run_perf bc -o broadcast -b 8 -e 128M -f 4 --nccl
coll=$(ls $B/tests/coll-* | head -n 1)
echo "== coll tests"; SECONDS=0
timeout 330 env DEVCOMM_RUNTIME=cuda "$coll" --test-threads=1 > $OUT/coll.log 2>&1; echo "coll exit $? in ${SECONDS}s"
grep -E "^test result" $OUT/coll.log | tail -1; grep -c skipped $OUT/coll.log
} 2>&1 | tee $OUT/run3.log
cd $OUT && tar czf logs.tgz perf_*.log coll.log && rm perf_*.log coll.log
