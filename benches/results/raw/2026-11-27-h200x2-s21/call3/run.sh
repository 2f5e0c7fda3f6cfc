#!/usr/bin/env bash
# Session 21, call 3 (call 1 again, its JIT done in call 2; moe_1_rank and
# moe_2_ranks passed there): build a (MoE low-latency per-rank combine, token-major
# LSA pack after a grid barrier). JIT of the library and test kernels first
# (the moe test binary loads both), then the moe tests 1-8 ranks and the
# example (correctness first), then moe_bench low-latency (bf16 with and
# without stages, fp8 with stages) with the NCCL path.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b21a.tar.xz a
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
# The JIT cache of call 2 (carried, or still on the machine).


date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/a/tests/moe --exact moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 120 $B/a/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 120 $B/a/tests/moe --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/a/bin/moe
date -u +%T
R="$B/a/bin/devcomm-run -n 2"
for a in "ll_stages --tokens 128 --stages" "ll --tokens 128" "ll_fp8 --tokens 128 --fp8 --stages"; do
    set -- $a; name=$1; shift
    echo; echo "== moe_bench $name"
    DEVCOMM_RUNTIME=cuda timeout 150 $R $B/a/bin/moe_bench --nccl "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log || { echo "!! moe_bench $name failed"; status=1; }
done
date -u
echo "call3: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
