#!/usr/bin/env bash
# Session 18, call 7: p2p_bench with the one-way send/recv test's check moved
# out of the timed repetitions (call 6's trace: the first copy after the
# ~90 ms check took twice as long), 1 MiB to 1 GiB, medians of 5, NCCL
# beside it; then from 64 MiB with 32 messages in flight.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/g && tar -xJf $B/b18g.tar.xz -C $B/g
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call7.log") 2>&1
date -u; nvidia-smi -L
echo "== p2p_bench 1 MiB .. 1 GiB, NCCL beside it"
DEVCOMM_RUNTIME=cuda timeout 150 $B/g/bin/p2p_bench --nccl --min-bytes $((1 << 20)) || status=1
echo "== p2p_bench from 64 MiB, 32 in flight"
DEVCOMM_RUNTIME=cuda timeout 100 $B/g/bin/p2p_bench --nccl --min-bytes $((64 << 20)) --iters 32 || status=1
date -u
echo "call7: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
