#!/usr/bin/env bash
# Session 7 call 5: examples on CUDA, MoE benchmarks with NCCL beside, all-reduce with 32 vs 64 CTAs (the random ~100 us penalty).
set -uo pipefail
source benches/gpu/common.sh
export DEVCOMM_TEST_RANKS_PER_GPU=4
{
date -u
t=$(ls $B/tests/run_examples-* | head -1)
timeout 200 env DEVCOMM_RUNTIME=cuda $t --test-threads=1 > $OUT/run_examples.log 2>&1; echo "run_examples exit $?"; grep -E "^test " $OUT/run_examples.log
M="timeout 120 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/moe_bench --nccl"
echo "== moe ll"; $M --tokens 128 > $OUT/moe_ll.log 2>&1; echo "exit $?"
echo "== moe ll fp8"; $M --tokens 128 --fp8 > $OUT/moe_ll_fp8.log 2>&1; echo "exit $?"
echo "== moe ht"; $M --mode ht --tokens 4096 > $OUT/moe_ht.log 2>&1; echo "exit $?"
P="timeout 100 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf -o all_reduce -b 512K -e 128M -f 4"
for r in 1 2; do for c in 32 64; do echo "== ctas $c run $r"; $P --max-ctas $c > $OUT/ar_ctas${c}_$r.log 2>&1; echo "exit $?"; done; done
} 2>&1 | tee $OUT/run5.log
cd $OUT && tar czf logs.tgz *.log && find . -name '*.log' ! -name run5.log -delete
