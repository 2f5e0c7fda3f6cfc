#!/usr/bin/env bash
# Session 19, call 2: build b (warp flags removed again: the library's PTX
# is c69dd74's; the test kernels gain `all_reduce_sequence_f32`). The JIT
# of the library and test kernels runs in the background (last session's
# call-3 cache carried) while p2p_bench measures send/recv and write from
# 256 B to 1 MiB with NCCL beside it; then the tests on the GPUs (coll
# 1-2 ranks one per GPU, 3-4 two per GPU, 8 four per GPU; moe; p2p and its
# example) and the all-reduce against NCCL.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/b && tar -xJf $B/b19b.tar.xz -C $B/b
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 380 $B/b/bin/devcomm-run -n 1 $B/b/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > $OUT/logs/warm_b.log 2>&1; echo "warm b: rc $? at $(date -u +%T)" >> $OUT/logs/warm_b.log) &
wpid=$!
echo "== p2p_bench 256 B .. 1 MiB, medians of 5, NCCL beside it"
DEVCOMM_RUNTIME=cuda timeout 150 $B/b/bin/p2p_bench --nccl --min-bytes 256 --max-bytes $((1 << 20)) 2>&1 | tee $OUT/logs/p2p_small.log || { echo "!! p2p_bench failed"; status=1; }
date -u +%T
wait $wpid
tail -3 $OUT/logs/warm_b.log
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 100 $B/b/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 100 $B/b/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 100 $B/b/tests/coll --exact coll_8_ranks --test-threads=1
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $B/b/tests/moe --exact moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 60 $B/b/tests/moe --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/b/tests/p2p --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 30 $B/b/bin/p2p
date -u +%T
P="$B/b/bin/devcomm-run -n 2 $B/b/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl
date -u
echo "call2: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
