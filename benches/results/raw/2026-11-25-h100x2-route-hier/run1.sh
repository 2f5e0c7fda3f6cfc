#!/usr/bin/env bash
# Session 9 call 1 (2 × H100): the routed put/signal/wait and the device-callable
# hierarchical all-reduce on the GPUs (tests `route` and `coll`, 2 ranks per GPU
# where a case needs more ranks), then every other test binary and the examples.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
export DEVCOMM_TEST_RANKS_PER_GPU=4
{
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for f in $B/tests/route-* $B/tests/coll-* $B/tests/*; do
  t=$(basename $f)
  [ -e "$OUT/t_$t.log" ] && continue
  SECONDS=0
  timeout 420 env DEVCOMM_RUNTIME=cuda $f --test-threads=1 > $OUT/t_$t.log 2>&1; rc=$?
  echo "$t exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_$t.log) $(grep -E '^test result' $OUT/t_$t.log | tail -1)"
done
} 2>&1 | tee $OUT/run1.log
cd $OUT && tar czf logs1.tgz t_*.log && rm -f t_*.log
