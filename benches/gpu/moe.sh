#!/usr/bin/env bash
# GPU run of the MoE dispatch/combine (issue 15: low-latency and
# high-throughput modes), from the repository root after `cargo xtask bundle`:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/moe.sh")
# Correctness first (tests/moe on CUDA: 1 and 2 ranks, GIN with 2 ranks; the
# 3/4/8-rank cases with up to 2 ranks per GPU unless SKIP_OVERSUBSCRIBED=1),
# then moe_bench on 2 GPUs with the NCCL path and the copy engine beside it:
# low-latency at 128 tokens (bf16, then fp8 dispatch), high-throughput at 4096
# tokens (hidden 7168, top-8, 256 experts, bf16). Logs: $OUT/moe.log,
# $OUT/moe_bench_*.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
bench() { # name, args...
    local name=$1; shift
    echo; echo "== moe_bench ($name), CUDA, 2 GPUs"
    DEVCOMM_RUNTIME=cuda timeout 500 $B/bin/devcomm-run -n 2 $B/bin/moe_bench --nccl "$@" 2>&1 | tee "$OUT/moe_bench_$name.log" || { echo "!! moe_bench ($name) failed"; status=1; }
}
exec > >(tee "$OUT/moe.log") 2>&1
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version --format=csv
    step env DEVCOMM_RUNTIME=cuda timeout 500 $B/tests/moe-* --test-threads=1 moe_1_rank moe_2_ranks moe_gin_2_ranks
    bench ll --tokens 128
    bench ll_fp8 --tokens 128 --fp8
    bench ht --mode ht --tokens 4096
    if [ -z "${SKIP_OVERSUBSCRIBED:-}" ]; then
        step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 500 $B/tests/moe-* --test-threads=1 moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks
    fi
    echo
    echo "moe: overall status $status"
}
exit $status
