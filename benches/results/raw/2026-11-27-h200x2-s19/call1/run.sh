#!/usr/bin/env bash
# Session 19, call 1: build a (the one-shot all-reduce with a flag per
# warp, `CollConfig::warp_flags`). The driver's JIT of the library and test
# kernels runs in the background while the plain-CUDA floor (with its new
# `osw` variant, a flag per warp) runs; then the graphed all-reduce with
# warp flags on and off, NCCL beside it, stages; the JIT cache goes back
# for call 2 (the tests on the GPUs).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/a && tar -xJf $B/b19a.tar.xz -C $B/a
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 450 $B/a/bin/devcomm-run -n 1 $B/a/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > $OUT/logs/warm_a.log 2>&1; echo "warm a: rc $? at $(date -u +%T)" >> $OUT/logs/warm_a.log) &
wpid=$!
echo "== allreduce_floor (plain CUDA, six variants)"
(cd benches/gpu && nvcc -O3 -arch=sm_90 -o /tmp/allreduce_floor allreduce_floor.cu) && timeout 150 /tmp/allreduce_floor 2>&1 | tee $OUT/logs/allreduce_floor.log || { echo "!! floor failed"; status=1; }
date -u +%T
wait $wpid
tail -3 $OUT/logs/warm_a.log
date -u +%T
P="$B/a/bin/devcomm-run -n 2 $B/a/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 32K -e 2M -f 4 -n 200 --reps 7 --in-kernel --graph --stages --nccl
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 32K -e 2M -f 4 -n 200 --reps 7 --in-kernel --graph --stages --no-warp-flags
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl
date -u +%T
save_jitcache
date -u
echo "call1: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
