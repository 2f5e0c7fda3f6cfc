#!/usr/bin/env bash
# Session 36, call 3 on ONE H200: build n6 = HEAD 6a93f13 (c3) with the
# send's destinations from the token's ids loaded at once (a mask of
# ranks, then one peer lookup per rank; the loop before waited for each
# id's load, division and peer lookup in turn: 13 % of call 2's warp
# samples), and the review mends (parts from `Items::warps().stride`,
# one `spin` in wait.rs, `coop.agree` in `lsa::dispatch_send_token`, the
# lean kernel's "sent" stamp before prepare). The tally of calls 1-2 is
# gone. Every `moe` test with n6 (all ranks on the one GPU); one rank: n6
# against c3 alternating x3; 64 / 256 tokens, fp8 (the general kernel,
# whose send changed too) for both; Nsight Compute of n6's
# moe_dispatch_lsa. Logs come back as one tar.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
CALL_LIMIT=540
unpack_bundle s36c.tar.xz a
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
T=.device/a/tests/moe
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
export MOE_RANKS=1
for round in 1 2 3; do
    moe_bench_run a n6_$round --tokens 128
    MOE_BENCH=moe_bench_c moe_bench_run a c3_$round --tokens 128
done
moe_bench_run a n6_64 --tokens 64
MOE_BENCH=moe_bench_c moe_bench_run a c3_64 --tokens 64
moe_bench_run a n6_256 --tokens 256
MOE_BENCH=moe_bench_c moe_bench_run a c3_256 --tokens 256
moe_bench_run a n6_fp8 --tokens 128 --fp8
MOE_BENCH=moe_bench_c moe_bench_run a c3_fp8 --tokens 128 --fp8
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
echo "call3: overall status $status"
tar -C "$OUT" -cf "$OUT/logs.tar" logs && rm -rf "$OUT/logs"
exit $status
