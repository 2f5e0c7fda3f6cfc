#!/usr/bin/env bash
# Session 31, call 2: call 1's vi (a system fence by every thread after the
# sends, no receive) stamped "waited" at ~183 us against "sent" ~167: the
# sends' writes drain ~16 us after they are issued (the floor's: ~1 us).
# Bisect the send on top of vi (diffs: build-vi.diff in call1 plus each
# build-vX.diff here, which holds vi too):
#   vk: no routing rows sent;   vl: the rank's own tokens not copied;
#   vm: a row's 14 vectors a thread all loaded before any store (U = 16);
#   vn: no early position word store.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s31b.tar.xz b
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
v() { export DEVCOMM_PTX_PATH="$PWD/$B/b/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    for x in vi vk vl vm vn; do
        v $x; moe_bench_run b win_${x}_$round --mode ht --in-window --tokens 4096
    done
done
date -u
echo "call2: overall status $status"
exit $status
