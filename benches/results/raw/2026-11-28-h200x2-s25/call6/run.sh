#!/usr/bin/env bash
# Session 25, call 6: main after the HT combine kernels' closures took
# copies of their arguments (library PTX inputs c34afa88; the bf16
# kernels' registers unchanged, f16's no longer copy the parameter at
# entry): every moe test 1-8 ranks, both examples, moe_bench HT per source
# (bf16 and f16: the kernel that changed), per expert, LL.
# Bundle: .device/b25g.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=300
unpack_bundle b25g.tar.xz c
exec > >(tee "$OUT/logs/call6.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
D=$B/c
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 60 $D/bin/moe
moe_bench_run c ps --mode ht --per-source --tokens 4096
moe_bench_run c ps_f16 --mode ht --per-source --tokens 4096 --dtype f16
moe_bench_run c ht_f16 --mode ht --tokens 4096 --dtype f16
moe_bench_run c ht --mode ht --tokens 4096
moe_bench_run c ll --tokens 128
date -u
echo "call6: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
