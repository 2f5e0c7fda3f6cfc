#!/usr/bin/env bash
# Session 28, call 1b (one H200: the two-GPU machine was not lent): the
# correctness half of call 1 with every rank on the one GPU (2, 4 and 8
# per GPU), bundle .device/s28a.tar.xz; then moe_bench per source and in
# the window with two ranks sharing the GPU (no NVLink: not the goal's
# figure, only whether the in-window path runs and what the copy out costs).
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s28a.tar.xz a
exec > >(tee "$OUT/logs/call1b.log") 2>&1
date -u; nvidia-smi -L
T=$B/a/tests/moe
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 120 $T --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $T --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
date -u +%T
CALL_LIMIT=470 moe_bench_run a ps_1gpu --mode ht --per-source --tokens 4096
CALL_LIMIT=470 moe_bench_run a win_1gpu --mode ht --in-window --tokens 4096
left=$(( 580 - ($(date +%s) - t0) ))
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=8 timeout $left $T --exact moe_8_ranks --test-threads=1
date -u
echo "call1b: overall status $status"
exit $status
