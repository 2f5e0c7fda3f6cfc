#!/usr/bin/env bash
# Session 30, call 4: the plain-CUDA floor of the high-throughput
# per-source dispatch in the window (benches/gpu/moe_ht_floor.cu: its
# sends, then each span's wait for its channel word and its routing), its
# three variants twice, beside devcomm's moe_bench in the window (build b,
# bundle .device/s30c.tar.xz as in call 3) in the same call. Is the tail
# after the last send (last word 20-30 us later, last receive ~20 us after
# that) the structure's or devcomm's code?
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30c.tar.xz c
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_ht_floor benches/gpu/moe_ht_floor.cu
for i in 1 2; do
    echo "== moe_ht_floor $i"; timeout 120 /tmp/moe_ht_floor || status=1
    moe_bench_run c win_$i --mode ht --in-window --tokens 4096
done
date -u
echo "call4: overall status $status"
exit $status
