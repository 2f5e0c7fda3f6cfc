#!/usr/bin/env bash
# Session 30, call 2: build b (the committed candidate) = call 1's v1 with
# the two-entry loads only where they helped (the high-throughput
# combines; the low-latency reduce loads one entry at a time, as v2),
# the per-source receive's hook public (`dispatch_recv_channel_with`
# passes the channel's count). Bundle .device/s30b.tar.xz: b's moe test,
# moe_bench, devcomm-run and its full kernel images (library and test
# kernels); v0 (HEAD c175e43's library PTX) with call 1's image of its MoE
# bf16 kernels, run through DEVCOMM_PTX_PATH for the comparison.
# Every moe test (1-8 ranks) with b, then LL 128 and HT 4096 (in the
# window, per source) alternating b and v0, per expert, 32 channels.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30b.tar.xz b
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
moe_tests b
date -u +%T
new() { unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD; }
old() { export DEVCOMM_PTX_PATH="$PWD/$B/b/ptx/v0.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    new; moe_bench_run b ll_b_$round --tokens 128
    old; moe_bench_run b ll_v0_$round --tokens 128
done
for round in 1 2; do
    new; moe_bench_run b win_b_$round --mode ht --in-window --tokens 4096
    old; moe_bench_run b win_v0_$round --mode ht --in-window --tokens 4096
done
new; moe_bench_run b ps_b --mode ht --per-source --tokens 4096
old; moe_bench_run b ps_v0 --mode ht --per-source --tokens 4096
new; moe_bench_run b pe_b --mode ht --tokens 4096
new; moe_bench_run b win32_b --mode ht --in-window --tokens 4096 --channels 32
new; moe_bench_run b ll_fp8_b --tokens 128 --fp8
for t in 32 64 256; do new; moe_bench_run b ll_t${t}_b --tokens $t; done
date -u
echo "call2: overall status $status"
exit $status
