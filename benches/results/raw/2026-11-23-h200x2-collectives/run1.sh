#!/usr/bin/env bash
# Session 7 call 1: coll tests on CUDA, then devcomm_perf sweeps with NCCL beside.
set -uo pipefail
source benches/gpu/common.sh
export DEVCOMM_TEST_RANKS_PER_GPU=4
P="timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
{
date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv
coll=$(ls $B/tests/coll-* | head -n 1)
echo "== coll tests"; SECONDS=0
timeout 300 env DEVCOMM_RUNTIME=cuda "$coll" --test-threads=1 > $OUT/coll.log 2>&1; echo "coll exit $? in ${SECONDS}s"
grep -E "^test |test result" $OUT/coll.log | tail -25
} 2>&1 | tee $OUT/run1.log
run_perf() { name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/perf_$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
run_perf ar_auto -o all_reduce -b 8 -e 128M -f 4 --nccl --in-kernel
run_perf ar_two -o all_reduce -b 16K -e 128M -f 4 --nccl --algorithm two_shot
run_perf ar_one -o all_reduce -b 16K -e 128M -f 4 --algorithm one_shot
run_perf ar_win -o all_reduce -b 16K -e 128M -f 4 --window
run_perf ar_bpc8 -o all_reduce -b 16K -e 8M -f 4 --bytes-per-cta 8K
run_perf ar_bpc32 -o all_reduce -b 16K -e 8M -f 4 --bytes-per-cta 32K
run_perf ag -o all_gather -b 8 -e 128M -f 4 --nccl
run_perf rs -o reduce_scatter -b 8 -e 128M -f 4 --nccl
run_perf a2a -o all_to_all -b 8 -e 128M -f 4 --nccl
run_perf bc -o broadcast -b 8 -e 128M -f 4 --nccl
} 2>&1 | tee -a $OUT/run1.log
cd $OUT && tar czf perf_logs.tgz perf_*.log && rm perf_*.log
