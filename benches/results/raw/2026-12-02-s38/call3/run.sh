#!/usr/bin/env bash
# Session 38, call 3 on ONE H200, the bundle of calls 1-2: why n1's fp8
# dispatch (the general kernel `moe_dispatch`, whose pack code n1 did not
# change) is ~1.1 us slower than c's: Nsight Compute warp-stall samples of
# `moe_dispatch` under `--fp8`, n1 then c.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s38a.tar.xz a
exec > >(tee "$OUT/logs/call3.log") 2>&1
mkdir -p $B/b/bin && cp $B/a/bin/devcomm-run $B/b/bin/ && cp $B/a/bin/moe_bench_c $B/b/bin/moe_bench
ncu_stalls a moe_dispatch --fp8
for f in logs/ncu_moe_dispatch.txt logs/stalls_moe_dispatch.txt src_moe_dispatch.csv.xz; do mv "$OUT/$f" "$OUT/${f/moe_dispatch/moe_dispatch_n1}"; done
ncu_stalls b moe_dispatch --fp8
for f in logs/ncu_moe_dispatch.txt logs/stalls_moe_dispatch.txt src_moe_dispatch.csv.xz; do mv "$OUT/$f" "$OUT/${f/moe_dispatch/moe_dispatch_c}"; done
echo "call3: overall status $status"
pack_logs
exit $status
