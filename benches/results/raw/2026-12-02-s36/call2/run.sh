#!/usr/bin/env bash
# Session 36, call 2 on ONE H200: build n5, the one routing pass per CTA
# (counts of experts b, b + B, ... and slot b's positions) moved inside
# the token's send, between the load of its first vectors and their
# stores (`dispatch_send_token_tallied`); call 1's n4 ran it before the
# send and lost 0.5 us to c3. Every `moe` test with n5 (all ranks on the
# one GPU); one rank: n5 against c3 (HEAD 6a93f13, session 35's per-warp
# scans) alternating x3; 64 / 256 tokens; Nsight Compute of n5's
# moe_dispatch_lsa (per-instruction stalls). Logs come back as one tar
# (a call returns at most 8 files).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=540
unpack_bundle s36b.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
T=.device/a/tests/moe
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n5_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a c3_$round --tokens 128
done
moe_bench_run a n5_64 --tokens 64
MOE_BENCH=moe_bench_c moe_bench_run a c3_64 --tokens 64
moe_bench_run a n5_256 --tokens 256
MOE_BENCH=moe_bench_c moe_bench_run a c3_256 --tokens 256
name=moe_dispatch_lsa
DEVCOMM_RUNTIME=cuda timeout 150 ncu --clock-control none --target-processes all -k regex:"^$name\$" --launch-skip 6 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
    -o "$OUT/$name" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 > /tmp/ncu_run_$name.log 2>&1
echo "ncu $name rc $?"
ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/logs/ncu_$name.txt" 2>&1
grep -E "Duration|Issued Warp|No Eligible|Registers" "$OUT/logs/ncu_$name.txt"
ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$name.txt"; head -3 "$OUT/logs/stalls_$name.txt"
xz -T0 -6 < /tmp/src.csv > "$OUT/src_$name.csv.xz"; ls -la "$OUT/src_$name.csv.xz"
rm -f "$OUT/$name.ncu-rep"
date -u
echo "call2: overall status $status"
tar -C "$OUT" -cf "$OUT/logs.tar" logs && rm -rf "$OUT/logs"
exit $status
