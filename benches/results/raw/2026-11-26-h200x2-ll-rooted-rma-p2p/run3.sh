#!/usr/bin/env bash
# Call 3 (2 x H200, warm JIT cache): the 6- and 8-rank coll cases (4 ranks
# per GPU), sendrecv, moe, route, rma 2 ranks; the allreduce example.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache
[ -d $B/tests ] || { mkdir -p $B; tar -xJf $B/small2.tar.xz -C $B; }
exec > >(tee $OUT/run3.log) 2>&1
date -u; nvidia-smi -L
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 300 $B/tests/coll-* --test-threads=1 coll_8_ranks coll_6_ranks coll_hierarchical_moves_fewer_gin_bytes_4_teams
for t in sendrecv moe route rma; do
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $B/tests/$t-* --test-threads=1
done
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/bin/devcomm-run -n 2 $B/examples/allreduce
echo; echo "run3: overall status $status"
