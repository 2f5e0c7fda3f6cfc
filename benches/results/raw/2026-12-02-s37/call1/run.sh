#!/usr/bin/env bash
# Session 37, call 1 on ONE H200: build n7 = HEAD bf89e0b (c) with the
# low-latency combine's single-row path (`strided_row`) loading two
# vectors of every entry (3 to 8 of them) before adding any: one round
# trip a pass where it made one per entry (8 in turn for a top-8 token on
# one rank; 16 % of session 36's combine warp samples sat on that wait).
# Every `moe` test with n7 (all ranks on the one GPU); one rank: n7
# against c alternating x3; 64 / 256 tokens; Nsight Compute of n7's
# moe_combine_lsa_bf16. Logs come back as one tar.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=540
unpack_bundle s37a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
moe_tests_one_gpu a
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n7_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a c_$round --tokens 128
done
moe_bench_run a n7_64 --tokens 64
MOE_BENCH=moe_bench_c moe_bench_run a c_64 --tokens 64
moe_bench_run a n7_256 --tokens 256
MOE_BENCH=moe_bench_c moe_bench_run a c_256 --tokens 256
moe_bench_run a n7_f32 --tokens 128 --dtype f32
MOE_BENCH=moe_bench_c moe_bench_run a c_f32 --tokens 128 --dtype f32
ncu_stalls a moe_combine_lsa_bf16
date -u
echo "call1: overall status $status"
pack_logs
exit $status
