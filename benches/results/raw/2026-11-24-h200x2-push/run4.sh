#!/usr/bin/env bash
# Session 8 call 4: the 64-CTA penalty, cooperative vs plain launches, three runs each; the JIT cache kept.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=$PWD/.device/jitcache CUDA_CACHE_MAXSIZE=1073741824
P="timeout 150 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -b 2M -e 32M -f 4 --max-ctas 64"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; grep -v "#" $OUT/$name.log | awk '{print "   ", $2, $7}'; }
{
date -u
for r in 1 2 3; do
  for op in all_gather reduce_scatter; do
    run coop_${op}_$r -o $op
    DEVCOMM_COLL_COOPERATIVE=0 run plain_${op}_$r -o $op
  done
done
} 2>&1 | tee $OUT/run4.log
cd $OUT && tar czf logs4.tgz *.log && rm -f coop_* plain_*
du -sh $CUDA_CACHE_PATH; tar czf $OUT/jitcache.tgz -C .device jitcache; ls -la $OUT
