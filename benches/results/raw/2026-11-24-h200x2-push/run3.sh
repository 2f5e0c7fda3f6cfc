#!/usr/bin/env bash
# Session 8 call 3: the 64-CTA penalty: one stall per repetition or a cost per call?
set -uo pipefail
source benches/gpu/common.sh
P="timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_gather -b 2M -e 32M -f 4"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; grep -v "#" $OUT/$name.log | awk '{print "   ", $2, $7}'; }
{
date -u
run single -n 1 --reps 41 --max-ctas 64
run hundred -n 100 --reps 3 --max-ctas 64
run nonccl -n 20 --reps 5 --max-ctas 64
DEVCOMM_COLL_COOPERATIVE=0 run plain -n 20 --reps 5 --max-ctas 64
run single2 -n 1 --reps 41 --nccl --max-ctas 64
run c32 -n 20 --reps 5 --max-ctas 32
} 2>&1 | tee $OUT/run3.log
cd $OUT && tar czf logs3.tgz *.log
