#!/usr/bin/env bash
# Session 8 call 6: the 64-CTA oscillation traced with three device builds:
# base; A = every wait poll an acquire load; B = no abort-flag read, no nanosleep in the waits' periodic check.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
run() { local name=$1 bin=$2; shift 2; echo "== $name: $bin $*"; SECONDS=0
  timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/$bin -o all_gather -b 1M -e 4M -f 4 --max-ctas 64 --trace 16 --trace-only "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"
  grep "call .*span" $OUT/$name.log | awk '{printf "%s%s ", ($4=="rank" && $6=="bytes") ? "" : "", int($11)} END {print ""}'; }
{
date -u
for r in 1 2; do run B_$r devcomm_perf_B; run A_$r devcomm_perf_A; run base_$r devcomm_perf; done
} 2>&1 | tee $OUT/run6.log
cd $OUT && tar czf logs6.tgz *.log && rm -f A_* B_* base_*
