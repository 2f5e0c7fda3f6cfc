#!/usr/bin/env bash
# Session 30, call 1 (diagnostic: three library PTX builds through
# DEVCOMM_PTX_PATH, each with a kernel image of its MoE bf16 kernels, one
# moe_bench binary; the host code is the same for all three):
#   v0 = HEAD c175e43's PTX (session 29's GPU-verified body);
#   v1 = the low-latency combine's send one pass a row (`strided_row`:
#        8 vectors of an entry in flight a thread, lanes adjacent), the
#        combines' rows loading two entries' vectors before adding,
#        no zeroed entry table, channel sums by relaxed loads and one
#        system-scope fence (no chain of acquires);
#   v2 = v1 without the two-entry loads (one entry at a time, as v0).
# LL 128 (the combine is what changed), HT 4096 in the window, per
# source, and in the window with 32 channels (channel sums of <= 32 words).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30a.tar.xz a
export DEVCOMM_NO_PRELOAD=1
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
v() { export DEVCOMM_PTX_PATH="$PWD/$B/a/ptx/$1.ptx"; }
for round in 1 2; do
    for x in v0 v1 v2; do v $x; moe_bench_run a ll_${x}_$round --tokens 128; done
done
for x in v0 v1 v2; do v $x; moe_bench_run a win_$x --mode ht --in-window --tokens 4096; done
for x in v1 v0; do v $x; moe_bench_run a win2_$x --mode ht --in-window --tokens 4096; done
for x in v0 v1 v2; do v $x; moe_bench_run a ps_$x --mode ht --per-source --tokens 4096; done
for x in v0 v1; do v $x; moe_bench_run a win32_$x --mode ht --in-window --tokens 4096 --channels 32; done
date -u
echo "call1: overall status $status"
exit $status
