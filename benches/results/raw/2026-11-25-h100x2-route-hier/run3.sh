#!/usr/bin/env bash
# Session 9, call 3 (2 × H100, the machine of calls 1–2, warm): the
# benchmarks with NCCL beside them (run2.sh), the test binaries not yet run
# (gin, lsa, moe, run_examples), then the route test rebuilt with the
# parent-side JIT warm-up (tests/common: warm_jit_cache) against an EMPTY
# driver cache, as on a fresh machine (call 1's first case ran out of its
# 120 s compiling PTX).
set -uo pipefail
D=benches/results/raw/2026-11-25-h100x2-route-hier
source benches/gpu/common.sh
bash $D/run2.sh
mkdir -p $OUT/keep && mv $OUT/logs2.tgz $OUT/run2.log $OUT/keep/
TAG=3 DEADLINE=380 bash $D/run1.sh 'gin-*' 'lsa-*' 'moe-*' 'run_examples-*'
mv $OUT/logs3.tgz $OUT/run3.log $OUT/keep/
xz -dc .device/route.xz > /tmp/route && chmod +x /tmp/route
{
echo "== route with an empty JIT cache"; SECONDS=0
CUDA_CACHE_PATH=/tmp/jitcache-empty DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 300 env DEVCOMM_RUNTIME=cuda /tmp/route --test-threads=1 --nocapture > $OUT/t_route_cold.log 2>&1; rc=$?
echo "route (cold cache) exit $rc ${SECONDS}s skipped $(grep -c skipped $OUT/t_route_cold.log) $(grep -E '^test result' $OUT/t_route_cold.log | tail -1)"
grep "PTX JIT" $OUT/t_route_cold.log
} 2>&1 | tee $OUT/run4.log
mv $OUT/keep/* $OUT/ && rmdir $OUT/keep
