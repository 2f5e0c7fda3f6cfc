#!/usr/bin/env bash
# Session 7 call 7: where the random ~100 us penalty starts (CTAs 40..64, threads per CTA).
set -uo pipefail
source benches/gpu/common.sh
P="timeout 150 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_reduce -b 2M -e 32M -f 4"
{
date -u
SECONDS=0; $P -n 2 -w 1 --reps 1 > /dev/null 2>&1; echo "jit warm ${SECONDS}s"
for r in 1 2; do
  for c in 40 48 56 64; do echo "== ctas $c run $r"; $P --max-ctas $c 2>&1 | grep -v "#" | sed 's/\[rank 0\] //' | awk '{print $1, $6, $10}'; done
  echo "== ctas 64 threads 128 run $r"; $P --max-ctas 64 --threads 128 2>&1 | grep -v "#" | sed 's/\[rank 0\] //' | awk '{print $1, $6, $10}'
  echo "== ctas 32 threads 512 run $r"; $P --max-ctas 32 --threads 512 2>&1 | grep -v "#" | sed 's/\[rank 0\] //' | awk '{print $1, $6, $10}'
done
} 2>&1 | tee $OUT/run7.log
