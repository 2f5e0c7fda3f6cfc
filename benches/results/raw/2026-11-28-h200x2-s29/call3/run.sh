#!/usr/bin/env bash
# Session 29, call 3: build b = build a + the per-source dispatch's stage
# stamps split: "waited" = when the CTA's last channel word was seen,
# "counted" = when its last channel was copied out (an atomic max per
# span; before, both were stamped after every receive). Bundle s29b. The
# HT 4096 dispatch in the window and per source with stages (channels 256
# and 128), then the moe tests.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29b.tar.xz b
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
for round in 1 2; do
    moe_bench_run b win_$round --mode ht --in-window --tokens 4096
    moe_bench_run b ps_$round --mode ht --per-source --tokens 4096
done
moe_bench_run b win_g128 --mode ht --in-window --tokens 4096 --channels 128
moe_tests b
date -u
echo "call3: overall status $status"
exit $status
