#!/usr/bin/env bash
# Session 17, call 2: build b (spans of warps per HT item) JITs in the
# background while build a (JIT cached from call 1) runs the P2P engine's
# tests and benchmarks (shm control by default, NCCL beside it); then b's
# MoE tests (1-4 ranks, 2 per GPU for 3-4) and moe_bench HT launch shapes
# with --stages, a's HT beside it. All logs in $OUT/logs.tar.gz.
set -uo pipefail
source benches/gpu/common.sh
for v in a b; do mkdir -p $B/$v && tar -xJf $B/$v.tar.xz -C $B/$v; done
L=$OUT/logs; mkdir -p $L
exec > >(tee "$OUT/run17b.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 400 $B/b/tests/moe-* --test-threads=1 --exact moe_1_rank > $L/warm_b.log 2>&1; echo "warm b: rc $? at $(date -u +%T)" >> $L/warm_b.log) &
wpid=$!
A=$B/a
step env DEVCOMM_RUNTIME=cuda timeout 150 $A/tests/p2p-* --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $A/examples/p2p
step env DEVCOMM_RUNTIME=cuda DEVCOMM_P2P_TRANSPORT=tcp timeout 60 $A/examples/p2p
p2pb() { local name=$1; shift; echo; echo "== p2p_bench $name: $*"; date -u +%T
    DEVCOMM_RUNTIME=cuda timeout 150 $A/bin/p2p_bench "$@" > $L/p2p_bench_$name.log 2>&1 || { echo "!! p2p_bench $name failed"; status=1; }
    cat $L/p2p_bench_$name.log; }
p2pb ipc --nccl
p2pb ipc_tcp_control --control tcp --max-bytes $((4 << 20))
p2pb tcp --transport tcp --max-bytes $((256 << 20))
date -u +%T
wait $wpid
cat $L/warm_b.log | grep -E "test result|panicked|FAILED|warm b" | head
R2="env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2"
step env DEVCOMM_RUNTIME=cuda timeout 90 $B/b/tests/moe-* --test-threads=1 --exact moe_2_ranks moe_gin_2_ranks
step $R2 timeout 150 $B/b/tests/moe-* --test-threads=1 --exact moe_3_ranks moe_gin_3_ranks moe_4_ranks moe_lsa_and_gin_4_ranks
date -u +%T
bench() { local v=$1 name=$2; shift 2; echo; echo "== build $v: moe_bench $name: $*"; date -u +%T
    DEVCOMM_RUNTIME=cuda timeout 60 $B/$v/bin/devcomm-run -n 2 $B/$v/bin/moe_bench "$@" > "$L/moe_bench_${v}_$name.log" 2>&1 || { echo "!! moe_bench $v $name failed"; status=1; }
    grep -v "^\[rank 1\] #  \|^\[rank 1\] # tokens\|^\[rank 1\] # moe\|^\[rank [01]\] #  /rank\|^\[rank [01]\] # tokens" "$L/moe_bench_${v}_$name.log"; }
bench b ht --nccl --mode ht --tokens 4096
bench b ht_stages --mode ht --tokens 4096 --stages
bench a ht --mode ht --tokens 4096
for c in 96 128 132; do bench b ht_ctas$c --mode ht --tokens 4096 --ctas $c --stages; done
bench b ht_ctas128_t384 --mode ht --tokens 4096 --ctas 128 --threads 384
bench b ll --nccl --tokens 128
date -u +%T
save_jitcache
date -u
echo "run17b: overall status $status"
cp "$OUT/run17b.log" $L/ 2>/dev/null
tar -czf $OUT/logs.tar.gz -C $OUT logs && rm -rf $L
exit $status
