#!/usr/bin/env bash
# Session 36, call 1 on ONE H200 (no 2-GPU kind lent): build n4, the
# lean dispatch's routing work in one pass per CTA (`dispatch_send_tally`:
# the counts of experts b, b + B, ... and slot b's positions, then
# `dispatch_send_token_tallied`), with the "sent" stamp before prepare and
# "waited" after it. Every `moe` test with n4 (all ranks on the one GPU);
# one rank: n4 against c3 (HEAD 6a93f13 = session 35's n3, the per-warp
# scans) alternating x3; 64 / 256 tokens, fp8 (the general kernel); the
# floor's `pe stream stream_warp sendonly` on one GPU beside; Nsight
# Compute of n4's moe_dispatch_lsa last.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=570
unpack_bundle s36a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
(nvcc -O3 -arch=sm_90 -DRANKS=1 -Xcompiler -pthread -o /tmp/moe_floor1 benches/gpu/moe_floor.cu -lcuda) > "$OUT/logs/nvcc.log" 2>&1 &
NVCC_PID=$!
T=.device/a/tests/moe
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n4_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a c3_$round --tokens 128
done
moe_bench_run a n4_64 --tokens 64
MOE_BENCH=moe_bench_c moe_bench_run a c3_64 --tokens 64
moe_bench_run a n4_256 --tokens 256
MOE_BENCH=moe_bench_c moe_bench_run a c3_256 --tokens 256
moe_bench_run a n4_fp8 --tokens 128 --fp8
wait "$NVCC_PID"; cat "$OUT/logs/nvcc.log"
step timeout 60 /tmp/moe_floor1 pe stream stream_warp sendonly
name=moe_dispatch_lsa
DEVCOMM_RUNTIME=cuda timeout 150 ncu --clock-control none --target-processes all -k regex:"^$name\$" --launch-skip 6 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
    -o "$OUT/$name" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 > /tmp/ncu_run_$name.log 2>&1
echo "ncu $name rc $?"
ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/logs/ncu_$name.txt" 2>&1
grep -E "Duration|Issued Warp|No Eligible|Registers" "$OUT/logs/ncu_$name.txt"
ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$name.txt"; head -3 "$OUT/logs/stalls_$name.txt"
rm -f "$OUT/$name.ncu-rep"
date -u
echo "call1: overall status $status"
exit $status
