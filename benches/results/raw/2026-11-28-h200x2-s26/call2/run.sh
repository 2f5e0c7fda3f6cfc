#!/usr/bin/env bash
# Session 26, call 2: build b = call 1's pushed one-shot by packs (build a)
# + the barrier's epoch load first and the reduction made after the first
# loads (`all_reduce_pushed_by`) + LSA barrier waits acquiring every poll
# (`wait_ge_u32_acquiring`: no re-read after the last arrival). Bundle
# .device/s26b.tar.xz: build b's devcomm_perf, moe_bench and tests (coll,
# moe, lsa); main's (e7a4757) devcomm_perf_old; both builds' cubins (build
# a's left out: the bundle and the tree must fit 64 MiB). Tests, then the
# all-reduce old / b twice (graphed with NCCL; stages), moe tests and
# moe_bench (the barrier change reaches the MoE kernels), the 8 B - 8 MiB
# sweep.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s26b.tar.xz b
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
R="$B/b/bin/devcomm-run -n 2"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/b/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
date -u +%T
for round in 1 2; do
    for v in old b; do
        bin=devcomm_perf; [ $v = old ] && bin=devcomm_perf_old
        echo; echo "== $v round $round: graphed with NCCL"
        DEVCOMM_RUNTIME=cuda timeout 90 $R $B/b/bin/$bin -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_${v}_$round.log
        echo; echo "== $v round $round: stages"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $B/b/bin/$bin -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --in-kernel --stages 2>&1 | tee $OUT/logs/stages_${v}_$round.log
    done
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 150 $B/b/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 150 $B/b/tests/coll --exact coll_8_ranks --test-threads=1
moe_tests b
step env DEVCOMM_RUNTIME=cuda timeout 120 $B/b/tests/lsa --test-threads=1
date -u +%T
moe_bench_run b ps --mode ht --per-source --tokens 4096
moe_bench_run b ll --tokens 128
echo; echo "== b: graphed 8 B - 8 MiB with NCCL"
DEVCOMM_RUNTIME=cuda timeout 90 $R $B/b/bin/devcomm_perf -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_all_b.log
date -u
echo "call2: overall status $status"
exit $status
