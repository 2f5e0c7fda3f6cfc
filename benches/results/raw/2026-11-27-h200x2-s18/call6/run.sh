#!/usr/bin/env bash
# Session 18, call 6: the final build (995f650's kernels and host: the pushed
# one-shot kernels at 256 threads; call 3's JIT cache carried): the coll
# tests on the GPUs (1-2 ranks one per GPU, 3-4 two per GPU, 8 four per
# GPU), the graphed all-reduce with NCCL beside it; then one traced batch
# of 8 one-way 64 MiB sends (DEVCOMM_LOG=trace: when each clear-to-send
# arrives, each copy is queued and seen done).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/f && tar -xJf $B/b18f.tar.xz -C $B/f
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call6.log") 2>&1
date -u; nvidia-smi -L
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/f/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/f/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $B/f/tests/coll --exact coll_8_ranks --test-threads=1
P="$B/f/bin/devcomm-run -n 2 $B/f/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 120 $P -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --in-kernel --graph --stages --nccl
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --in-kernel --graph --nccl
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 8 -e 8M -f 16 -n 200 --reps 7 --nccl
echo "== p2p_bench one traced batch of 8 x 64 MiB (trace in logs/p2p_trace.log)"
DEVCOMM_RUNTIME=cuda DEVCOMM_LOG=trace timeout 60 $B/f/bin/p2p_bench --min-bytes $((64 << 20)) --max-bytes $((64 << 20)) --iters 8 --reps 3 2> $OUT/logs/p2p_trace.log || status=1
grep -c "" $OUT/logs/p2p_trace.log
date -u
echo "call6: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
