#!/usr/bin/env bash
# Session 17, call 3: build c (plain-load scans, 8-vector token copies,
# 128 CTAs by default) JITs in the background while build b (JIT cached)
# sweeps HT channels at 128 CTAs; then c's MoE tests (1-4 ranks, 2 per GPU
# for 3-4) and moe_bench HT/LL with NCCL and --stages. Logs in $OUT/logs.tar.gz.
set -uo pipefail
source benches/gpu/common.sh
for v in b c; do mkdir -p $B/$v && tar -xJf $B/$v.tar.xz -C $B/$v; done
L=$OUT/logs; mkdir -p $L
exec > >(tee "$OUT/run17c.log") 2>&1
date -u; nvidia-smi -L
(DEVCOMM_RUNTIME=cuda timeout 400 $B/c/tests/moe-* --test-threads=1 --exact moe_1_rank > $L/warm_c.log 2>&1; echo "warm c: rc $? at $(date -u +%T)" >> $L/warm_c.log) &
wpid=$!
bench() { local v=$1 name=$2; shift 2; echo; echo "== build $v: moe_bench $name: $*"; date -u +%T
    DEVCOMM_RUNTIME=cuda timeout 60 $B/$v/bin/devcomm-run -n 2 $B/$v/bin/moe_bench "$@" > "$L/moe_bench_${v}_$name.log" 2>&1 || { echo "!! moe_bench $v $name failed"; status=1; }
    grep -v "^\[rank 1\] #  \|^\[rank 1\] # tokens\|^\[rank 1\] # moe\|^\[rank [01]\] #  /rank\|^\[rank [01]\] # tokens" "$L/moe_bench_${v}_$name.log"; }
for ch in 256 128 64; do bench b ht_ctas128_ch$ch --mode ht --tokens 4096 --ctas 128 --channels $ch --stages; done
bench b ll_stages --tokens 128 --stages
date -u +%T
wait $wpid
grep -E "test result|panicked|FAILED|warm c" $L/warm_c.log | head
R2="env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2"
step env DEVCOMM_RUNTIME=cuda timeout 90 $B/c/tests/moe-* --test-threads=1 --exact moe_2_ranks moe_gin_2_ranks
step $R2 timeout 150 $B/c/tests/moe-* --test-threads=1 --exact moe_3_ranks moe_gin_3_ranks moe_4_ranks moe_lsa_and_gin_4_ranks
date -u +%T
bench c ht --nccl --mode ht --tokens 4096
bench c ht_stages --mode ht --tokens 4096 --stages
bench c ht_ctas64_stages --mode ht --tokens 4096 --ctas 64 --stages
bench b ht_ctas128 --mode ht --tokens 4096 --ctas 128
bench c ll --nccl --tokens 128
bench c ll_stages --tokens 128 --stages
bench c ll_fp8 --nccl --tokens 128 --fp8
date -u +%T
save_jitcache
date -u
echo "run17c: overall status $status"
cp "$OUT/run17c.log" $L/ 2>/dev/null
tar -czf $OUT/logs.tar.gz -C $OUT logs && rm -rf $L
exit $status
