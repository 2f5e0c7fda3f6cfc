#!/usr/bin/env bash
# Session 17, call 1 (fresh machine, no JIT cache): the JIT of the new
# library + test kernels runs in the background (moe_1_rank) while the P2P
# engine's tests and quick bench run; then MoE tests (2-4 ranks, 2 per GPU
# for 3-4), moe_bench HT/LL with NCCL, --stages, a launch-shape sweep.
set -uo pipefail
source benches/gpu/common.sh
exec > >(tee "$OUT/run17a.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 400 $B/tests/moe-* --test-threads=1 --exact moe_1_rank > $OUT/warm.log 2>&1; echo "warm: rc $? at $(date -u +%T)") &
wpid=$!
step env DEVCOMM_RUNTIME=cuda timeout 150 $B/tests/p2p-* --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $B/examples/p2p
echo; echo "== p2p_bench --nccl --quick (shm control, the default)"; date -u +%T
DEVCOMM_RUNTIME=cuda timeout 120 $B/bin/p2p_bench --nccl --quick 2>&1 | tee "$OUT/p2p_bench_ipc_quick.log" || { echo "!! p2p_bench failed"; status=1; }
date -u +%T
wait $wpid
grep -E "test result|panicked|FAILED" $OUT/warm.log | head
date -u +%T
R2="env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2"
step env DEVCOMM_RUNTIME=cuda timeout 90 $B/tests/moe-* --test-threads=1 --exact moe_2_ranks moe_gin_2_ranks
step $R2 timeout 120 $B/tests/moe-* --test-threads=1 --exact moe_3_ranks moe_gin_3_ranks moe_4_ranks moe_lsa_and_gin_4_ranks
date -u +%T
MB="$B/bin/devcomm-run -n 2 $B/bin/moe_bench"
bench() { local name=$1; shift; echo; echo "== moe_bench $name: $*"; date -u +%T
    DEVCOMM_RUNTIME=cuda timeout 60 $MB "$@" > "$OUT/moe_bench_$name.log" 2>&1 || { echo "!! moe_bench $name failed"; status=1; }
    grep -v "^\[rank 1\] #  \|^\[rank 1\] # tokens\|^\[rank 1\] # moe" "$OUT/moe_bench_$name.log"; }
bench ht --nccl --mode ht --tokens 4096
bench ht_stages --mode ht --tokens 4096 --stages
bench ll --nccl --tokens 128
bench ll_stages --tokens 128 --stages
bench ll_fp8 --nccl --tokens 128 --fp8
for t in 128 512; do bench ht_threads$t --mode ht --tokens 4096 --threads $t; done
bench ht_ch128 --mode ht --tokens 4096 --channels 128
date -u +%T
save_jitcache
date -u
echo "run17a: overall status $status"
