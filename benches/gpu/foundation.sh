#!/usr/bin/env bash
# GPU check of the foundation (issue 2), run on the device machine from the
# repository root after `cargo xtask bundle` built `.device/` here:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/foundation.sh")
# CUDA runtime tests, hello on every GPU through devcomm-run (one process per
# GPU), then the same binaries on the emulator. Log: $OUT/foundation.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
exec > >(tee "$OUT/foundation.log") 2>&1
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    nvidia-smi topo -m
    step env DEVCOMM_RUNTIME=cuda $B/tests/runtime-* --test-threads=1
    step env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/examples/hello
    step $B/examples/hello
    step env DEVCOMM_RUNTIME=emulated $B/tests/runtime-*
    step env DEVCOMM_RUNTIME=emulated $B/bin/devcomm-run -n 2 $B/examples/hello
    step $B/tests/bootstrap-*
    step $B/tests/faults-*
    step $B/tests/bad_input-*
    step $B/tests/devcomm-* ptx
    echo
    echo "foundation: overall status $status"
}
exit $status
