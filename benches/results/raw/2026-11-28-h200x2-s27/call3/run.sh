#!/usr/bin/env bash
# Session 27, call 3 (bundles of calls 1-2): the all-reduce sweep 8 B -
# 128 MiB, old / n twice, graphed with NCCL and in kernel (call 2: build n
# 0.2 us slower in kernel at 2 MiB: which sizes?); then the whole `coll`
# binary (every case, the hierarchical and GIN ones too; 4 ranks per GPU at most).
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle s27a.tar.xz ab
tar -xJf $B/s27b.tar.xz -C $B/ab
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
R="$B/bin/devcomm-run -n 2"
for round in 1 2; do
    for v in old n; do
        bin=$B/bin/devcomm_perf; [ $v = old ] && bin=$B/ab/bin/devcomm_perf_old
        echo; echo "== $v round $round: sweep, graphed with NCCL"
        DEVCOMM_RUNTIME=cuda timeout 120 $R $bin -o all_reduce -b 8 -e 128M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/sweep_${v}_$round.log
        echo; echo "== $v round $round: sweep in kernel"
        DEVCOMM_RUNTIME=cuda timeout 120 $R $bin -o all_reduce -b 8 -e 128M -f 4 -n 200 --reps 7 --graph --in-kernel 2>&1 | tee $OUT/logs/inkernel_${v}_$round.log
    done
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 400 $B/tests/coll-* --test-threads=1
date -u
echo "call3: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs && find $OUT/logs -name "*.log" ! -name call3.log -delete
exit $status
