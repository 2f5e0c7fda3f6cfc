#!/usr/bin/env bash
# Session 29, call 1: build a = HEAD 33cc433 + the high-throughput
# dispatch's per-channel receive waiting for its own channel's word (LSA
# sources: the sender stores the channel's first position before the word;
# before, a receiver waited for channels 0..=c and summed them, a chain of
# system-scope acquires after the last send). Bundle .device/s29a.tar.xz:
# this build's moe test, moe_bench and devcomm-run, HEAD's moe_bench as
# moe_bench_old, both builds' library cubins (and this build's test
# kernels). Every moe test (1-8 ranks), then moe_bench HT 4096 bf16 in the
# window and per source, new and old alternating, twice; LL 128 once.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
moe_tests a
date -u +%T
for round in 1 2; do
    moe_bench_run a win_$round --mode ht --in-window --tokens 4096
    MOE_BENCH=moe_bench_old moe_bench_run a win_old_$round --mode ht --in-window --tokens 4096
    moe_bench_run a ps_$round --mode ht --per-source --tokens 4096
    MOE_BENCH=moe_bench_old moe_bench_run a ps_old_$round --mode ht --per-source --tokens 4096
done
moe_bench_run a pe --mode ht --tokens 4096
moe_bench_run a ll --tokens 128
date -u
echo "call1: overall status $status"
exit $status
