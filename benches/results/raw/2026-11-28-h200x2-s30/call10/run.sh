#!/usr/bin/env bash
# Session 30, call 10: after the in-window fix (call 8) the last channel
# word is still seen 16-18 us after the sends end, the floor's 1-2 us.
# Is it the publish's `st.release.sys` (the floor: a system fence, then a
# relaxed store)? The floor's new variant `rel` publishes by a release
# store; diagnostic build ve (not committed: build-ve.diff) = h with
# devcomm's publish a `fence.sc.sys` and a relaxed store. Bundle
# .device/s30h.tar.xz (call 8's, plus ve's PTX and its MoE kernel images).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30h.tar.xz g
exec > >(tee "$OUT/logs/call10.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_ht_floor benches/gpu/moe_ht_floor.cu
timeout 120 /tmp/moe_ht_floor all rel || status=1
v() { export DEVCOMM_PTX_PATH="$PWD/$B/g/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
    moe_bench_run g win_h_$round --mode ht --in-window --tokens 4096
    v ve; moe_bench_run g win_ve_$round --mode ht --in-window --tokens 4096
done
timeout 120 /tmp/moe_ht_floor rel all || status=1
date -u
echo "call10: overall status $status"
exit $status
