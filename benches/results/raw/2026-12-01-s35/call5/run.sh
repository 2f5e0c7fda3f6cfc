#!/usr/bin/env bash
# Session 35, call 5 on ONE H200: build n3 = bc36bcf, the streamed
# receive with the counts taken by each CTA's first warp before its token
# items (every thread reading the words: no CTA-wide sync_max, which is 33
# barriers for a non-zero value; call 4's n2 spent 4.9 us there). Every
# `moe` test with n3 (all ranks on the one GPU); one rank: n3, c (0b46ccf,
# the per-expert pack) and n1 (5eb5a01, call 3's streamed receive)
# alternating x2; 64 / 256 tokens for n3 and c, fp8 (general kernel) for
# n3; Nsight Compute of n3's moe_dispatch_lsa last.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s35p.tar.xz a
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
T=.device/a/tests/moe
bench1() {  # bench1 NAME BIN ARGS...: moe_bench BIN on one rank
    local name=$1 bin=$2; shift 2
    echo; echo "== $bin $name (1 rank): $*"
    DEVCOMM_RUNTIME=cuda timeout 90 .device/a/bin/devcomm-run -n 1 .device/a/bin/$bin --stages "$@" 2>&1 | grep -v "^\[rank 0\] #  /rank\|^\[rank 0\] # tokens" \
        || { echo "!! $name failed"; status=1; }
}
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
for round in 1 2; do
    bench1 n3_$round moe_bench --tokens 128
    bench1 c_$round moe_bench_c --tokens 128
    bench1 n1_$round moe_bench_n1 --tokens 128
done
bench1 n3_64 moe_bench --tokens 64
bench1 c_64 moe_bench_c --tokens 64
bench1 n3_256 moe_bench --tokens 256
bench1 c_256 moe_bench_c --tokens 256
bench1 n3_fp8 moe_bench --tokens 128 --fp8
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
echo "call5: overall status $status"
exit $status
