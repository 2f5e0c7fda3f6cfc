#!/usr/bin/env bash
# Session 27, call 4 (call 1's bundle): the `coll` cases call 3's timeout
# cut off (hierarchical over TCP, 6 and 8 ranks in several LSA teams, the
# GIN-bytes and mismatch cases); 4 ranks per GPU at most.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
export DEVCOMM_CUBIN_DIR=$PWD/$B/ab/cubin
mkdir -p $B/ab && tar -xJf $B/s27a.tar.xz -C $B/ab
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 330 $B/tests/coll-* --exact --test-threads=1 \
    coll_mismatched_counts_are_refused_in_checking_mode coll_hierarchical_moves_fewer_gin_bytes \
    coll_4_ranks_in_two_lsa_teams_hierarchical_over_tcp coll_6_ranks_in_two_lsa_teams_of_3_hierarchical \
    coll_8_ranks_in_four_lsa_teams_hierarchical coll_hierarchical_moves_fewer_gin_bytes_4_teams
date -u
echo "call4: overall status $status"
exit $status
