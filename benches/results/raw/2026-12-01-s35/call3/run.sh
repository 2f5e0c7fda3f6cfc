#!/usr/bin/env bash
# Session 35, call 3 on ONE H200 (no 2-GPU kind lent): build n = 5eb5a01,
# the streamed receive in moe_dispatch_lsa (counts up front, positions in
# the headers, any warp takes any token slot or piece once it is in).
# Every `moe` test with build n, all ranks on the one GPU; one rank (EP1):
# n and c (build 0b46ccf = HEAD 9bc2947's library, session 34's bundle
# s34n) alternating x3; 64 / 256 tokens for both, fp8 (general kernel)
# for n; the plain-CUDA floor on one GPU (pe, stream) beside; Nsight
# Compute of n's moe_dispatch_lsa last.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s35n.tar.xz a
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
(nvcc -O3 -arch=sm_90 -DRANKS=1 -Xcompiler -pthread -o /tmp/moe_floor1 benches/gpu/moe_floor.cu -lcuda) > "$OUT/logs/nvcc.log" 2>&1 &
NVCC_PID=$!
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
    bench1 n_$round moe_bench --tokens 128
    bench1 c_$round moe_bench_c --tokens 128
done
bench1 n_64 moe_bench --tokens 64
bench1 c_64 moe_bench_c --tokens 64
bench1 n_256 moe_bench --tokens 256
bench1 c_256 moe_bench_c --tokens 256
bench1 n_fp8 moe_bench --tokens 128 --fp8
wait "$NVCC_PID"; cat "$OUT/logs/nvcc.log"
step timeout 60 /tmp/moe_floor1 pe stream
name=moe_dispatch_lsa
DEVCOMM_RUNTIME=cuda timeout 150 ncu --clock-control none --target-processes all -k regex:"^$name\$" --launch-skip 6 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters --import-source no \
    -o "$OUT/$name" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 > /tmp/ncu_run_$name.log 2>&1
echo "ncu $name rc $?"; tail -3 /tmp/ncu_run_$name.log
ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/logs/ncu_$name.txt" 2>&1
grep -E "Duration|Elapsed Cycles|Issued Warp|No Eligible|Registers|Throughput|Hit Rate" "$OUT/logs/ncu_$name.txt"
ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$name.txt"; head -12 "$OUT/logs/stalls_$name.txt"
rm -f "$OUT/$name.ncu-rep"
date -u
echo "call3: overall status $status"
exit $status
