#!/usr/bin/env bash
# Session 11, call 5 (4 × H200): commit fe28d7c (the relay's epochs in one
# driver) — the coll cases of one team with 3, 4 and 8 ranks, then broadcast
# and reduce beside NCCL at 4 ranks.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=2147483648 DEVCOMM_TEST_RANKS_PER_GPU=2
L=/tmp/call5; mkdir -p $L
P="timeout 60 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run"
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0
timeout 330 env DEVCOMM_RUNTIME=cuda $B/tests/coll-* --test-threads=1 --exact coll_3_ranks coll_4_ranks coll_8_ranks > $L/t_coll.log 2>&1
echo "coll tests exit $? ${SECONDS}s: $(grep -E '^test result' $L/t_coll.log | tail -n 1) skipped-lines $(grep -ci skipped $L/t_coll.log)"
for op in broadcast reduce; do echo "== $op"; $P -n 4 $B/bin/devcomm_perf --nccl -o $op -b 1M -e 128M -f 8 > $L/$op.log 2>&1; echo "exit $?"; done
} 2>&1 | tee $OUT/run5.log
cd $L && tar czf $OUT/logs5.tgz *.log
