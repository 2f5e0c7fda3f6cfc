#!/usr/bin/env bash
# Session 23 call 5: with main's build and its JIT cache carried (no JIT),
# the low-latency MoE at other token counts and the point-to-point engine's
# whole size sweep, NCCL beside both: `bash benches/gpu/sweep_call.sh b23d.tar.xz`.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" d
exec > >(tee "$OUT/logs/sweep_call.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
for t in 32 64 256; do moe_bench_run d ll$t --tokens $t; done
echo; echo "== p2p_bench full sweep"
DEVCOMM_RUNTIME=cuda timeout 240 $B/d/bin/p2p_bench --nccl 2>&1 | tee $OUT/logs/p2p_bench_full.log || status=1
date -u
echo "sweep_call: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
