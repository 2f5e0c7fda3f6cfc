#!/usr/bin/env bash
# Session 33, call 4 on ONE H200: build d = build c with the LL pack's row
# copy 16 vectors a lane in flight in `moe_dispatch_lsa` (two round trips
# for a 7168-wide bf16 row instead of four; 179 registers against 168) and,
# in both dispatch kernels, the header entry's id loaded before the row's
# copy and its row recorded after it (its round trip overlaps the copy's
# loads). Every `moe` test with build d, all ranks on the one GPU; then one
# rank (EP1): d and c alternating x3, and fp8 (the general kernel) of both.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s33d.tar.xz a
tar -xJf .device/s33c2.tar.xz -C .device/a
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L; ls .device/a/bin .device/a/cubin
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
    bench1 d_$round moe_bench_d --tokens 128
    bench1 c_$round moe_bench_c --tokens 128
done
bench1 d_fp8 moe_bench_d --tokens 128 --fp8
bench1 c_fp8 moe_bench_c --tokens 128 --fp8
bench1 d_64 moe_bench_d --tokens 64
bench1 c_64 moe_bench_c --tokens 64
date -u
echo "call4: overall status $status"
exit $status
