#!/usr/bin/env bash
# Session 25, call 5: 16 vectors in flight per thread in a channel's
# contiguous copies (`BLOCK_UNROLL` in device/src/moe/ht.rs: the
# per-source receive and combine send; library PTX inputs a2575b61)
# against call 3's build (36ff5d67, bin/moe_bench_old: main's code before
# this change), one call: every moe test 1-8 ranks and both examples on
# the new build, moe_bench HT per source old / new twice, alternating, HT
# per expert and LL on the new. Bundle: .device/b25f.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=420
unpack_bundle b25f.tar.xz c
exec > >(tee "$OUT/logs/call5.log") 2>&1
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
echo "call5: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
