#!/usr/bin/env bash
# GPU run of host RMA (issue 16 part 1: put_signal / signal / wait_signal) and
# the device-side Gin::get, from the repository root after `cargo xtask bundle`:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/rma.sh")
# Correctness first (tests/rma and tests/gin_get on CUDA, 2-rank cases; the
# 3/4-rank cases with up to 2 ranks per GPU unless SKIP_OVERSUBSCRIBED=1),
# then rma_bench (stream-to-stream round trip with its floors, bandwidth next
# to the copy engine): default (within the node: SM copy below 4 KiB, the
# copy engine from 4 KiB), copy engine always, SM copy always, proxy only,
# and TCP
# (SKIP_TCP=1 leaves it out). Logs: $OUT/rma.log, $OUT/rma_bench_*.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
QUICK=${QUICK:-}
bench() { # name, env...
    local name=$1; shift
    echo; echo "== rma_bench ($name), CUDA, 2 GPUs"
    env "$@" DEVCOMM_RUNTIME=cuda timeout 300 $B/bin/devcomm-run -n 2 $B/bin/rma_bench $QUICK 2>&1 | tee "$OUT/rma_bench_$name.log" || { echo "!! rma_bench ($name) failed"; status=1; }
}
exec > >(tee "$OUT/rma.log") 2>&1
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version --format=csv
    step env DEVCOMM_RUNTIME=cuda timeout 200 $B/tests/rma-* --test-threads=1 _2_ranks rma_wait_times_out
    step env DEVCOMM_RUNTIME=cuda timeout 200 $B/tests/gin_get-* --test-threads=1 _2_ranks
    bench copy_engine
    # Within the node: every size by the copy engine, every size by SM copy, none direct.
    bench copy_engine_always DEVCOMM_RMA_SM_COPY_MAX_BYTES=0 DEVCOMM_RMA_DIRECT_MIN_BYTES=1
    bench sm_copy_always DEVCOMM_RMA_SM_COPY_MAX_BYTES=18446744073709551615 DEVCOMM_RMA_DIRECT_MIN_BYTES=18446744073709551615
    bench proxy_only DEVCOMM_RMA_SM_COPY_MAX_BYTES=0 DEVCOMM_RMA_DIRECT_MIN_BYTES=18446744073709551615
    [ -z "${SKIP_TCP:-}" ] && bench tcp DEVCOMM_GIN_TRANSPORT=tcp DEVCOMM_LSA_SIZE=1
    if [ -z "${SKIP_OVERSUBSCRIBED:-}" ]; then
        step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $B/tests/rma-* --test-threads=1 _3_ranks _4_ranks
        step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $B/tests/gin_get-* --test-threads=1 _3_ranks
    fi
    echo
    echo "rma: overall status $status"
}
exit $status
