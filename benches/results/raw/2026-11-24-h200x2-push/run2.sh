#!/usr/bin/env bash
# Session 8 call 2: the variants call 1 lost to a repeated -b flag.
set -uo pipefail
source benches/gpu/common.sh
P="timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -e 128M -f 4 --nccl"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u
for op in reduce_scatter all_to_all broadcast; do run ${op}_1 -o $op -b 8; done
run all_reduce_2shot -o all_reduce --algorithm two_shot -b 32K
run all_reduce_inkernel -o all_reduce --in-kernel -b 8 
for op in all_gather reduce_scatter all_to_all; do run ${op}_c64 -o $op --max-ctas 64 -b 2M; done
run all_reduce_2shot_c64 -o all_reduce --algorithm two_shot --max-ctas 64 -b 2M
for op in all_gather reduce_scatter; do run ${op}_s32 -o $op --stage-bytes 32M -b 2M; done
run all_reduce_2shot_s32 -o all_reduce --algorithm two_shot --stage-bytes 32M -b 2M
run all_reduce_2shot_c64_s32 -o all_reduce --algorithm two_shot --stage-bytes 32M --max-ctas 64 -b 2M
run all_gather_c64_s32 -o all_gather --stage-bytes 32M --max-ctas 64 -b 2M
run all_reduce_2shot_b2 -o all_reduce --algorithm two_shot -b 32K
} 2>&1 | tee $OUT/run2.log
cd $OUT && tar czf logs2.tgz *.log && rm -f all_*.log reduce_*.log
