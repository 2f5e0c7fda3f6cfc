#!/usr/bin/env bash
# Session 33, call 1 on ONE H200 (no 2-GPU machine lent): build a adds
# `moe_dispatch_lsa`, the low-latency dispatch compiled for the single-node
# case alone (every rank in the LSA team, no fp8, per-expert pack, per-rank
# combine: no GIN, fp8 or token-major code; 5.5 K PTX lines against 16.8 K,
# 168 registers against 236). Every `moe` test with all ranks on the one GPU
# (separate processes time-slice: correctness only), then moe_bench on ONE
# rank (EP1: the kernels' local work only): build a and HEAD's kernels
# (old.ptx, the same host binary) alternating x3; fp8 (the general kernel);
# Nsight Compute's stall samples of the lean kernel. Everything but ncu's
# reports goes to one log (only 8 files come back from $OUT).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s33a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
T=.device/a/tests/moe
bench1() {  # bench1 NAME ARGS...: moe_bench on one rank
    local name=$1; shift
    echo; echo "== moe_bench $name (1 rank): $*"
    DEVCOMM_RUNTIME=cuda timeout 90 .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --nccl --stages "$@" 2>&1 \
        || { echo "!! $name failed"; status=1; }
}
for round in 1 2 3; do
    bench1 a_$round --tokens 128
    DEVCOMM_PTX_PATH=$PWD/.device/a/ptx/old.ptx DEVCOMM_NO_PRELOAD=1 bench1 old_$round --tokens 128
done
bench1 a_256 --tokens 256
bench1 a_fp8 --tokens 128 --fp8
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
left=$(( 560 - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
    k=moe_dispatch_lsa
    DEVCOMM_RUNTIME=cuda timeout $((left - 20)) ncu --clock-control none --target-processes all -k regex:"^$k\$" --launch-skip 6 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --import-source no \
        -o "$OUT/$k" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 > "$OUT/logs/ncu_run_$k.log" 2>&1
    echo "ncu rc $?"
    ncu --import "$OUT/$k.ncu-rep" --page details > "$OUT/logs/ncu_$k.txt" 2>&1; head -120 "$OUT/logs/ncu_$k.txt"
    ncu --import "$OUT/$k.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
    python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$k.txt"; cat "$OUT/logs/stalls_$k.txt"
    rm -f "$OUT/$k.ncu-rep"
else
    echo "no time left for ncu ($left s)"
fi
date -u
echo "call1: overall status $status"
exit $status
