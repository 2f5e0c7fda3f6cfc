#!/usr/bin/env bash
# Session 34, call 1 on ONE H200 (no 2-GPU kind lent): build n = HEAD
# c8fa70a plus the low-latency pack spread over the grid (`pack_units`:
# spans of 4 warps per expert when there are more local experts than CTAs,
# several CTAs per expert (`PackPart`) when there are fewer), the lean
# kernels' shared `refuse`, `lsa_dispatch_serves` by `lsa_combine_serves`,
# and the new tests (`lsa_refusals`, 7-CTA groups: packs in parts). Every
# `moe` test with build n, all ranks on the one GPU; one rank (EP1): n and
# c (HEAD's build, session 33's bundle s33c2) alternating x3; 64 / 256
# tokens and fp8 for n; the plain-CUDA floor on one GPU (-DRANKS=1): pe
# (a CTA per expert, one after the other), pe_span (spans of 4 warps),
# sendonly.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s34n.tar.xz a
tar -xJf .device/s33c2.tar.xz -C .device/a
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
(nvcc -O3 -arch=sm_90 -DRANKS=1 -Xcompiler -pthread -o /tmp/moe_floor1 benches/gpu/moe_floor.cu -lcuda) > "$OUT/logs/nvcc.log" 2>&1 &
NVCC_PID=$!
T=.device/a/tests/moe
bench1() {  # bench1 NAME BIN ARGS...: moe_bench BIN on one rank
    local name=$1 bin=$2; shift 2
    echo; echo "== $bin $name (1 rank): $*"
    DEVCOMM_RUNTIME=cuda timeout 90 .device/a/bin/devcomm-run -n 1 .device/a/bin/$bin --nccl --stages "$@" 2>&1 \
        || { echo "!! $name failed"; status=1; }
}
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
for round in 1 2 3; do
    bench1 n_$round moe_bench --tokens 128
    bench1 c_$round moe_bench_c --tokens 128
done
bench1 n_fp8 moe_bench --tokens 128 --fp8
bench1 n_64 moe_bench --tokens 64
bench1 c_64 moe_bench_c --tokens 64
bench1 n_256 moe_bench --tokens 256
wait "$NVCC_PID"; cat "$OUT/logs/nvcc.log"
step timeout 60 /tmp/moe_floor1 pe pe_span sendonly
step timeout 60 /tmp/moe_floor1 pe pe_span
date -u
echo "call1: overall status $status"
exit $status
