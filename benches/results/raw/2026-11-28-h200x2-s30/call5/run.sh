#!/usr/bin/env bash
# Session 30, call 5 (diagnostic builds, not committed; their diffs in
# this folder): call 4's floor ends its receives ~3 us after the sends,
# devcomm 40-70 us. Which part of devcomm's per-source receive is it?
#   va = b (b55cff3) with the channel wait a bare acquire loop (no
#        Deadline, no relaxed polls): is it the wait's code?
#   vb = va without the routing loop (the wait alone, as the floor's
#        `wait` variant; the in-window bench's check does not read the
#        routing tables): is it the routing?
# b itself beside them. The floor again, then HT in the window: b, va, vb, b.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30d.tar.xz d
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_ht_floor benches/gpu/moe_ht_floor.cu
timeout 120 /tmp/moe_ht_floor || status=1
v() { export DEVCOMM_PTX_PATH="$PWD/$B/d/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
moe_bench_run d win_b1 --mode ht --in-window --tokens 4096
for x in va vb; do v $x; moe_bench_run d win_$x --mode ht --in-window --tokens 4096; done
unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
moe_bench_run d win_b2 --mode ht --in-window --tokens 4096
for x in vb va; do v $x; moe_bench_run d win2_$x --mode ht --in-window --tokens 4096; done
date -u
echo "call5: overall status $status"
exit $status
