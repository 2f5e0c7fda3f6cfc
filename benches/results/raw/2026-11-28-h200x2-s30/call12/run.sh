#!/usr/bin/env bash
# Session 30, call 12 (diagnostic build vh, not committed: build-vh.diff):
# devcomm's in-window dispatch takes ~194 us by events (~190 back to
# back), the floor ~177, both sending for 167 us. vh = h with no receive
# at all (the kernel ends after its sends; the bench's check will count
# wrong tokens, the routing tables are not written): is the rest in the
# receive, or around the sends (launch, prepare, the kernel's end)? The
# floor's `wait` variant (sends + waits, no routing) beside it.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30j.tar.xz g
exec > >(tee "$OUT/logs/call12.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_ht_floor benches/gpu/moe_ht_floor.cu
timeout 120 /tmp/moe_ht_floor wait all || status=1
v() { export DEVCOMM_PTX_PATH="$PWD/$B/g/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
    moe_bench_run g win_h_$round --mode ht --in-window --tokens 4096
    v vh; moe_bench_run g win_vh_$round --mode ht --in-window --tokens 4096
done
date -u
echo "call12: overall status $status"
exit $status
