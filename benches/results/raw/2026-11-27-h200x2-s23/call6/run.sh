#!/usr/bin/env bash
# The plain-CUDA MoE LL combine floor (benches/gpu/moe_combine_floor.cu,
# both variants, twice), no devcomm build needed: `bash benches/gpu/moe_combine_floor_call.sh`.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/moe_combine_floor_call.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -Xptxas -v -o /tmp/moe_combine_floor benches/gpu/moe_combine_floor.cu
for i in 1 2; do echo "== moe_combine_floor $i"; timeout 120 /tmp/moe_combine_floor || status=1; done
date -u
echo "moe_combine_floor_call: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
