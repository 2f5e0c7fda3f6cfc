#!/usr/bin/env bash
# Session 32, call 3 on ONE H200: Nsight Compute on build b's low-latency
# kernels, one rank (EP1: no other rank to wait for, so kernel replay is
# safe): where the dispatch's pack (~13.5 us for 1024 local rows of 14 KiB,
# the floor ~8) and the combine spend their time. Clocks left alone.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s32b.tar.xz a
exec > >(tee "$OUT/logs/call3g.log") 2>&1
date -u; nvidia-smi -L; which ncu; ncu --version | tail -1
for k in moe_dispatch moe_combine_bf16; do
    echo; echo "== ncu $k"
    DEVCOMM_RUNTIME=cuda timeout 240 ncu --clock-control none --target-processes all -k regex:"^$k\$" --launch-skip 6 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --section LaunchStats --section Occupancy --section SourceCounters --import-source no \
        -o "$OUT/$k" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 > "$OUT/logs/ncu_run_$k.log" 2>&1
    echo "rc $?"; tail -5 "$OUT/logs/ncu_run_$k.log"
    ncu --import "$OUT/$k.ncu-rep" --page details > "$OUT/logs/ncu_$k.txt" 2>&1; cat "$OUT/logs/ncu_$k.txt" | head -150
    ncu --import "$OUT/$k.ncu-rep" --page source --csv --print-source sass > "$OUT/logs/ncu_src_$k.csv" 2>&1; xz -T0 -6 "$OUT/logs/ncu_src_$k.csv"; xz -T0 -6 "$OUT/$k.ncu-rep"; ls -la "$OUT/logs/ncu_src_$k.csv.xz"
done
ls -la $OUT
date -u
exit $status
