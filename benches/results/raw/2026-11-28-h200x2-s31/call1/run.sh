#!/usr/bin/env bash
# Session 31, call 1: devcomm's in-window HT dispatch stamps its sends at
# ~167 us like the floor, yet with no receive at all (session 30's vh) its
# kernel still takes ~188 us back to back, the floor ~175. Two questions:
# (1) does VMM memory (devcomm's windows) slow the floor's NVLink writes?
#     The floor with FLOOR_VMM=1 (receive areas from cuMemCreate/cuMemMap)
#     beside the plain one, variants `all` and `wait`.
# (2) does devcomm's kernel wait for its writes after the "sent" stamp?
#     Diagnostic vi (build-vi.diff, not committed): after the sends every
#     thread runs a system fence, then "waited"/"counted"/"done" are stamped;
#     no receive. h = HEAD's build beside it.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s31a.tar.xz a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_ht_floor benches/gpu/moe_ht_floor.cu -lcuda
timeout 120 /tmp/moe_ht_floor all wait || status=1
FLOOR_VMM=1 timeout 120 /tmp/moe_ht_floor all wait || status=1
v() { export DEVCOMM_PTX_PATH="$PWD/$B/a/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
    moe_bench_run a win_h_$round --mode ht --in-window --tokens 4096
    v vi; moe_bench_run a win_vi_$round --mode ht --in-window --tokens 4096
done
timeout 120 /tmp/moe_ht_floor all || status=1
FLOOR_VMM=1 timeout 120 /tmp/moe_ht_floor all || status=1
date -u
echo "call1: overall status $status"
exit $status
