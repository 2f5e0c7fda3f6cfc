#!/usr/bin/env bash
# Session 30, call 8: call 7 put the tail after each receive's wait
# (~23 us with no routing, call 5). In the window, the receive's copy out
# is skipped only when the output *is* the receive slots, and the host
# passed them by `mem`'s address while the kernel reads them through the
# window's LSA mapping: two addresses of the same bytes, so every row was
# copied onto itself. Build h = b (same PTX and kernel images) with the
# host passing the LSA-mapping address (`window_rows_addr`,
# `WindowRows::device_addr`). Bundle .device/s30g.tar.xz: h's moe test,
# moe_bench, devcomm-run; b's moe_bench as moe_bench_old. Every moe test
# (1-8 ranks) with h, then HT in the window h / b alternating, per source,
# LL.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30g.tar.xz g
exec > >(tee "$OUT/logs/call8.log") 2>&1
date -u; nvidia-smi -L
moe_tests g
date -u +%T
for round in 1 2; do
    moe_bench_run g win_h_$round --mode ht --in-window --tokens 4096
    MOE_BENCH=moe_bench_old moe_bench_run g win_b_$round --mode ht --in-window --tokens 4096
done
moe_bench_run g ps_h --mode ht --per-source --tokens 4096
moe_bench_run g ll_h --tokens 128
date -u
echo "call8: overall status $status"
exit $status
