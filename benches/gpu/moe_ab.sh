#!/usr/bin/env bash
# MoE dispatch/combine of two builds in one call (A/B), e.g. main against a
# branch: bundles .device/a and .device/b, each with bin/{moe_bench,
# devcomm-run,devcomm_perf} and tests/moe-* (or .device/{a,b}.tar.xz packed
# from such a folder). Both builds' PTX is JIT-compiled at once (two
# processes, ~4 min on a fresh machine), then each bundle's `moe` tests
# (1-2 ranks, GIN), then moe_bench alternately A, B, A, B (low-latency 128
# tokens, high-throughput 4096), NCCL beside. Log: $OUT/moe_ab.log.
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/moe_ab.sh")
set -uo pipefail
source "$(dirname "$0")/common.sh"
for v in a b; do
    if [ ! -d $B/$v ] && [ -f $B/$v.tar.xz ]; then mkdir -p $B/$v && tar -xJf $B/$v.tar.xz -C $B/$v; fi
done
exec > >(tee "$OUT/moe_ab.log") 2>&1
date -u; nvidia-smi -L
# Warm: one process per build loads the library's and the test kernels' PTX.
# `wait` names the PIDs: a bare `wait` also waits for the `tee` above
# (bash 5.1+ waits for process substitutions) and never returns.
pids=()
for v in a b; do
    echo "$v: PTX $(grep -a -m1 -o 'inputs: sha256:[0-9a-f]*' $B/$v/bin/moe_bench)"
    (DEVCOMM_RUNTIME=cuda timeout 420 $B/$v/bin/devcomm-run -n 1 $B/$v/bin/devcomm_perf -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > /tmp/warm_$v.log 2>&1; echo "warm $v: rc $? at $(date -u +%T)") &
    pids+=($!)
done
wait "${pids[@]}"
save_jitcache
date -u
for v in a b; do
    step env DEVCOMM_RUNTIME=cuda timeout 120 $B/$v/tests/moe-* --test-threads=1 moe_1_rank moe_2_ranks moe_gin_2_ranks
done
for round in 1 2; do
    for v in a b; do
        for m in "--tokens 128" "--mode ht --tokens 4096"; do
            echo; echo "== build $v, round $round: moe_bench $m"
            DEVCOMM_RUNTIME=cuda timeout 90 $B/$v/bin/devcomm-run -n 2 $B/$v/bin/moe_bench --nccl $m || { echo "!! FAILED"; status=1; }
        done
    done
done
date -u
echo "moe_ab: overall status $status"
