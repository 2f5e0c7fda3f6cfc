#!/usr/bin/env bash
# Session 18, call 4: build c (build b's PTX, call 3's JIT cache carried;
# host: the pushed one-shot kernels take as many threads as their registers
# allow, up to 512). The graphed all-reduce with the library's threads and
# with 256 forced, NCCL beside it; then the coll and p2p tests and the p2p
# example on the GPUs (3-4 ranks at 2 per GPU, 8 at 4).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/c && tar -xJf $B/b18c.tar.xz -C $B/c
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
P="$B/c/bin/devcomm-run -n 2 $B/c/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 120 $P -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --in-kernel --graph --stages --nccl
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --stages --threads 256
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -d bf16 -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --nccl
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 8 -e 8M -f 16 -n 200 --reps 7 --nccl
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/c/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/c/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 200 $B/c/tests/p2p --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/c/bin/p2p-example
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $B/c/tests/coll --exact coll_8_ranks --test-threads=1
date -u
echo "call4: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
