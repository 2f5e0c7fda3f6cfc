#!/usr/bin/env bash
# Session 20, call 1: the plain-CUDA floor's new `osc` variant (devcomm's
# layout: a contiguous range per CTA, 256 threads, 4 vectors in flight)
# beside `os`: is devcomm's 2 MiB gap its layout or its code? No library
# kernels (no JIT).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
(cd benches/gpu && nvcc -O3 -arch=sm_90 -o /tmp/allreduce_floor allreduce_floor.cu) || { echo "!! nvcc failed"; exit 1; }
timeout 200 /tmp/allreduce_floor os osc ts 2>&1 | tee $OUT/logs/allreduce_floor.log || status=1
date -u
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
