#!/usr/bin/env bash
# Session 18, call 8: the MoE tests on the GPUs with this session's PTX
# (call 3's JIT cache carried): 2 ranks over LSA and over GIN (one per GPU),
# then the 8-rank case (four per GPU), never run on the GPUs before.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/h && tar -xJf $B/b18h.tar.xz -C $B/h
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call8.log") 2>&1
date -u; nvidia-smi -L
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 50 $B/h/tests/moe --exact moe_2_ranks moe_gin_2_ranks --test-threads=1
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 135 $B/h/tests/moe --exact moe_8_ranks --test-threads=1
date -u
echo "call8: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
