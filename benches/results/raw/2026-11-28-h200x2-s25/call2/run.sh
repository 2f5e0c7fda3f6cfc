#!/usr/bin/env bash
# Session 25, call 2: main at e0dc1b8 (the per-source combine with a CTA
# barrier between its phases; library PTX inputs 8f06919e): every moe
# test 1-8 ranks (the per-source batteries and the 256-thread split case
# included), both examples, then moe_bench: HT per expert, HT per source
# twice (alternating), LL. Kernel images ahead of time (bundle cubin/).
# Bundle: .device/b25c.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=400
unpack_bundle b25c.tar.xz c
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
D=$B/c
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 60 $D/bin/moe
moe_bench_run c ht --mode ht --tokens 4096
moe_bench_run c ps --mode ht --per-source --tokens 4096
moe_bench_run c ht2 --mode ht --tokens 4096
moe_bench_run c ps2 --mode ht --per-source --tokens 4096
moe_bench_run c ll --tokens 128
date -u
echo "call2: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
