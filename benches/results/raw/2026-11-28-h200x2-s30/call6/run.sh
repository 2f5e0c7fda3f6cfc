#!/usr/bin/env bash
# Session 30, call 6 (diagnostic build vc, not committed: build-vc.diff):
# call 5's vb (no routing, a bare wait) kept the tail, and its "counted"
# came ~18 us after "waited" with nothing between. vc = b with each
# receive item's durations in the stamps instead of times: "waited" =
# this CTA's start + the longest wait of its spans (item start to word
# seen), "counted" = this CTA's start + the longest rest of an item
# (word seen to item end); the bench prints them from the first CTA's
# start (+ the CTAs' start spread, ~0.1 us). HT in the window, b and vc
# alternating, per source vc.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30e.tar.xz e
exec > >(tee "$OUT/logs/call6.log") 2>&1
date -u; nvidia-smi -L
v() { export DEVCOMM_PTX_PATH="$PWD/$B/e/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
    moe_bench_run e win_b_$round --mode ht --in-window --tokens 4096
    v vc; moe_bench_run e win_vc_$round --mode ht --in-window --tokens 4096
done
v vc; moe_bench_run e ps_vc --mode ht --per-source --tokens 4096
date -u
echo "call6: overall status $status"
exit $status
