#!/usr/bin/env bash
# Session 9, test calls (2 × H100): the test binaries named by the arguments
# (globs under the bundle's tests/), 2 ranks per GPU where a case needs more
# ranks (DEVCOMM_TEST_RANKS_PER_GPU=4 allows up to 8 ranks on 2 GPUs).
# Call 1: route and coll (the routed put/signal/wait and the device-callable
# hierarchical all-reduce); call 2: every other binary.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
export DEVCOMM_TEST_RANKS_PER_GPU=4
tag=${TAG:-1}
# No binary starts after this many seconds (the call's limit is 600 s).
deadline=${DEADLINE:-470}
start=$(date +%s)
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for pat in "$@"; do
  for f in $B/tests/$pat; do
    [ -x "$f" ] || continue
    if [ $(( $(date +%s) - start )) -gt $deadline ]; then echo "$(basename $f) not started: past ${deadline}s"; continue; fi
    [ -e "$OUT/t_$(basename $f).log" ] && continue
    t=$(basename $f); SECONDS=0
    timeout 400 env DEVCOMM_RUNTIME=cuda $f --test-threads=1 > $OUT/t_$t.log 2>&1; rc=$?
    echo "$t exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_$t.log) $(grep -E '^test result' $OUT/t_$t.log | tail -1)"
  done
done
} 2>&1 | tee $OUT/run$tag.log
cd $OUT && tar czf logs$tag.tgz t_*.log && rm -f t_*.log
