#!/usr/bin/env bash
# Session 29, call 6: build d = build c + channel sums of up to 32 words
# read by every thread itself (no shuffles, no sync: the emulator's 8-rank
# moe case 207 -> 77 s) and the 40-channel test batteries (the warp path).
# Bundle .device/s29d.tar.xz: build d's moe test, moe_bench, devcomm-run;
# build c's moe_bench as moe_bench_old and its cubin. Every moe test (1-8
# ranks), then HT 4096 in the window (d, c alternating), per source, per
# expert; LL 128.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29d.tar.xz d
exec > >(tee "$OUT/logs/call6.log") 2>&1
date -u; nvidia-smi -L
moe_tests d
date -u +%T
for round in 1 2; do
    moe_bench_run d win_$round --mode ht --in-window --tokens 4096
    MOE_BENCH=moe_bench_old moe_bench_run d win_old_$round --mode ht --in-window --tokens 4096
done
moe_bench_run d ps --mode ht --per-source --tokens 4096
moe_bench_run d pe --mode ht --tokens 4096
moe_bench_run d ll --tokens 128
date -u
echo "call6: overall status $status"
exit $status
