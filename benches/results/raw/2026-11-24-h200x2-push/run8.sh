#!/usr/bin/env bash
# Session 8 call 8: the final code (pushed collectives, abort flag read per ms, 64 CTAs, 32 MiB staging):
# every collective with NCCL beside it, MoE, then the test binaries whose waits changed.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
P="timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -b 8 -e 128M -f 4 --nccl"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u
SECONDS=0; timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_reduce -n 2 -w 1 --reps 1 -e 8 > /dev/null 2>&1; echo "warm-up exit $? ${SECONDS}s"
run all_reduce_1 -o all_reduce --in-kernel
for op in all_gather reduce_scatter all_to_all broadcast; do run ${op}_1 -o $op; done
for k in "--tokens 128" "--tokens 128 --fp8" "--mode ht --tokens 4096"; do
  echo "== moe_bench $k"; SECONDS=0; timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/moe_bench --nccl $k > "$OUT/moe_$(echo $k | tr -d ' -').log" 2>&1; echo "exit $? ${SECONDS}s"
done
export DEVCOMM_TEST_RANKS_PER_GPU=4
for f in $B/tests/coll-* $B/tests/faults-* $B/tests/gin-* $B/tests/lsa-* $B/tests/moe-* $B/tests/sendrecv-* $B/tests/rma-*; do
  t=$(basename $f); SECONDS=0
  timeout 200 env DEVCOMM_RUNTIME=cuda $f --test-threads=1 > $OUT/t_$t.log 2>&1; rc=$?
  echo "$t exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_$t.log) $(grep -E '^test result' $OUT/t_$t.log | tail -1)"
done
for op in all_reduce all_gather reduce_scatter all_to_all broadcast; do run ${op}_2 -o $op; done
} 2>&1 | tee $OUT/run8.log
cd $OUT && tar czf logs8.tgz *.log && find . -name '*.log' ! -name run8.log -delete
