#!/usr/bin/env bash
# Call 4 (2 x H200): devcomm-perf with NCCL in the same process.
# Broadcast and reduce, 8 B - 64 KiB: Auto (LL up to 4 KiB) against the
# barrier-based direct algorithm, with the launch floor; then Auto to 128 MiB;
# the 8 B all-reduce for reference; send/recv between two one-rank LSA teams
# (GIN over the copy-engine proxy) with 64 KiB, 256 KiB and 1 MiB chunks.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache
[ -d $B/tests ] || { mkdir -p $B; tar -xJf $B/small2.tar.xz -C $B; }
exec > >(tee $OUT/run4.log) 2>&1
date -u; nvidia-smi -L
P="timeout 150 $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
for op in broadcast reduce; do
    step env DEVCOMM_RUNTIME=cuda $P -o $op -b 8 -e 64K -f 4 --nccl --floor --reps 7
    step env DEVCOMM_RUNTIME=cuda $P -o $op -b 8 -e 64K -f 4 --algorithm one_shot --reps 7
done
step env DEVCOMM_RUNTIME=cuda $P -o all_reduce -b 8 -e 8 --nccl --in-kernel --reps 7
for op in broadcast reduce; do
    step env DEVCOMM_RUNTIME=cuda $P -o $op -b 128K -e 128M -f 8 --nccl
done
for chunk in 64K 256K 1M; do
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_LSA_SIZE=1 $P -o send_recv -b 64K -e 64M -f 8 --p2p-chunk-bytes $chunk -n 10 --reps 3
done
echo; echo "run4: overall status $status"
