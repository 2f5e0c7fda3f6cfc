#!/usr/bin/env bash
# Session 19, call 3: build b again (call 2's binaries). Where LL should
# stop on two ranks: the all-reduce (graphed and in kernel) and the
# broadcast at 2-32 KiB with LL and one-shot forced, NCCL beside them.
# While the JIT runs: p2p_bench at 4-64 KiB with 9 repetitions (call 2 had
# send/recv behind NCCL at 16 KiB in one run of 5).
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/b && tar -xJf $B/b19b.tar.xz -C $B/b
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 380 $B/b/bin/devcomm-run -n 1 $B/b/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > $OUT/logs/warm_b.log 2>&1; echo "warm b: rc $? at $(date -u +%T)" >> $OUT/logs/warm_b.log) &
wpid=$!
echo "== p2p_bench 4 KiB .. 64 KiB, medians of 9, NCCL beside it"
DEVCOMM_RUNTIME=cuda timeout 120 $B/b/bin/p2p_bench --nccl --min-bytes 4096 --max-bytes 65536 --reps 9 2>&1 | tee $OUT/logs/p2p_small.log || { echo "!! p2p_bench failed"; status=1; }
date -u +%T
wait $wpid
tail -3 $OUT/logs/warm_b.log
date -u +%T
P="$B/b/bin/devcomm-run -n 2 $B/b/bin/devcomm_perf"
for a in ll one_shot; do
  step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 2K -e 16K -f 2 -n 200 --reps 7 --graph --in-kernel --algorithm $a
done
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 2K -e 32K -f 2 -n 200 --reps 7 --graph --nccl
for a in ll one_shot; do
  step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o broadcast -b 2K -e 16K -f 2 -n 200 --reps 7 --graph --algorithm $a
done
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o broadcast -b 2K -e 16K -f 2 -n 200 --reps 7 --graph --nccl
date -u
echo "call3: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
