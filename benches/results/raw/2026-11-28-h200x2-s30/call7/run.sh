#!/usr/bin/env bash
# Session 30, call 7 (diagnostic build vd, not committed: build-vd.diff):
# call 6's vc wrote durations the host's order check refused (every
# dispatch stage 0.0). vd = b with each receive item's durations laid on
# the CTA's own "sent" stamp, in order: "waited" = sent + the longest
# wait of the CTA's spans (item start to word seen), "counted" = that +
# the longest rest of an item (word seen to item end), "packed" raised to
# at least that. HT in the window, b and vd alternating, per source vd.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s30f.tar.xz e
exec > >(tee "$OUT/logs/call7.log") 2>&1
date -u; nvidia-smi -L
v() { export DEVCOMM_PTX_PATH="$PWD/$B/e/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    unset DEVCOMM_PTX_PATH DEVCOMM_NO_PRELOAD
    moe_bench_run e win_b_$round --mode ht --in-window --tokens 4096
    v vd; moe_bench_run e win_vd_$round --mode ht --in-window --tokens 4096
done
v vd; moe_bench_run e ps_vd --mode ht --per-source --tokens 4096
date -u
echo "call7: overall status $status"
exit $status
