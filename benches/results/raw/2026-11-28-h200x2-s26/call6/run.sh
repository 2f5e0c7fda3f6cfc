#!/usr/bin/env bash
# Session 26, call 6: main's final state (library PTX = call 3's but for
# switch-table names, after the wait loops' refactor; test kernels with
# `all_reduce_pushed_failing_f32`; `pushed_steps` at 64 threads): every
# `coll` test, 1-8 ranks (3-4 at two per GPU, 8 at four). Bundle
# .device/s26d.tar.xz: the coll test binary and both cubins.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle s26d.tar.xz d
exec > >(tee "$OUT/logs/call6.log") 2>&1
date -u; nvidia-smi -L
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/d/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/d/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $B/d/tests/coll --exact coll_8_ranks --test-threads=1
date -u
echo "call6: overall status $status"
exit $status
