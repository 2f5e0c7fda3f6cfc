#!/usr/bin/env bash
# Session 37, call 2 on ONE H200: build n8 = HEAD bf89e0b (c) with the
# low-latency combine's send (`combine_send_token`, `strided_row` with
# GATHER) loading two vectors of every entry (3 to 8 of them) before
# adding any; its receive keeps the entry-by-entry loop (call 1's n7 gave
# both to both: the send 8.2 -> 6.8 us, but the receive 5.0 -> 8.7, its
# code straight-line and instruction-fetch bound, 6 648 SASS instructions
# against 4 280; n8: 5 256). Every `moe` test with n8 (all ranks on the
# one GPU); one rank: n8 against c alternating x3; 64 / 256 tokens, f32;
# Nsight Compute of n8's moe_combine_lsa_bf16. Logs come back as one tar.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=540
unpack_bundle s37b.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
moe_tests_one_gpu a
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n8_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a c_$round --tokens 128
done
moe_bench_run a n8_64 --tokens 64
MOE_BENCH=moe_bench_c moe_bench_run a c_64 --tokens 64
moe_bench_run a n8_256 --tokens 256
MOE_BENCH=moe_bench_c moe_bench_run a c_256 --tokens 256
moe_bench_run a n8_f32 --tokens 128 --dtype f32
MOE_BENCH=moe_bench_c moe_bench_run a c_f32 --tokens 128 --dtype f32
ncu_stalls a moe_combine_lsa_bf16
date -u
echo "call2: overall status $status"
pack_logs
exit $status
