#!/usr/bin/env bash
# Session 18, call 3: build b (a kernel of its own for the pushed one-shot
# all-reduce, table-free operator decoding; P2P: the caller takes posted
# receives off the ring, p2p_bench medians of 5). Its JIT runs in the
# background while p2p_bench runs (no library kernels); then the
# all-reduce's graphed times and stages with NCCL beside them; the JIT
# cache goes back for call 4 (the tests on the GPUs).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/b && tar -xJf $B/b18b.tar.xz -C $B/b
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 420 $B/b/bin/devcomm-run -n 1 $B/b/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > $OUT/logs/warm_b.log 2>&1; echo "warm b: rc $? at $(date -u +%T)" >> $OUT/logs/warm_b.log) &
wpid=$!
echo "== p2p_bench 1 MiB .. 1 GiB, medians of 5, NCCL beside it"
DEVCOMM_RUNTIME=cuda timeout 240 $B/b/bin/p2p_bench --nccl --min-bytes $((1 << 20)) 2>&1 | tee $OUT/logs/p2p_bench.log || { echo "!! p2p_bench failed"; status=1; }
date -u +%T
wait $wpid
tail -3 $OUT/logs/warm_b.log
date -u +%T
P="$B/b/bin/devcomm-run -n 2 $B/b/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 512K -e 8M -f 4 -n 200 --reps 7 --in-kernel --graph --stages --nccl
step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --in-kernel --graph --nccl
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --window --stages
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 8 -e 8M -f 16 -n 200 --reps 7 --nccl
date -u +%T
save_jitcache
date -u
echo "call3: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
