#!/usr/bin/env bash
# Session 31, call 3: build c (uncommitted working tree on 187821b): the HT
# sends write a warp's routing rows as one block of 16-byte vectors (call 2's
# vk: the rows one at a time cost ~7 us) and a token row's 14 vectors a
# thread in one step (vm: -1.5 us). Every `moe` test on 2 GPUs (1-8 ranks,
# incl. the new top-8 / top-4 cases), then in-window HT c / HEAD alternating
# x2, per source and per expert, and LL 128.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s31c.tar.xz c
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
moe_tests c
for round in 1 2; do
    moe_bench_run c win_c_$round --mode ht --in-window --tokens 4096
    MOE_BENCH=moe_bench_old moe_bench_run c win_h_$round --mode ht --in-window --tokens 4096
done
moe_bench_run c src_c --mode ht --per-source --tokens 4096
moe_bench_run c exp_c --mode ht --tokens 4096
moe_bench_run c ll_c --tokens 128
date -u
echo "call3: overall status $status"
exit $status
