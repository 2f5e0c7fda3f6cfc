#!/usr/bin/env bash
# Session 31, call 4: after build c (2fecea4) the in-window dispatch's
# writes still drain ~14 us after its sends (call 3). Call 2's vl showed
# the rank's own tokens (local writes) cost ~5 us of it; the floor's own
# writes cost ~nothing. devcomm writes them through the LSA mapping of its
# own window (an imported handle of its own allocation), the floor through
# the allocation's own address. w1 = c + vi's fence stamp (no receive),
# w2 = w1 without the own tokens' copy; each with moe_bench (own tokens via
# the LSA mapping) and moe_bench_prefix (session 30's pre-8360c63 host: the
# own allocation's address as `out`).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s31d.tar.xz d
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
v() { export DEVCOMM_PTX_PATH="$PWD/$B/d/ptx/$1.ptx" DEVCOMM_NO_PRELOAD=1; }
for round in 1 2; do
    v w1; moe_bench_run d win_w1_$round --mode ht --in-window --tokens 4096
    v w1; MOE_BENCH=moe_bench_prefix moe_bench_run d win_w1_prefix_$round --mode ht --in-window --tokens 4096
    v w2; moe_bench_run d win_w2_$round --mode ht --in-window --tokens 4096
done
# (As run, the floors' compile checks were started in the background and
# waited for with a bare `wait`, which under `exec > >(tee ...)` waits for
# the tee: the call hung until its 400 s limit after the benches. Removed.)
date -u
echo "call4: overall status $status"
exit $status
