#!/usr/bin/env bash
# GPU run of GIN through the proxy backend (issue 4), from the repository root
# after `cargo xtask bundle`:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/gin.sh")
# Correctness first (tests/gin on CUDA: 2-rank cases, each rank its own node),
# then gin_bench (round
# trip, put bandwidth next to the copy engine, message rate) with the
# copy-engine transport (inline values: stream writes for a few, staged
# copies for many; then all staged), with
# TCP, and NCCL point-to-point in the same call; last, the 3/4/8-rank test
# cases with up to 2 ranks per GPU (SKIP_OVERSUBSCRIBED=1 leaves them out).
# SKIP_STAGED=1 / SKIP_TCP=1 / SKIP_NCCL=1 / SKIP_FLOOR=1 leave those benches
# out (the floor: plain CUDA C++ landing paths of a proxy, built with nvcc);
# RATE_SWEEP=1 adds the put_value rate over more grid shapes at queue depths
# 512 and 8192 (copy engine) and 8192 (TCP).
# Logs: $OUT/gin.log, $OUT/gin_bench*.log, $OUT/nccl_p2p.log, $OUT/proxy_floor.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
QUICK=${QUICK:-}
bench() { # name, env...
    local name=$1; shift
    echo; echo "== gin_bench ($name), CUDA, 2 GPUs"
    env "$@" DEVCOMM_RUNTIME=cuda timeout 240 $B/bin/devcomm-run -n 2 $B/bin/gin_bench $QUICK 2>&1 | tee "$OUT/gin_bench_$name.log" || { echo "!! gin_bench ($name) failed"; status=1; }
}
exec > >(tee "$OUT/gin.log") 2>&1
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version --format=csv
    step env DEVCOMM_RUNTIME=cuda $B/tests/runtime-* --test-threads=1 warp_
    step env DEVCOMM_RUNTIME=cuda $B/tests/gin-* --test-threads=1
    if [ -z "${SKIP_FLOOR:-}" ]; then
        # Plain CUDA floors of a proxy's landing paths (no devcomm), built here.
        echo; echo "== proxy landing floors (benches/gpu/proxy_floor.cu)"
        PATH=/usr/local/cuda/bin:$PATH nvcc -O2 -arch=sm_90 -o /tmp/proxy_floor benches/gpu/proxy_floor.cu -lcuda \
            && timeout 150 /tmp/proxy_floor 2>&1 | tee "$OUT/proxy_floor.log" || { echo "!! proxy_floor failed"; status=1; }
    fi
    bench copy_engine
    [ -z "${SKIP_STAGED:-}" ] && bench copy_engine_staged DEVCOMM_GIN_CE_STAGE_INLINE=1
    [ -z "${SKIP_TCP:-}" ] && bench tcp DEVCOMM_GIN_TRANSPORT=tcp
    if [ -n "${RATE_SWEEP:-}" ]; then
        bench rate_ce_512 GIN_BENCH_ONLY=rate GIN_BENCH_DEPTH=512
        bench rate_ce_8192 GIN_BENCH_ONLY=rate GIN_BENCH_DEPTH=8192
        bench rate_tcp_8192 GIN_BENCH_ONLY=rate GIN_BENCH_DEPTH=8192 DEVCOMM_GIN_TRANSPORT=tcp
        # Bandwidth with a queue deeper than the puts: post_us is posting alone.
        bench bw_ce_8192 GIN_BENCH_ONLY=bw GIN_BENCH_DEPTH=8192
        bench bw_ce_32posters GIN_BENCH_ONLY=bw GIN_BENCH_POSTERS=32
    fi
    if [ -z "${SKIP_NCCL:-}" ]; then
        echo; echo "== NCCL point-to-point, same machine, same call"
        timeout 300 python3 benches/gpu/nccl_p2p.py $QUICK 2>&1 | grep -v Warning | tee "$OUT/nccl_p2p.log" || { echo "!! nccl_p2p failed"; status=1; }
    fi
    if [ -z "${SKIP_OVERSUBSCRIBED:-}" ]; then
        step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/tests/gin-* --test-threads=1 gin_3 gin_4 gin_rail
    fi
    echo
    echo "gin: overall status $status"
}
exit $status
