#!/usr/bin/env bash
# Session 35, call 1 on ONE H200: the floor's streamed pack (variants
# stream, stream_row: sender positions and count words, per-slot waits,
# a token copied once to all its rows) against pe, on one GPU; the
# 2-GPU build compiled only (nothing to run it on).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p "$OUT/logs"
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -DRANKS=1 -Xcompiler -pthread -o /tmp/moe_floor1 benches/gpu/moe_floor.cu -lcuda
step nvcc -O3 -arch=sm_90 -DRANKS=2 -Xcompiler -pthread -o /tmp/moe_floor2 benches/gpu/moe_floor.cu -lcuda

for r in 1 2; do step timeout 60 /tmp/moe_floor1 pe stream stream_row sendonly; done
date -u
exit $status
