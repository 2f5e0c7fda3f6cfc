#!/usr/bin/env bash
# Session 8 call 5: the 64-CTA penalty traced per CTA (start, end, SM) with --trace.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
P="timeout 150 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -b 2M -e 32M -f 4 -o all_gather --trace 20"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; grep -v "#\|trace" $OUT/$name.log | awk '{print "   ", $2, $7}'; }
{
date -u
for r in 1 2 3 4; do run c64_$r --max-ctas 64; done
run c32 --max-ctas 32
} 2>&1 | tee $OUT/run5.log
cd $OUT && tar czf logs5.tgz *.log && rm -f c64_* c32*
