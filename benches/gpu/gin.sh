#!/usr/bin/env bash
# GPU run of GIN through the proxy backend (issue 4), from the repository root
# after `cargo xtask bundle`:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/gin.sh")
# Correctness first (tests/gin on CUDA: 2-rank cases; each rank its own node),
# then gin_bench (round trip, put bandwidth next to the copy engine, message rate).
# Logs: $OUT/gin.log, $OUT/gin_bench.log (copy engine), $OUT/gin_bench_tcp.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version --format=csv
    step env DEVCOMM_RUNTIME=cuda $B/tests/gin-* --test-threads=1
    step env DEVCOMM_RUNTIME=cuda $B/tests/lsa-* --test-threads=1
    echo; echo "== gin_bench, copy-engine transport (same host), CUDA, 2 GPUs"
    DEVCOMM_RUNTIME=cuda timeout 240 $B/bin/devcomm-run -n 2 $B/bin/gin_bench ${QUICK:-} 2>&1 | tee "$OUT/gin_bench.log" || { echo "!! gin_bench failed"; status=1; }
    echo; echo "== gin_bench, TCP transport, CUDA, 2 GPUs"
    DEVCOMM_GIN_TRANSPORT=tcp DEVCOMM_RUNTIME=cuda timeout 240 $B/bin/devcomm-run -n 2 $B/bin/gin_bench ${QUICK:-} 2>&1 | tee "$OUT/gin_bench_tcp.log" || { echo "!! gin_bench (tcp) failed"; status=1; }
    echo
    echo "gin: overall status $status"
} 2>&1 | tee "$OUT/gin.log"
exit $status
