#!/usr/bin/env bash
# Session 33, call 3 on ONE H200: build c = build a (moe_dispatch_lsa) plus
# `moe_combine_lsa_*`, the low-latency combine compiled for the single-node
# case alone (every rank in the LSA team, per rank: the per-token receive,
# no per-expert sends, no grid wait or reduce; 5.4 K PTX lines against
# 10.0 K, 304-byte stack frame against 464) and `combine_send_token` /
# `combine_recv_token` inlined always (two kernels call them now). Every
# `moe` test with build c, all ranks on the one GPU; then one rank (EP1):
# c, a (call 1-2's build) and HEAD d529b35 (old), each its own moe_bench
# with its embedded PTX and image, alternating x3; ncu of both combines.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s33a2.tar.xz a
tar -xJf .device/s33b.tar.xz -C .device/a
tar -xJf .device/s33c.tar.xz -C .device/a
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
T=.device/a/tests/moe
bench1() {  # bench1 NAME BIN ARGS...: moe_bench BIN on one rank
    local name=$1 bin=$2; shift 2
    echo; echo "== $bin $name (1 rank): $*"
    DEVCOMM_RUNTIME=cuda timeout 90 .device/a/bin/devcomm-run -n 1 .device/a/bin/$bin --nccl --stages "$@" 2>&1 \
        || { echo "!! $name failed"; status=1; }
}
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
for round in 1 2 3; do
    bench1 c_$round moe_bench_c --tokens 128
    bench1 a_$round moe_bench --tokens 128
    bench1 old_$round moe_bench_old --tokens 128
done
bench1 c_fp8 moe_bench_c --tokens 128 --fp8
bench1 c_256 moe_bench_c --tokens 256
for k in moe_combine_lsa_bf16:moe_bench_c moe_combine_bf16:moe_bench_old; do
    name=${k%%:*}; bin=${k##*:}
    left=$(( 560 - ($(date +%s) - t0) ))
    [ $left -lt 70 ] && { echo "no time left for ncu $name ($left s)"; continue; }
    DEVCOMM_RUNTIME=cuda timeout $((left - 15)) ncu --clock-control none --target-processes all -k regex:"^$name\$" --launch-skip 6 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --import-source no \
        -o "$OUT/$name" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/$bin --tokens 128 -n 4 -w 2 --reps 1 > /tmp/ncu_run_$name.log 2>&1
    echo "ncu $name rc $?"; tail -3 /tmp/ncu_run_$name.log
    ncu --import "$OUT/$name.ncu-rep" --page details > /tmp/ncu_$name.txt 2>&1; grep -E "Duration|Elapsed Cycles|Issued Warp|No Eligible|Registers" /tmp/ncu_$name.txt
    ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
    python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$name.txt"; head -3 "$OUT/logs/stalls_$name.txt"
    rm -f "$OUT/$name.ncu-rep"
done
date -u
echo "call3: overall status $status"
exit $status
