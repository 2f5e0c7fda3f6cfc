#!/usr/bin/env bash
# Session 25, call 3: the per-source layout's self share outside the
# window (own tokens straight into the output, own partials read from the
# caller's rows; library PTX inputs 36ff5d67) against call 2's build
# (8f06919e, bin/moe_bench_old) in one call: every moe test 1-8 ranks and
# both examples on the new build, then moe_bench HT per source old / new
# twice, alternating, HT per expert and LL on the new. Kernel images of
# both builds in the bundle's cubin/. Bundle: .device/b25d.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=420
unpack_bundle b25d.tar.xz c
exec > >(tee "$OUT/logs/call3.log") 2>&1
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
echo "call3: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
