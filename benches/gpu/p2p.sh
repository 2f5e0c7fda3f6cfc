#!/usr/bin/env bash
# GPU run of the point-to-point engine (issue 16, part 2), from the
# repository root after `cargo xtask bundle` built `.device/` here:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/p2p.sh")
# Correctness first (tests/p2p.rs and the example on CUDA), then p2p_bench
# over same-host IPC (copy engine; control frames over the shared-memory
# rings) with NCCL send/recv in the same call, the same up to 4 MiB with
# control frames over the control socket (--control tcp), then over TCP on
# loopback (its plain-TCP-socket floor beside it).
# Logs: $OUT/p2p.log (everything), $OUT/p2p_bench_ipc.log,
# $OUT/p2p_bench_ipc_tcp_control.log, $OUT/p2p_bench_tcp.log.
# QUICK=--quick: sizes up to 4 MiB only.
set -uo pipefail
source "$(dirname "$0")/common.sh"
QUICK=${QUICK:-}
exec > >(tee "$OUT/p2p.log") 2>&1
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv
    step env DEVCOMM_RUNTIME=cuda $B/tests/p2p-* --test-threads=1
    step env DEVCOMM_RUNTIME=cuda $B/examples/p2p
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_P2P_TRANSPORT=tcp $B/examples/p2p
    echo; echo "== p2p_bench, same host (IPC, copy engine), GPU1 -> GPU0, NCCL send/recv beside it"
    DEVCOMM_RUNTIME=cuda timeout 500 $B/bin/p2p_bench --nccl $QUICK 2>&1 | tee "$OUT/p2p_bench_ipc.log" || { echo "!! p2p_bench (ipc) failed"; status=1; }
    echo; echo "== p2p_bench, same host, control frames over the control socket (the path before the shared-memory rings), small sizes"
    DEVCOMM_RUNTIME=cuda timeout 300 $B/bin/p2p_bench --control tcp --max-bytes $((4 << 20)) 2>&1 | tee "$OUT/p2p_bench_ipc_tcp_control.log" || { echo "!! p2p_bench (ipc, tcp control) failed"; status=1; }
    echo; echo "== p2p_bench over TCP on loopback (plain TCP socket floor beside it)"
    DEVCOMM_RUNTIME=cuda timeout 500 $B/bin/p2p_bench --transport tcp --max-bytes $((256 << 20)) $QUICK 2>&1 | tee "$OUT/p2p_bench_tcp.log" || { echo "!! p2p_bench (tcp) failed"; status=1; }
    echo
    echo "p2p: overall status $status"
}
exit $status
