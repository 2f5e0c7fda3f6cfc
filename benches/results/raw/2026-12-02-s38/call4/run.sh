#!/usr/bin/env bash
# Session 38, call 4 on ONE H200: n2 = n1 (6db85ff) with the streamed
# receive's once-per-warp code cut: a `match.any` for the first entry of
# each expert (was a shuffle per entry), a power-of-two piece count (a
# shift and a mask per item, not divisions), 32-bit piece math, and
# `CopyAhead::store_to` told the rows are aligned (no per-entry check).
# SASS body of moe_dispatch_lsa 7 217 -> 6 882. Every `moe` test with n2;
# one rank: n2 against n1 (moe_bench_c here) alternating x3 at 128 tokens,
# 64 / 256; Nsight Compute of n2's dispatch.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=540
unpack_bundle s38b.tar.xz a
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
moe_tests_one_gpu a
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n2_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a n1_$round --tokens 128
done
for t in 64 256; do
    moe_bench_run a n2_$t --tokens $t
    MOE_BENCH=moe_bench_c moe_bench_run a n1_$t --tokens $t
done
ncu_stalls a moe_dispatch_lsa
date -u
echo "call4: overall status $status"
pack_logs
exit $status
