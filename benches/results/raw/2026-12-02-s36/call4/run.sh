#!/usr/bin/env bash
# Session 36, call 4 on ONE H200: common.sh's new one-GPU helpers tried
# once (moe_tests_one_gpu, ncu_stalls, pack_logs) on call 3's bundle (n6
# = 931bcd3), with Nsight Compute of the low-latency combine
# (moe_combine_lsa_bf16) and, for the record, n6's dispatch again.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s36c.tar.xz a
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
moe_tests_one_gpu a
MOE_RANKS=1 moe_bench_run a n6 --tokens 128
ncu_stalls a moe_combine_lsa_bf16
ncu_stalls a moe_dispatch_lsa
date -u
echo "call4: overall status $status"
pack_logs
exit $status
