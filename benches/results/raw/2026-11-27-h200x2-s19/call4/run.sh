#!/usr/bin/env bash
# Session 19, call 4: build c (LL_MAX_BYTES on two ranks 16 -> 8 KiB: the
# all-reduce's and broadcast's Auto take the one-shot from 8 KiB + 1). The
# coll tests on 1-2 ranks (their parent warms the JIT), then the all-reduce
# (graphed and in kernel) and the broadcast at 2-32 KiB with NCCL beside.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/c && tar -xJf $B/b19c.tar.xz -C $B/c
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 350 $B/c/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
date -u +%T
P="$B/c/bin/devcomm-run -n 2 $B/c/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 35 $P -o all_reduce -b 2K -e 32K -f 2 -n 200 --reps 7 --graph --in-kernel --nccl
step env DEVCOMM_RUNTIME=cuda timeout 25 $P -o broadcast -b 2K -e 32K -f 2 -n 200 --reps 7 --graph --nccl
date -u
echo "call4: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
