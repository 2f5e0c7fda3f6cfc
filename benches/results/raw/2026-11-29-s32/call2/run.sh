#!/usr/bin/env bash
# Session 32, call 2: build b (call 1g's build a, the sends at one call site): the low-latency
# combine with every rank in the LSA team adds up each of its tokens as soon
# as that token's partials are in (`combine_recv_token`), instead of every
# CTA waiting for every token's word and then a grid-wide reduce. Every
# `moe` test on 2 GPUs (1-8 ranks); LL 128 a / HEAD's kernels (old.ptx, same
# host binary) alternating x2; fp8, 32/64/256 tokens; the plain-CUDA floors
# of the LL dispatch (pe) and combine (pr) in the same call.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s32b.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
(nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_combine_floor benches/gpu/moe_combine_floor.cu -lcuda \
  && nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_floor benches/gpu/moe_floor.cu -lcuda) > "$OUT/logs/nvcc.log" 2>&1 &
NVCC_PID=$!
moe_tests a
for round in 1 2; do
    moe_bench_run a ll_a_$round --tokens 128
    DEVCOMM_PTX_PATH=$PWD/$B/a/ptx/old.ptx DEVCOMM_NO_PRELOAD=1 moe_bench_run a ll_old_$round --tokens 128
done
moe_bench_run a ll_fp8 --tokens 128 --fp8
for t in 32 64 256; do moe_bench_run a ll_t$t --tokens $t; done
wait "$NVCC_PID"; cat "$OUT/logs/nvcc.log"
step timeout 60 /tmp/moe_combine_floor pr
step timeout 60 /tmp/moe_floor pe
moe_bench_run a ll_a_3 --tokens 128
date -u
echo "call2: overall status $status"
exit $status
