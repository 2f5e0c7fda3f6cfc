#!/usr/bin/env bash
# Session 30, call 11 (diagnostic build vf, not committed: build-vf.diff):
# which receive items wait 16-18 us after the sends end, those from this
# rank itself or those from the peer? vf = h with each CTA's waits laid
# on its "sent" stamp by source: "waited" = sent + the longest wait of
# its items from this rank, "counted" = that + the longest wait of its
# items from the peer ("packed" raised to at least that). In the window,
# h and vf alternating.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30i.tar.xz g
exec > >(tee "$OUT/logs/call11.log") 2>&1
date -u; nvidia-smi -L
v() { export DEVCOMM_PTX_PATH="$PWD/$B/g/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
    moe_bench_run g win_h_$round --mode ht --in-window --tokens 4096
    v vf; moe_bench_run g win_vf_$round --mode ht --in-window --tokens 4096
done
date -u
echo "call11: overall status $status"
exit $status
