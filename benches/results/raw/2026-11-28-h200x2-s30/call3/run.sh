#!/usr/bin/env bash
# Session 30, call 3: where are the ~6.6 us of an LL combine outside its
# kernel's stamps (call 2: 26.8 us by events, "reduced" ~20 us after the
# first CTA's start)? moe_bench now also times `iters` dispatch + combine
# pairs between two events only (the floors' method, session 23) beside
# the per-call events. Build b's PTX and kernel images (call 2), b's
# moe_bench with that line. LL 128 and HT 4096 in the window, each with
# and without --stages (the stages' CTA syncs run in the timed pairs too).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30c.tar.xz c
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
plain() {  # moe_bench without --stages: NAME ARGS...
    local name=$1; shift
    echo; echo "== moe_bench $name (no --stages): $*"
    DEVCOMM_RUNTIME=cuda timeout 60 $B/c/bin/devcomm-run -n 2 $B/c/bin/moe_bench --nccl "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log || status=1
}
for round in 1 2; do
    moe_bench_run c ll_st_$round --tokens 128
    plain ll_$round --tokens 128
done
moe_bench_run c win_st --mode ht --in-window --tokens 4096
plain win --mode ht --in-window --tokens 4096
plain ll_fp8 --tokens 128 --fp8
date -u
echo "call3: overall status $status"
exit $status
