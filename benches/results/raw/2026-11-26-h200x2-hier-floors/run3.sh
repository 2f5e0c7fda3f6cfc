#!/usr/bin/env bash
# Session 10, call C (2 GPUs): the pushed one-shot (a local input is stored
# into the receivers' staging slots; one barrier per chunk) — the coll test
# binary first, then devcomm-perf beside NCCL: the default choice against
# one-shot forced at every size, in-kernel too; 64 against 128 CTAs for
# every collective at 2, 16 and 128 MiB (twice for all-reduce and
# reduce-scatter); reduce (one-shot to the root).
# (The coll run hit this script's 420 s limit after 10 of 15 cases, all
# passed: the PTX JIT took 211 s on this fresh machine; call 4 ran the rest.)
set -uo pipefail
source benches/gpu/common.sh
[ -d .device/bin ] || tar -xJf .device/bin.tar.xz -C .device
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
xz -dc .device/coll.xz > /tmp/coll && chmod +x /tmp/coll
P="timeout 120 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf --nccl"
run() { local name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0
timeout 420 env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 /tmp/coll --test-threads=1 --nocapture > $OUT/t_coll.log 2>&1; rc=$?
echo "coll exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_coll.log) $(grep -E '^test result' $OUT/t_coll.log | tail -1)"
grep "PTX JIT" $OUT/t_coll.log
awk '/^test coll/{name=$2} /\[rank 0\] test result/{print name, $NF}' $OUT/t_coll.log
grep -E "panicked|FAILED" $OUT/t_coll.log | head -20
run ar_default -o all_reduce -b 8K -e 128M -f 4 --in-kernel
run ar_1shot -o all_reduce -b 8K -e 128M -f 4 --algorithm one_shot --in-kernel
for c in 64 128; do
  for op in all_reduce reduce_scatter all_gather all_to_all broadcast; do run ${op}_c$c -o $op -b 2M -e 128M -f 8 --max-ctas $c; done
  run ar1shot_c$c -o all_reduce -b 2M -e 128M -f 8 --max-ctas $c --algorithm one_shot
done
for c in 64 128; do run all_reduce_c${c}_2 -o all_reduce -b 128M -e 128M --max-ctas $c; run reduce_scatter_c${c}_2 -o reduce_scatter -b 128M -e 128M --max-ctas $c; done
run reduce -o reduce -b 8K -e 128M -f 8
} 2>&1 | tee $OUT/runC.log
cd $OUT && gzip -f t_coll.log && tar czf logsC.tgz *.log && find . -name '*.log' ! -name runC.log -delete
