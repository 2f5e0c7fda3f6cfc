#!/usr/bin/env bash
# Session 8 call 7: the 64-CTA oscillation traced with three device builds:
# D = the fix (abort flag read every 1 ms of waiting); C = flag read every 64 misses as before, no nanosleep.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
run() { local name=$1 bin=$2; shift 2; echo "== $name: $bin $*"; SECONDS=0
  timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/$bin -o all_gather -b 1M -e 4M -f 4 --max-ctas 64 --trace 16 --trace-only "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"
  grep "call .*span" $OUT/$name.log | awk '{printf "%s%s ", ($4=="rank" && $6=="bytes") ? "" : "", int($11)} END {print ""}'; }
{
date -u
for r in 1 2; do run D_$r devcomm_perf; run C_$r devcomm_perf_C; done
} 2>&1 | tee $OUT/run7.log
cd $OUT && tar czf logs7.tgz *.log && rm -f C_* D_*
