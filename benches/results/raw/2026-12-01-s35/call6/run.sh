#!/usr/bin/env bash
# Session 35, call 6 on ONE H200: the floor's `stream_warp` (the routing
# scanned per warp in global memory, as devcomm's dispatch_send_count and
# send_positions do) against `stream` (once per CTA into shared counters):
# does the floor reproduce devcomm's ~1.7 us of extra send?
set -uo pipefail
source benches/gpu/common.sh
mkdir -p "$OUT/logs"
exec > >(tee "$OUT/logs/call6.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -DRANKS=1 -Xcompiler -pthread -o /tmp/moe_floor1 benches/gpu/moe_floor.cu -lcuda
step nvcc -O3 -arch=sm_90 -DRANKS=2 -Xcompiler -pthread -o /tmp/moe_floor2 benches/gpu/moe_floor.cu -lcuda
for r in 1 2; do step timeout 60 /tmp/moe_floor1 pe stream stream_warp sendonly; done
date -u
exit $status
