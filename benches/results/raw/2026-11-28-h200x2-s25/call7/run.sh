#!/usr/bin/env bash
# Session 25, call 7: main's final state (library PTX inputs 64c2e7f6,
# code identical to call 6's; tests/moe.rs with the per-source bad-input
# case): every moe test 1-8 ranks. Bundle: .device/b25h.tar.xz.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b25h.tar.xz c
exec > >(tee "$OUT/logs/call7.log") 2>&1
date -u; nvidia-smi -L
moe_tests c
date -u
echo "call7: overall status $status"
exit $status
