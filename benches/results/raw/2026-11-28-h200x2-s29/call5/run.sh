#!/usr/bin/env bash
# Session 29, call 5: build c = build b + the per-source receive's routing
# loads issued together (the entry, its weight and the ids before it, then
# the comparisons; before, each earlier id was loaded after the last
# comparison) in 32-bit index arithmetic. Bundle .device/s29c.tar.xz:
# build c's moe test, moe_bench, devcomm-run; build a's (call 1) moe_bench
# as moe_bench_old; both builds' cubins. Every moe test (1-8 ranks), then
# HT 4096 in the window and per source, new and old alternating; per
# expert; LL 128.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29c.tar.xz c
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
moe_tests c
date -u +%T
for round in 1 2; do
    moe_bench_run c win_$round --mode ht --in-window --tokens 4096
    MOE_BENCH=moe_bench_old moe_bench_run c win_old_$round --mode ht --in-window --tokens 4096
done
moe_bench_run c ps --mode ht --per-source --tokens 4096
MOE_BENCH=moe_bench_old moe_bench_run c ps_old --mode ht --per-source --tokens 4096
moe_bench_run c pe --mode ht --tokens 4096
moe_bench_run c ll --tokens 128
date -u
echo "call5: overall status $status"
exit $status
