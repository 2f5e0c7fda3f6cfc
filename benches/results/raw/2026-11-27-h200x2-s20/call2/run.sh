#!/usr/bin/env bash
# Session 20, call 2: build a (the pushed one-shot all-reduce's load
# stalls removed; MoE low-latency dispatch sends a token once per LSA
# rank). The driver's JIT of the library and test kernels first (fresh
# machine, nothing else running), then on an idle machine: p2p_bench small
# messages with NCCL; the all-reduce graphed and in kernel with stages and
# NCCL; moe_bench low-latency (bf16, fp8), high-throughput at 128 and 4096
# tokens with the NCCL path; then the tests on the GPUs (coll 1-4 ranks,
# moe 1-8 ranks) and the moe example. The JIT cache comes back.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b20a.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
warm_jit a
wait_jit a
date -u +%T
R="$B/a/bin/devcomm-run -n 2"
echo "== p2p_bench 256 B .. 1 MiB (idle machine), NCCL beside it"
DEVCOMM_RUNTIME=cuda timeout 150 $B/a/bin/p2p_bench --nccl --min-bytes 256 --max-bytes $((1 << 20)) 2>&1 | tee $OUT/logs/p2p_small.log || { echo "!! p2p_bench failed"; status=1; }
date -u +%T
step env DEVCOMM_RUNTIME=cuda timeout 90 $R $B/a/bin/devcomm_perf -o all_reduce -b 8 -e 8M -f 4 -n 200 --reps 7 --graph --nccl
step env DEVCOMM_RUNTIME=cuda timeout 90 $R $B/a/bin/devcomm_perf -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --in-kernel --stages
date -u +%T
for a in "ll --tokens 128" "ll_fp8 --tokens 128 --fp8" "ht128 --mode ht --tokens 128" "ht --mode ht --tokens 4096"; do
    set -- $a; name=$1; shift
    echo; echo "== moe_bench $name"
    DEVCOMM_RUNTIME=cuda timeout 150 $R $B/a/bin/moe_bench --nccl --stages "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log || { echo "!! moe_bench $name failed"; status=1; }
done
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/a/tests/moe --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 120 $B/a/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 120 $B/a/tests/moe --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/a/bin/moe
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 120 $B/a/tests/coll --exact coll_1_rank coll_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 120 $B/a/tests/coll --exact coll_3_ranks coll_4_ranks --test-threads=1
date -u
echo "call2: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
