#!/usr/bin/env bash
# Session 10, call 6 (2 GPUs): commit 1709970 (one world() check in every
# hierarchical collective; the rail-less context test) — the coll cases that
# run the world battery (2 teams of 2; 4 teams of 2) and the 2-rank case.
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache CUDA_CACHE_MAXSIZE=1073741824
xz -dc .device/coll.xz > /tmp/coll && chmod +x /tmp/coll
SECONDS=0
timeout 330 env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 /tmp/coll --test-threads=1 --nocapture coll_2_ranks coll_4_ranks_in_two_lsa_teams_hierarchical coll_8_ranks_in_four > $OUT/t_coll6.log 2>&1
echo "exit $? ${SECONDS}s skipped $(grep -c skipped $OUT/t_coll6.log) $(grep -E '^test result' $OUT/t_coll6.log | tail -1)"
grep "PTX JIT" $OUT/t_coll6.log
awk '/^test coll/{name=$2} /\[rank 0\] test result/{print name, $NF}' $OUT/t_coll6.log
grep -E "panicked|FAILED" $OUT/t_coll6.log | head
gzip $OUT/t_coll6.log
