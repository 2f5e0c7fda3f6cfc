#!/usr/bin/env bash
# Session 29, call 8 (diagnostic build f, not committed): call 7's warm
# second pass of the receives took as long as the first (~23 us), so the
# receive's tail is not cold code. Are the per-expert counts' atomics the
# tail (every received (token, local expert) adds 1 to one of 128 u32s in
# four cache lines: ~32K reds a rank)? Build f = d without those reds
# (its counts stay 0; the in-window bench's check does not read them).
# Bundle .device/s29f.tar.xz: f's moe_bench (a cubin of its HT kernels),
# d's as moe_bench_d with d's cubin.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29f.tar.xz f
export DEVCOMM_NO_PRELOAD=1
exec > >(tee "$OUT/logs/call8.log") 2>&1
date -u; nvidia-smi -L
for round in 1 2; do
    moe_bench_run f nored_win_$round --mode ht --in-window --tokens 4096
    MOE_BENCH=moe_bench_d moe_bench_run f d_win_$round --mode ht --in-window --tokens 4096
done
moe_bench_run f nored_ps --mode ht --per-source --tokens 4096
date -u
echo "call8: overall status $status"
exit $status
