#!/usr/bin/env bash
# Session 16, call 3: build b's JIT in the background while build a
# (cached) runs graph.sh's `ctas` sizes; then MoE A/B.
set -uo pipefail
source benches/gpu/common.sh
for v in a b; do
    if [ ! -d $B/$v ] && [ -f $B/$v.tar.xz ]; then mkdir -p $B/$v && tar -xJf $B/$v.tar.xz -C $B/$v; fi
done
exec > >(tee "$OUT/run16.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 330 $B/b/bin/devcomm-run -n 1 $B/b/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > $OUT/warm_b.log 2>&1; echo "warm b: rc $? at $(date -u +%T)") &
wpid=$!
P="$B/a/bin/devcomm-run -n 2 $B/a/bin/devcomm_perf"
step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --nccl --in-kernel --graph
for c in 32 64 96; do
    step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --in-kernel --graph --max-ctas $c
done
for b in 32K 64K; do
    step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --in-kernel --graph --bytes-per-cta $b
done
step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --graph --no-cooperative
date -u
wait $wpid
date -u
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/b/tests/moe-* --test-threads=1 moe_1_rank moe_2_ranks moe_gin_2_ranks moe_3_ranks
for m in "--mode ht --tokens 4096" "--tokens 128"; do
    for v in a b; do
        echo; echo "== build $v: moe_bench $m"; date -u +%T
        DEVCOMM_RUNTIME=cuda timeout 50 $B/$v/bin/devcomm-run -n 2 $B/$v/bin/moe_bench --nccl $m || { echo "!! FAILED"; status=1; }
    done
done
echo; echo "== build b again: moe_bench --mode ht --tokens 4096"
DEVCOMM_RUNTIME=cuda timeout 50 $B/b/bin/devcomm-run -n 2 $B/b/bin/moe_bench --nccl --mode ht --tokens 4096 || status=1
date -u
echo "run16: overall status $status"
