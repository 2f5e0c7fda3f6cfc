#!/bin/bash
# Session 18, call 1: the plain-CUDA all-reduce floor's variants with stage stamps (benches/gpu/allreduce_floor.cu).
mkdir -p $OUT/logs
exec > >(tee $OUT/logs/call1.log) 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc --version | tail -2
cd benches/gpu && nvcc -O3 -arch=sm_90 -o /tmp/allreduce_floor allreduce_floor.cu || exit 1
timeout 200 /tmp/allreduce_floor
echo "rc $?"
tar -czf $OUT/logs.tar.gz -C $OUT logs
