#!/usr/bin/env bash
# Session 10, call A (2 GPUs): the coll test binary with the device-callable
# hierarchical reduce-scatter, reduce and broadcast in the world battery,
# carried alone as .device/coll.xz; the parent compiles the PTX first.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824 DEVCOMM_TEST_RANKS_PER_GPU=4
xz -dc .device/coll.xz > /tmp/coll && chmod +x /tmp/coll
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0
timeout 575 env DEVCOMM_RUNTIME=cuda /tmp/coll --test-threads=1 --nocapture > $OUT/t_coll.log 2>&1; rc=$?
echo "coll exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_coll.log) $(grep -E '^test result' $OUT/t_coll.log | tail -1)"
grep "PTX JIT" $OUT/t_coll.log
awk '/^test coll/{name=$2} /\[rank 0\] test result/{print name, $NF}' $OUT/t_coll.log
grep -E "panicked|FAILED" $OUT/t_coll.log | head -20
} 2>&1 | tee $OUT/runA.log
cd $OUT && gzip -f t_coll.log
