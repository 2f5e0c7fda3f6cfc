#!/usr/bin/env bash
# Session 28, call 2: build b = call 1's build + the MoE kernels' sequence
# number from the device (`MoeArgs::seq_words`: CUDA graphs of a dispatch
# and its combine replay correctly) + the high-throughput channel words
# summed by a warp with relaxed loads (one thread walked 256 channels with
# acquire loads). Bundle .device/s28b.tar.xz. Every moe test (1-8 ranks,
# LSA, GIN, both; the graph cases), then moe_bench HT 4096 bf16 per
# source, in the window, per expert; f16 in the window; LL 128 bf16 twice.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s28b.tar.xz b
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
moe_tests b
date -u +%T
for round in 1 2; do
    moe_bench_run b ps_$round --mode ht --per-source --tokens 4096
    moe_bench_run b win_$round --mode ht --in-window --tokens 4096
done
moe_bench_run b pe --mode ht --tokens 4096
moe_bench_run b win_f16 --mode ht --in-window --tokens 4096 --dtype f16
moe_bench_run b ll_1 --tokens 128
moe_bench_run b ll_2 --tokens 128
date -u
echo "call2: overall status $status"
exit $status
