#!/usr/bin/env bash
# Session 10, call D (2 GPUs): the final defaults (128 CTAs, clamped to the
# multiprocessors; pushed one-shot up to 2 MiB on two ranks) beside NCCL,
# every collective, all-reduce twice with the floors and in-kernel.
set -uo pipefail
source benches/gpu/common.sh
[ -d .device/bin ] || tar -xJf .device/bin.tar.xz -C .device
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
P="timeout 150 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf --nccl"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0; timeout 300 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_reduce -n 2 -w 1 --reps 1 -e 8 > /dev/null 2>&1; echo "warm-up exit $? ${SECONDS}s"
run ar_1 -o all_reduce -b 8 -e 128M -f 4 --in-kernel --floor
run ar_2 -o all_reduce -b 8 -e 128M -f 4 --in-kernel --floor
for op in reduce_scatter all_gather all_to_all broadcast reduce; do run $op -o $op -b 8 -e 128M -f 4 --floor; done
} 2>&1 | tee $OUT/runD.log
cd $OUT && tar czf logsD.tgz *.log && find . -name '*.log' ! -name runD.log -delete
