#!/usr/bin/env bash
# Session 31, call 5: build e = 112cf8f + `packed_vector` (the combines'
# f32 -> vector packing shared by `strided_row` and `vector_rows`; the
# library PTX changes in ~16 K lines). Every `moe` test on 2 GPUs, then
# LL 128 and HT in the window, e / c (moe_bench_old) alternating x2, and
# per source once.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s31e.tar.xz e
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
moe_tests e
for round in 1 2; do
    moe_bench_run e ll_e_$round --tokens 128
    MOE_BENCH=moe_bench_old moe_bench_run e ll_c_$round --tokens 128
    moe_bench_run e win_e_$round --mode ht --in-window --tokens 4096
    MOE_BENCH=moe_bench_old moe_bench_run e win_c_$round --mode ht --in-window --tokens 4096
done
moe_bench_run e src_e --mode ht --per-source --tokens 4096
date -u
echo "call5: overall status $status"
exit $status
