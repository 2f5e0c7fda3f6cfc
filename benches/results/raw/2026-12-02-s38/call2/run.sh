#!/usr/bin/env bash
# Session 38, call 2 on ONE H200, the same bundle as call 1 (n1 and c):
# call 1 had n1 slower than c in two single runs, fp8 dispatch (28.45
# against 27.55 us) and f32 combine (19.74 against 19.20): n1 against c
# alternating x3 for each, and bf16 128 / 256 tokens x2 again.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=540
unpack_bundle s38a.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n1_fp8_$round --tokens 128 --fp8
    MOE_BENCH=moe_bench_c moe_bench_run a c_fp8_$round --tokens 128 --fp8
    moe_bench_run a n1_f32_$round --tokens 128 --dtype f32
    MOE_BENCH=moe_bench_c moe_bench_run a c_f32_$round --tokens 128 --dtype f32
done
for round in 1 2; do
    for t in 128 256; do
        moe_bench_run a n1_${t}_$round --tokens $t
        MOE_BENCH=moe_bench_c moe_bench_run a c_${t}_$round --tokens $t
    done
done
date -u
echo "call2: overall status $status"
pack_logs
exit $status
