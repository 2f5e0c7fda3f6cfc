#!/usr/bin/env bash
# Session 11, call 4 (4 × H200): the final defaults (commit 698d11e: relay
# from 2 MiB, LL up to 4 KiB on teams of 3+) — the coll, moe, sendrecv and
# rma test binaries on CUDA (one rank per GPU; 8 ranks two per GPU), then
# all-reduce (with in-kernel), broadcast and reduce beside NCCL at 4 and 3
# ranks.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=2147483648 DEVCOMM_TEST_RANKS_PER_GPU=2
L=/tmp/call4; mkdir -p $L
P="timeout 120 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run"
run() { local name=$1 n=$2; shift 2; echo "== $name: -n $n $*"; SECONDS=0; $P -n $n $B/bin/devcomm_perf "$@" > $L/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for t in coll moe sendrecv rma; do
  SECONDS=0
  timeout 400 env DEVCOMM_RUNTIME=cuda $B/tests/$t-* --test-threads=1 > $L/t_$t.log 2>&1
  echo "$t tests exit $? ${SECONDS}s: $(grep -E '^test result' $L/t_$t.log | tail -n 1) skipped-lines $(grep -ci skipped $L/t_$t.log)"
done
for n in 4 3; do
  run ar_$n $n --nccl -o all_reduce -b 8 -e 128M -f 4 --in-kernel
  run broadcast_$n $n --nccl -o broadcast -b 8 -e 128M -f 4
  run reduce_$n $n --nccl -o reduce -b 8 -e 128M -f 4
done
} 2>&1 | tee $L/run4.log
cd $L && tar czf $OUT/logs4.tgz *.log && cp run4.log $OUT/
