#!/usr/bin/env bash
# Session 30, call 9: with call 8's fix the in-window dispatch takes
# ~194.5 us; its last word is still seen 16-18 us after the sends end
# (the floor: 1-2 us). Is that the ranks' skew at the dispatch's start
# (each rank starts when its own combine ends)? `--align` lines the
# ranks' streams up with a 4-byte NCCL exchange before each timed
# dispatch (not timed). Build h (call 8's bundle): in the window with and
# without --align, twice.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30g.tar.xz g
exec > >(tee "$OUT/logs/call9.log") 2>&1
date -u; nvidia-smi -L
for round in 1 2; do
    moe_bench_run g win_align_$round --mode ht --in-window --tokens 4096 --align
    moe_bench_run g win_$round --mode ht --in-window --tokens 4096
done
date -u
echo "call9: overall status $status"
exit $status
