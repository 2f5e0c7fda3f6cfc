#!/usr/bin/env bash
# Session 20, call 5: where a small P2P message's time goes (issue 16), no
# library kernels (no JIT): p2p_bench one-way 4 KiB and 16 KiB messages
# with the engine's trace events (transfer submitted, clear-to-send in,
# copy queued, copy done), then 1-64 KiB again untraced with NCCL beside it.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b20p.tar.xz p
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
P=$B/p/bin/p2p_bench
for s in 4096 16384; do
    echo "== traced $s"
    DEVCOMM_RUNTIME=cuda DEVCOMM_LOG=trace timeout 60 $P --min-bytes $s --max-bytes $s --iters 64 --reps 1 > $OUT/logs/trace_$s.log 2>&1 || { echo "!! traced $s failed"; status=1; }
    grep -v "p2p:" $OUT/logs/trace_$s.log | tail -3
    grep -c "p2p:" $OUT/logs/trace_$s.log
done
echo "== untraced 1-64 KiB, NCCL beside it"
DEVCOMM_RUNTIME=cuda timeout 90 $P --nccl --min-bytes 1024 --max-bytes 65536 --factor 2 2>&1 | tee $OUT/logs/p2p_small.log || status=1
date -u
echo "call5: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
