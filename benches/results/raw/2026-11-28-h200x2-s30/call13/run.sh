#!/usr/bin/env bash
# Session 30, call 13: does following an in-window combine cost the
# dispatch its ~12 us (call 12)? The floor's new variant `pair` follows
# each dispatch with a kernel that reads this GPU's tokens back from the
# peer's receive slots over NVLink (the in-window combine's traffic);
# `all` beside it; devcomm (build h) in the window once more.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30j.tar.xz g
exec > >(tee "$OUT/logs/call13.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_ht_floor benches/gpu/moe_ht_floor.cu
timeout 120 /tmp/moe_ht_floor all pair || status=1
moe_bench_run g win_h --mode ht --in-window --tokens 4096
timeout 120 /tmp/moe_ht_floor pair all || status=1
date -u
echo "call13: overall status $status"
exit $status
