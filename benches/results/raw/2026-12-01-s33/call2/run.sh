#!/usr/bin/env bash
# Session 33, call 2 on ONE H200: the same-call A/B that call 1 could not
# make (HEAD's PTX lacks `moe_dispatch_lsa`, which build a's host picks):
# build a (moe_bench and PTX of call 1) against HEAD d529b35 whole (its own
# moe_bench binary, its PTX embedded, and its cubin), one rank (EP1),
# alternating x4; then Nsight Compute's stall samples of HEAD's
# `moe_dispatch` in the same call as call 1's of `moe_dispatch_lsa`.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s33a.tar.xz a
tar -xJf .device/s33b.tar.xz -C .device/a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
bench1() {  # bench1 NAME BIN ARGS...: moe_bench BIN on one rank
    local name=$1 bin=$2; shift 2
    echo; echo "== $bin $name (1 rank): $*"
    DEVCOMM_RUNTIME=cuda timeout 90 .device/a/bin/devcomm-run -n 1 .device/a/bin/$bin --nccl --stages "$@" 2>&1 \
        || { echo "!! $name failed"; status=1; }
}
for round in 1 2 3 4; do
    bench1 a_$round moe_bench --tokens 128
    bench1 old_$round moe_bench_old --tokens 128
done
bench1 a_64 moe_bench --tokens 64
bench1 old_64 moe_bench_old --tokens 64
left=$(( 560 - ($(date +%s) - t0) ))
if [ $left -gt 80 ]; then
    k=moe_dispatch
    DEVCOMM_RUNTIME=cuda timeout $((left - 20)) ncu --clock-control none --target-processes all -k regex:"^$k\$" --launch-skip 6 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --import-source no \
        -o "$OUT/$k" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench_old --tokens 128 -n 4 -w 2 --reps 1 > "$OUT/logs/ncu_run_$k.log" 2>&1
    echo "ncu rc $?"
    ncu --import "$OUT/$k.ncu-rep" --page details > "$OUT/logs/ncu_$k.txt" 2>&1; grep -E "Duration|Elapsed Cycles|Issued Warp|No Eligible" "$OUT/logs/ncu_$k.txt"
    ncu --import "$OUT/$k.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
    python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$k.txt"; head -3 "$OUT/logs/stalls_$k.txt"
    rm -f "$OUT/$k.ncu-rep"
else
    echo "no time left for ncu ($left s)"
fi
date -u
echo "call2: overall status $status"
exit $status
