#!/usr/bin/env bash
# Every test binary of the bundle on CUDA (2 GPUs), then hello through
# devcomm-run and the GIN benchmark. From the repository root after
# `cargo xtask bundle`:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/check_all.sh")
# Logs: $OUT/check_all.log, $OUT/gin_bench.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version --format=csv
    for t in $B/tests/*; do
        case "$(basename "$t")" in hello) continue ;; esac
        step env DEVCOMM_RUNTIME=cuda "$t" --test-threads=1
    done
    step env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/examples/hello
    echo; echo "== gin_bench"
    DEVCOMM_RUNTIME=cuda timeout 300 $B/bin/devcomm-run -n 2 $B/bin/gin_bench 2>&1 | tee "$OUT/gin_bench.log" || { echo "!! gin_bench failed"; status=1; }
    echo
    echo "check_all: overall status $status"
} 2>&1 | tee "$OUT/check_all.log"
exit $status
