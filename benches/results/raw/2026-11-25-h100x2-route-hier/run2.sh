#!/usr/bin/env bash
# Session 9, benchmark call (2 × H100): every collective with NCCL beside it
# in the same call (devcomm-perf --nccl, 8 B to 128 MiB, factor 4), the
# all-reduce twice and in-kernel, then MoE with the NCCL path beside it.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
P="timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -b 8 -e 128M -f 4 --nccl"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0; timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_reduce -n 2 -w 1 --reps 1 -e 8 > /dev/null 2>&1; echo "warm-up exit $? ${SECONDS}s"
run all_reduce_1 -o all_reduce --in-kernel
for op in all_gather reduce_scatter all_to_all broadcast; do run ${op}_1 -o $op; done
run all_reduce_2 -o all_reduce
for k in "--tokens 128" "--mode ht --tokens 4096"; do
  echo "== moe_bench $k"; SECONDS=0; timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/moe_bench --nccl $k > "$OUT/moe_$(echo $k | tr -d ' -').log" 2>&1; echo "exit $? ${SECONDS}s"
done
} 2>&1 | tee $OUT/run2.log
cd $OUT && tar czf logs2.tgz *.log && find . -name '*.log' ! -name run2.log -delete
