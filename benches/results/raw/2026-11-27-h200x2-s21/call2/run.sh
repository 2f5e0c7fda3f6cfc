#!/usr/bin/env bash
# Session 21, call 2: call 1's warm-up ran the JIT inside a test job,
# whose harness kills it at 300 s, and this build's JIT took longer: the
# JIT here alone (devcomm_perf loads the library and test modules, no job
# limit), its cache saved, then the moe tests with the time left.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b21a.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u
t0=$(date +%s)
WARM_TIMEOUT=540 warm_jit a
wait_jit a
left=$(( 590 - ($(date +%s) - t0) ))
echo "left: $left s"
if [ $left -gt 30 ]; then
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout $((left - 10)) $B/a/tests/moe --exact moe_1_rank moe_2_ranks --test-threads=1
fi
date -u
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
