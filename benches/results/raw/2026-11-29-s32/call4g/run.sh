#!/usr/bin/env bash
# Session 32, call 4 on ONE H200: call 3's Nsight Compute run of build b's
# moe_dispatch (EP1, 128 tokens), its per-instruction warp stall samples
# summarized there (`stalls.py`: call 3's export was one file too many to
# come back).
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle s32b.tar.xz a
exec > >(tee "$OUT/logs/call4g.log") 2>&1
D=benches/results/raw/2026-11-29-s32/call4g
k=moe_dispatch
DEVCOMM_RUNTIME=cuda timeout 240 ncu --clock-control none --target-processes all -k regex:"^$k\$" --launch-skip 6 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --import-source no \
    -o "$OUT/$k" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 > "$OUT/logs/ncu_run_$k.log" 2>&1
echo "rc $?"
ncu --import "$OUT/$k.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 $D/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$k.txt"; cat "$OUT/logs/stalls_$k.txt"
xz -T0 -6 -c /tmp/src.csv > "$OUT/ncu_src_$k.csv.xz"; rm -f "$OUT/$k.ncu-rep"
