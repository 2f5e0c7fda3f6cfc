#!/usr/bin/env bash
# Session 10, call B (2 GPUs): the missed goals of issue 14 against their
# floors, NCCL beside them in the same call: devcomm-perf --floor (an empty
# kernel launched as the collective's; the CPU time per call), the
# in-kernel all-reduce, broadcast; 128 MiB all-reduce and reduce-scatter
# with more CTAs and staging; lsa_bench (NVLink put bandwidth one way and
# both ways at once: SM stores, bulk copy, copy engine; round trips).
set -uo pipefail
source benches/gpu/common.sh
[ -d .device/bin ] || tar -xJf .device/bin.tar.xz -C .device
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
P="timeout 120 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf --nccl"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0; timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_reduce -n 2 -w 1 --reps 1 -e 8 > /dev/null 2>&1; echo "warm-up exit $? ${SECONDS}s"
run ar_floor -o all_reduce -b 8 -e 128M -f 4 --in-kernel --floor
run bc_floor -o broadcast -b 8 -e 128M -f 4 --floor
run ar_plain -o all_reduce -b 8 -e 2M -f 4 --no-cooperative --floor
run bc_plain -o broadcast -b 8 -e 32K -f 4 --no-cooperative --floor
run rs_1 -o reduce_scatter -b 2M -e 128M -f 4 --floor
for c in 96 128; do run ar_ctas$c -o all_reduce -b 2M -e 128M -f 8 --max-ctas $c; run rs_ctas$c -o reduce_scatter -b 128M -e 128M --max-ctas $c; done
run ar_stage64 -o all_reduce -b 128M -e 128M --stage-bytes 64M
run rs_stage64 -o reduce_scatter -b 128M -e 128M --stage-bytes 64M
run ar_2 -o all_reduce -b 8 -e 128M -f 4 --floor
echo "== lsa_bench"; SECONDS=0; timeout 150 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/lsa_bench > $OUT/lsa_bench.log 2>&1; echo "exit $? ${SECONDS}s"
} 2>&1 | tee $OUT/runB.log
cd $OUT && tar czf logsB.tgz *.log && find . -name '*.log' ! -name runB.log -delete
