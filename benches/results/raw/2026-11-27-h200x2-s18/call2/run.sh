#!/usr/bin/env bash
# Session 18, call 2: build a (collective stage stamps) JITs in the
# background while p2p_bench measures large send/recv with the sender's own
# completion beside the server's acknowledgement (sr_tx); then the graphed
# all-reduce's stages (devcomm_perf --stages) at 512 KiB / 2 MiB / 8 MiB,
# with and without stamps, 256 and 512 threads, NCCL beside it; then the
# coll tests at 2 ranks (the stage-stamps case among them).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/a && tar -xJf $B/b18a.tar.xz -C $B/a
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 400 $B/a/bin/devcomm-run -n 1 $B/a/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > $OUT/logs/warm_a.log 2>&1; echo "warm a: rc $? at $(date -u +%T)" >> $OUT/logs/warm_a.log) &
wpid=$!
echo "== p2p_bench 1 MiB .. 1 GiB, NCCL beside it"
DEVCOMM_RUNTIME=cuda timeout 200 $B/a/bin/p2p_bench --nccl --min-bytes $((1 << 20)) 2>&1 | tee $OUT/logs/p2p_bench.log || { echo "!! p2p_bench failed"; status=1; }
date -u +%T
wait $wpid
tail -3 $OUT/logs/warm_a.log
date -u +%T
P="$B/a/bin/devcomm-run -n 2 $B/a/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 512K -e 8M -f 4 -n 200 --reps 7 --in-kernel --graph --stages --nccl
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 512K -e 8M -f 4 -n 200 --reps 7 --in-kernel --graph
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 2M -e 2M -n 200 --reps 7 --in-kernel --graph --stages --threads 512
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --stages --max-ctas 64
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 8 -e 32K -f 8 -n 200 --reps 7 --graph --stages
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 200 $B/a/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
date -u
echo "call2: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
