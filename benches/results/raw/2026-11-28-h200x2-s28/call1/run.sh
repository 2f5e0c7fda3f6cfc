#!/usr/bin/env bash
# Session 28, call 1: HtLayout::PerSourceInWindow (the per-source
# dispatch's tokens left in the window, no copy out; the in-place
# combine reading the LSA ranks' rows over NVLink). Bundle
# .device/s28a.tar.xz: moe tests, moe_bench, devcomm-run, cubins of the
# library and test PTX. Every moe test (1-8 ranks, LSA, GIN, both), then
# moe_bench HT 4096 bf16: per source (copy out, push combine) and in the
# window alternating x2, f16 in the window, and LL 128 as a control.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s28a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
moe_tests a
date -u +%T
for round in 1 2; do
    moe_bench_run a ps_$round --mode ht --per-source --tokens 4096
    moe_bench_run a win_$round --mode ht --in-window --tokens 4096
done
moe_bench_run a win_f16 --mode ht --in-window --tokens 4096 --dtype f16
moe_bench_run a ll --tokens 128
date -u
echo "call1: overall status $status"
exit $status
