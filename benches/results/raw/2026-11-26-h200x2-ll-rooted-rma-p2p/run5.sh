#!/usr/bin/env bash
# Call 5 (2 x H200): GIN point-to-point channels with their own chunk size
# (CollConfig::p2p_gin_chunk_bytes, 1 MiB x 8 slots) and Auto broadcast/reduce
# back to direct. Tests: every coll case over several LSA teams (GIN), the
# 2-rank case, sendrecv; then send/recv and all-reduce between two one-rank
# LSA teams (GIN over the copy-engine proxy) with the new default.
set -uo pipefail
source benches/gpu/common.sh
export CUDA_CACHE_PATH=/tmp/jitcache
[ -d $B/tests ] || { mkdir -p $B; tar -xJf $B/small3.tar.xz -C $B; }
exec > >(tee $OUT/run5.log) 2>&1
date -u; nvidia-smi -L
echo "PTX: $(grep -a -m1 -o 'inputs: sha256:[0-9a-f]*' $B/tests/coll-*)"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 420 $B/tests/coll-* --test-threads=1 teams gin coll_2_ranks
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 120 $B/tests/sendrecv-* --test-threads=1
P="timeout 60 $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_LSA_SIZE=1 $P -o send_recv -b 64K -e 64M -f 8 -n 10 --reps 3
step env DEVCOMM_RUNTIME=cuda DEVCOMM_LSA_SIZE=1 $P -o all_reduce -b 64K -e 64M -f 8 -n 10 --reps 3
echo; echo "run5: overall status $status"
