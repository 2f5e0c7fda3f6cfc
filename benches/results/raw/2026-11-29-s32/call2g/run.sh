#!/usr/bin/env bash
# Session 32, call 2 on ONE H200 (no 2-GPU machine lent at the time): build b =
# build a (call 1) with the combine's sends at one call site again (call 1:
# the per-token receive beside a second send call site made the sends 2 us
# slower on one rank: the send was no longer inlined). Every `moe` test with all ranks on the one GPU
# (separate processes time-slice: correctness only), then moe_bench on ONE
# rank (EP1: no NVLink; an A/B of the kernels' local work only): build a
# and HEAD's kernels (old.ptx, the same host binary) alternating x2.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s32b.tar.xz a
exec > >(tee "$OUT/logs/call2g.log") 2>&1
date -u; nvidia-smi -L
T=.device/a/tests/moe
bench1() {  # bench1 NAME ARGS...: moe_bench on one rank
    local name=$1; shift
    echo; echo "== moe_bench $name (1 rank): $*"
    DEVCOMM_RUNTIME=cuda timeout 90 .device/a/bin/devcomm-run -n 1 .device/a/bin/moe_bench --nccl --stages "$@" 2>&1 \
        | tee $OUT/logs/moe_bench_$name.log || { echo "!! $name failed"; status=1; }
}
for round in 1 2; do
    bench1 a_$round --tokens 128
    DEVCOMM_PTX_PATH=$PWD/.device/a/ptx/old.ptx DEVCOMM_NO_PRELOAD=1 bench1 old_$round --tokens 128
done
bench1 a_256 --tokens 256
bench1 a_fp8 --tokens 128 --fp8
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout 240 $T --exact moe_8_ranks --test-threads=1
date -u
echo "call2g: overall status $status"
exit $status
