#!/usr/bin/env bash
# Call 2 (2 x H200): the coll test binary on CUDA with the LL broadcast and
# reduce (every case up to 4 ranks, 2 ranks per GPU), then the allreduce example.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache
[ -d $B/tests ] || { mkdir -p $B; tar -xJf $B/small2.tar.xz -C $B; }
exec > >(tee $OUT/run2.log) 2>&1
date -u; nvidia-smi -L
echo "PTX: $(grep -a -m1 -o 'inputs: sha256:[0-9a-f]*' $B/tests/coll-*)"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 560 $B/tests/coll-* --test-threads=1 --skip coll_8_ranks --skip coll_6_ranks --skip coll_8_ranks_in_four
echo; echo "run2: overall status $status"
