#!/usr/bin/env bash
# Session 9, call 5: the route test after the review's refactor of Router
# (path through Gin::connected, one coop join before an LSA put), carried
# alone as .device/route.xz; the parent compiles the PTX first.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824 DEVCOMM_TEST_RANKS_PER_GPU=4
xz -dc .device/route.xz > /tmp/route && chmod +x /tmp/route
{
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SECONDS=0
timeout 400 env DEVCOMM_RUNTIME=cuda /tmp/route --test-threads=1 --nocapture > $OUT/t_route.log 2>&1; rc=$?
echo "route exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_route.log) $(grep -E '^test result' $OUT/t_route.log | tail -1)"
grep "PTX JIT" $OUT/t_route.log
} 2>&1 | tee $OUT/run6.log
cd $OUT && gzip -f t_route.log
