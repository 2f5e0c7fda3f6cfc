#!/usr/bin/env bash
# Session 25, call 1: the high-throughput per-source layout
# (`HtLayout::PerSource`, DeepEP's output: no pack) on 2 x H200. Every
# moe test 1-8 ranks (new per-source batteries included), both examples,
# then moe_bench: HT per expert (the default, its kernels refactored:
# check against session 24's 675 / 532 us), HT per source (default
# channels, then 64 and 32 per destination), LL once. Kernel images made
# ahead of time (bundle cubin/). Bundle: .device/b25a.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=540
unpack_bundle b25a.tar.xz c
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
D=$B/c
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 60 $D/bin/moe
moe_bench_run c ht --mode ht --tokens 4096
moe_bench_run c ps --mode ht --per-source --tokens 4096
moe_bench_run c ps64 --mode ht --per-source --tokens 4096 --channels 64
moe_bench_run c ps32 --mode ht --per-source --tokens 4096 --channels 32
moe_bench_run c ht2 --mode ht --tokens 4096
moe_bench_run c ps2 --mode ht --per-source --tokens 4096
moe_bench_run c ll --tokens 128
date -u
echo "call1: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
