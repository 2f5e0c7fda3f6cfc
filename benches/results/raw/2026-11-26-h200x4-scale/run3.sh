#!/usr/bin/env bash
# Session 11, call 3 (4 × H200): the relayed broadcast and reduce (commit
# 57649d5) — the coll cases of one LSA team on CUDA (1, 2, 3, 4 ranks one
# per GPU; 8 ranks two per GPU), then broadcast and reduce beside NCCL at 2,
# 3 and 4 ranks, direct against relayed at 4, and the all-reduce's LL
# against one-shot at 4 ranks (2–128 KiB).
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=2147483648 DEVCOMM_TEST_RANKS_PER_GPU=2
L=/tmp/call3; mkdir -p $L
P="timeout 120 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run"
run() { local name=$1 n=$2; shift 2; echo "== $name: -n $n $*"; SECONDS=0; $P -n $n $B/bin/devcomm_perf "$@" > $L/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0
timeout 420 env DEVCOMM_RUNTIME=cuda $B/tests/coll-* --test-threads=1 --exact coll_1_rank coll_2_ranks coll_3_ranks coll_4_ranks coll_8_ranks > $L/t_coll.log 2>&1
echo "coll tests exit $? ${SECONDS}s: $(grep -E '^test result' $L/t_coll.log | tail -n 1)"
grep -E '^test |panicked' $L/t_coll.log | head -20
for op in broadcast reduce; do
  for n in 4 3 2; do run ${op}_auto_$n $n --nccl -o $op -b 8 -e 128M -f 4; done
  for a in one_shot two_shot; do run ${op}_${a}_4 4 -o $op -b 64K -e 128M -f 2 --algorithm $a; done
done
for a in ll one_shot; do run ar_${a}_4 4 -o all_reduce -b 2K -e 128K -f 2 --algorithm $a --in-kernel; done
run ar_auto_4 4 --nccl -o all_reduce -b 2K -e 128K -f 2
} 2>&1 | tee $L/run3.log
cd $L && tar czf $OUT/logs3.tgz *.log && cp run3.log $OUT/
