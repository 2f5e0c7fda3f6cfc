#!/usr/bin/env bash
# Session 27, call 1: build n = main at 2714e79 plus the LSA barrier
# session holding its addresses by value (no copy of the communicator to
# local memory at kernel entry), a deadline whose miss count stays in a
# register, and the pushed all-reduce's part cut in 32-bit arithmetic.
# Bundles: .device/bundle.tar.xz (`cargo xtask bundle`, build n) and
# .device/s27a.tar.xz (cubins of build n's PTX and of main's, main's
# devcomm_perf_old). Tests first (coll 1-8, moe, lsa), then the 2 MiB
# all-reduce old / n three times, graphed with NCCL, and stages; moe_bench.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s27a.tar.xz ab
exec > >(tee "$OUT/logs/call1.log") 2>&1
date -u; nvidia-smi -L
R="$B/bin/devcomm-run -n 2"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/tests/coll-* --exact coll_1_rank coll_2_ranks --test-threads=1
date -u +%T
for round in 1 2 3; do
    for v in old n; do
        bin=$B/bin/devcomm_perf; [ $v = old ] && bin=$B/ab/bin/devcomm_perf_old
        echo; echo "== $v round $round: graphed with NCCL"
        DEVCOMM_RUNTIME=cuda timeout 90 $R $bin -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_${v}_$round.log
        echo; echo "== $v round $round: stages"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $bin -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --in-kernel --stages 2>&1 | tee $OUT/logs/stages_${v}_$round.log
    done
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/tests/coll-* --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $B/tests/coll-* --exact coll_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $B/tests/moe-* --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 60 $B/tests/moe-* --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 40 $B/tests/moe-* --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 120 $B/tests/lsa-* --test-threads=1
date -u +%T
for args in "--mode ht --per-source --tokens 4096" "--tokens 128"; do
    left=$(( 585 - ($(date +%s) - t0) )); [ $left -lt 20 ] && { echo "!! no time left for moe_bench $args"; status=1; break; }
    echo; echo "== moe_bench $args"
    DEVCOMM_RUNTIME=cuda timeout $((left < 60 ? left : 60)) $R $B/bin/moe_bench --nccl --stages $args 2>&1 | tee -a $OUT/logs/moe_bench.log || { echo "!! moe_bench failed"; status=1; }
done
date -u
echo "call1: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs && find $OUT/logs -name "*.log" ! -name call1.log -delete
exit $status
