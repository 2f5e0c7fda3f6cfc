#!/usr/bin/env bash
# Builds the plain-CUDA floor programs that share floor_common.cuh and runs
# a variant of each (a check after a change to the shared header):
# `bash benches/gpu/floors_check.sh`.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/floors.log") 2>&1
date -u
for f in moe_floor moe_combine_floor moe_ht_floor allreduce_floor; do step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/$f benches/gpu/$f.cu -lcuda; done
step timeout 60 /tmp/moe_floor pe sendonly
step timeout 60 /tmp/moe_combine_floor pr
step timeout 60 /tmp/moe_ht_floor all
step timeout 90 /tmp/allreduce_floor os
date -u; echo "floors: status $status"
exit $status
