#!/usr/bin/env bash
# The plain-CUDA MoE LL dispatch floor (benches/gpu/moe_floor.cu, every
# variant, twice) beside devcomm's moe_bench (LL 128 tokens, NCCL path,
# stages) in the same call, from bundle .device/$1 (moe_bench, devcomm-run;
# a carried .device/jitcache.tar.xz of the same PTX skips the JIT):
# `bash benches/gpu/moe_floor_call.sh b23b.tar.xz`.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" b
exec > >(tee "$OUT/logs/moe_floor_call.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_floor benches/gpu/moe_floor.cu -lcuda
for i in 1 2; do
    echo "== moe_floor $i"; timeout 150 /tmp/moe_floor | tee $OUT/logs/moe_floor_$i.log || status=1
done
moe_bench_run b ll --tokens 128
date -u
echo "moe_floor_call: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
