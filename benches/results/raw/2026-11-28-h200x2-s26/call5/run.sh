#!/usr/bin/env bash
# Session 26, call 5: build c (bundle .device/s26c.tar.xz), the graphed
# 2 MiB all-reduce with 256 (default), 384 and 128 threads per CTA
# (`--threads`: the pushed f32 kernel has 162 registers, 384 x 162 fits an
# SM's 64 Ki registers), and with 64 CTAs (`--bytes-per-cta 32K`).
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle s26c.tar.xz c
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
R="$B/c/bin/devcomm-run -n 2"
for round in 1 2; do
    for v in "256" "384" "128" "256 --bytes-per-cta 32K"; do
        set -- $v; th=$1; shift
        echo; echo "== threads $th $* round $round"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $B/c/bin/devcomm_perf -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --threads $th "$@" 2>&1 | grep -v "^\[rank 1\]" | grep -v "^\[rank 0\] #"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $B/c/bin/devcomm_perf -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --stages --threads $th "$@" 2>&1 | grep "stages rank"
    done
done
date -u
echo "call5: overall status $status"
exit $status
