#!/usr/bin/env bash
# Session 25, call 4: the per-source copies get the warps (receive spans
# sized for the other sources' channels; the combine sends to other ranks
# only; library PTX inputs 830d1782) against call 3's build (36ff5d67,
# bin/moe_bench_old), one call: every moe test 1-8 ranks and both
# examples on the new build, moe_bench HT per source old / new twice,
# alternating, HT per expert and LL on the new. Bundle: .device/b25e.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=420
unpack_bundle b25e.tar.xz c
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
D=$B/c
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 60 $D/bin/moe
MOE_BENCH=moe_bench_old moe_bench_run c ps_old --mode ht --per-source --tokens 4096
moe_bench_run c ps_new --mode ht --per-source --tokens 4096
MOE_BENCH=moe_bench_old moe_bench_run c ps_old2 --mode ht --per-source --tokens 4096
moe_bench_run c ps_new2 --mode ht --per-source --tokens 4096
moe_bench_run c ht --mode ht --tokens 4096
moe_bench_run c ll --tokens 128
date -u
echo "call4: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
