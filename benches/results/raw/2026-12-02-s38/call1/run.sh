#!/usr/bin/env bash
# Session 38, call 1 on ONE H200: build n1 = c (HEAD 09528fa/bedec73) with
# less cold code inlined beside the hot code of the low-latency kernels:
# `CopyAhead::store`'s unaligned and tail copies out of line
# (`copy_strided_cold`, the tail skipped when the row is whole vectors),
# one `copy.store` call site in `send_token`, `weighted_rows`' element
# path out of line (`element_rows`). SASS bodies: moe_dispatch_lsa 8 648
# -> 7 217 instructions, moe_combine_lsa_bf16 5 125 -> 4 565. Every `moe`
# test with n1 (all ranks on the one GPU); one rank: n1 against c
# alternating x3 at 128 tokens; 64 / 256 tokens, f32, fp8; Nsight Compute
# of n1's dispatch and combine. Logs come back as one tar.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=540
unpack_bundle s38a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
moe_tests_one_gpu a
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n1_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a c_$round --tokens 128
done
for t in 64 256; do
    moe_bench_run a n1_$t --tokens $t
    MOE_BENCH=moe_bench_c moe_bench_run a c_$t --tokens $t
done
moe_bench_run a n1_f32 --tokens 128 --dtype f32
MOE_BENCH=moe_bench_c moe_bench_run a c_f32 --tokens 128 --dtype f32
moe_bench_run a n1_fp8 --tokens 128 --fp8
MOE_BENCH=moe_bench_c moe_bench_run a c_fp8 --tokens 128 --fp8
ncu_stalls a moe_dispatch_lsa
ncu_stalls a moe_combine_lsa_bf16
date -u
echo "call1: overall status $status"
pack_logs
exit $status
