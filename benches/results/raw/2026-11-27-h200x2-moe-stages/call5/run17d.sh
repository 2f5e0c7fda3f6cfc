#!/usr/bin/env bash
# Session 17, call 4 (issue 14's 2 MiB floor): build c's devcomm_perf JITs
# in the background while the plain-CUDA two-shot all-reduce floor
# (benches/gpu/allreduce_floor.cu) builds and runs; then devcomm's graphed
# and in-kernel all-reduce at the same sizes with NCCL beside it.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/d && tar -xJf $B/d.tar.xz -C $B/d
exec > >(tee "$OUT/run17d.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 330 $B/d/bin/devcomm-run -n 1 $B/d/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > $OUT/warm_d.log 2>&1; echo "warm d: rc $? at $(date -u +%T)" >> $OUT/warm_d.log) &
wpid=$!
PATH=/usr/local/cuda/bin:$PATH nvcc -O3 -arch=sm_90 -o /tmp/allreduce_floor benches/gpu/allreduce_floor.cu && step timeout 200 /tmp/allreduce_floor
date -u +%T
wait $wpid
cat $OUT/warm_d.log | tail -3
P="$B/d/bin/devcomm-run -n 2 $B/d/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 512K -e 8M -f 4 -n 200 --reps 7 --nccl --in-kernel --graph
date -u
echo "run17d: overall status $status"
exit $status
