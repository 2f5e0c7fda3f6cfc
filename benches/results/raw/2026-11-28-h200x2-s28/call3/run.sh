#!/usr/bin/env bash
# Session 28, call 3: is the HT dispatch's tail (receives ending 25-50 us
# after the last send) the ranks' skew at the dispatch's start? moe_bench
# with --align (an NCCL exchange of 4 bytes a peer before each timed
# dispatch, outside the events) against without, alternating, HT 4096 in
# the window and per source; LL 128 both ways. Bundle .device/s28c.tar.xz:
# this commit's moe_bench, devcomm-run, and call 2's library cubin under
# this PTX's name (the PTX bodies are call 2's; only the inputs line differs).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s28c.tar.xz c
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
for round in 1 2; do
    moe_bench_run c win_$round --mode ht --in-window --tokens 4096
    moe_bench_run c win_align_$round --mode ht --in-window --tokens 4096 --align
done
moe_bench_run c ps_align --mode ht --per-source --tokens 4096 --align
moe_bench_run c ll --tokens 128
moe_bench_run c ll_align --tokens 128 --align
date -u
echo "call3: overall status $status"
exit $status
