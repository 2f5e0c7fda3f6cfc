#!/usr/bin/env bash
# GPU run of the LSA device API (issue 3), from the repository root after
# `cargo xtask bundle` built `.device/` here:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/lsa.sh")
# Correctness first (the same test binaries as CI, on CUDA), then the LSA
# benchmark and NCCL's point-to-point figures in the same call.
# Logs: $OUT/lsa.log (everything), $OUT/lsa_bench.log, $OUT/nccl_p2p.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
QUICK=${QUICK:-}
exec > >(tee "$OUT/lsa.log") 2>&1
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv
    step env DEVCOMM_RUNTIME=cuda $B/tests/runtime-* --test-threads=1
    step env DEVCOMM_RUNTIME=cuda $B/tests/lsa-* --test-threads=1
    for t in $B/tests/windows-* $B/tests/windows_bad_input-*; do [ -x "$t" ] && step env DEVCOMM_RUNTIME=cuda "$t" --test-threads=1; done
    echo; echo "== lsa_bench (devcomm, CUDA, 2 GPUs)"
    DEVCOMM_RUNTIME=cuda LSA_BENCH_SWEEP=${LSA_BENCH_SWEEP:-1} timeout 300 $B/bin/devcomm-run -n 2 $B/bin/lsa_bench $QUICK 2>&1 | tee "$OUT/lsa_bench.log" || { echo "!! lsa_bench failed"; status=1; }
    if [ -z "${SKIP_NCCL:-}" ]; then
        echo; echo "== NCCL point-to-point, same machine, same call"
        timeout 300 python3 benches/gpu/nccl_p2p.py $QUICK 2>&1 | grep -v Warning | tee "$OUT/nccl_p2p.log" || { echo "!! nccl_p2p failed"; status=1; }
    fi
    echo
    echo "lsa: overall status $status"
}
exit $status
