#!/usr/bin/env bash
# Session 34, call 2 on ONE H200: the plain-CUDA floor of the LL dispatch
# on one GPU (-DRANKS=1; call 1's run failed in vmm_alloc, which gave
# access to two GPUs), variants pe, pe_span, sendonly, pe_vmm, twice; build
# n's moe_bench on one rank beside it; Nsight Compute of build n's
# moe_dispatch_lsa (speed of light, memory workload, warp states, source
# counters: stall summary).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s34n.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -DRANKS=1 -Xcompiler -pthread -o /tmp/moe_floor1 benches/gpu/moe_floor.cu -lcuda
bench1() {  # bench1 NAME BIN ARGS...: moe_bench BIN on one rank
    local name=$1 bin=$2; shift 2
    echo; echo "== $bin $name (1 rank): $*"
    DEVCOMM_RUNTIME=cuda timeout 90 .device/a/bin/devcomm-run -n 1 .device/a/bin/$bin --stages "$@" 2>&1 \
        || { echo "!! $name failed"; status=1; }
}
step timeout 60 /tmp/moe_floor1 pe pe_span sendonly pe_vmm
bench1 n_1 moe_bench --tokens 128
step timeout 60 /tmp/moe_floor1 pe pe_span sendonly pe_vmm
bench1 n_2 moe_bench --tokens 128
name=moe_dispatch_lsa
DEVCOMM_RUNTIME=cuda timeout 200 ncu --clock-control none --target-processes all -k regex:"^$name\$" --launch-skip 6 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters --import-source no \
    -o "$OUT/$name" -f .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 > /tmp/ncu_run_$name.log 2>&1
echo "ncu $name rc $?"; tail -3 /tmp/ncu_run_$name.log
ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/logs/ncu_$name.txt" 2>&1
grep -E "Duration|Elapsed Cycles|Issued Warp|No Eligible|Registers|Throughput|Bandwidth|Hit Rate" "$OUT/logs/ncu_$name.txt"
ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src.csv > "$OUT/logs/stalls_$name.txt"; head -30 "$OUT/logs/stalls_$name.txt"
rm -f "$OUT/$name.ncu-rep"
date -u
echo "call2: overall status $status"
exit $status
