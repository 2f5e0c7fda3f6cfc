#!/usr/bin/env bash
# Session 31, call 6: the floor's drain measured as devcomm's was. The
# floor's new variant `fence` (no receive; a system fence by every thread
# after the sends, then stamps) beside `wait` and `all`; devcomm's w1
# (build c + the same fence, call 4) and c itself in the same call.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s31d.tar.xz d
exec > >(tee "$OUT/logs/call6.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_ht_floor benches/gpu/moe_ht_floor.cu -lcuda
timeout 120 /tmp/moe_ht_floor fence wait all || status=1
v() { export DEVCOMM_PTX_PATH="$PWD/$B/d/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
v w1; moe_bench_run d win_w1 --mode ht --in-window --tokens 4096
unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
moe_bench_run d win_c --mode ht --in-window --tokens 4096
timeout 120 /tmp/moe_ht_floor fence all || status=1
date -u
echo "call6: overall status $status"
exit $status
