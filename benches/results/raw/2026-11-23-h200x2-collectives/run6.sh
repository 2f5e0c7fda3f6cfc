#!/usr/bin/env bash
# Session 7 call 6: every collective with at most 32 CTAs (vs the 64 of call 3), NCCL beside, twice.
set -uo pipefail
source benches/gpu/common.sh
P="timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf --max-ctas 32 -b 8 -e 128M -f 4 --nccl"
{
date -u
$P -o all_reduce -n 2 -w 1 --reps 1 -e 8 > /dev/null 2>&1
for r in 1 2; do for op in all_reduce all_gather reduce_scatter all_to_all broadcast; do
  echo "== $op run $r"; SECONDS=0; $P -o $op > $OUT/c32_${op}_$r.log 2>&1; echo "exit $? ${SECONDS}s"
done; done
} 2>&1 | tee $OUT/run6.log
cd $OUT && tar czf logs.tgz c32_*.log && rm c32_*.log
