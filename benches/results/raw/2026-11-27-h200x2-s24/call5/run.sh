#!/usr/bin/env bash
# Session 24, call 5 (419 s of device time left, too little for a JIT):
# call 4's build (library 2c330e98, tests 8663ec3b; its JIT cache
# carried) with tests/moe.rs's new top-k 10 case: every moe test, both
# examples, HT and LL once. Bundle: .device/b24e.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=300
unpack_bundle b24e.tar.xz c
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
D=$B/c
moe_tests c
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/moe
step env DEVCOMM_RUNTIME=cuda MOE_MODE=ht timeout 60 $D/bin/moe
moe_bench_run c ht --mode ht --tokens 4096
moe_bench_run c ll --tokens 128
date -u
echo "call5: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
