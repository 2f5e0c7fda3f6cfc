#!/usr/bin/env bash
# Session 21, call 4: build b (build a + the lookups before the copies
# unrolled: CopyAhead::store looks up 8 destinations at once, the combine's
# row entries are filled unrolled, send_token loads a token's ids
# together). The JIT alone first (no job limit), then the moe tests 1-8
# ranks and the example, then moe_bench low-latency (bf16 with stages and
# without, fp8 with stages) and high-throughput at 4096 tokens, with the
# NCCL path.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b21b.tar.xz b
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
WARM_TIMEOUT=480 warm_jit b
wait_jit b
date -u +%T
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $B/b/tests/moe --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 60 $B/b/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 40 $B/b/tests/moe --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 30 $B/b/bin/moe
date -u +%T
R="$B/b/bin/devcomm-run -n 2"
for a in "ll_stages --tokens 128 --stages" "ll --tokens 128" "ll_fp8 --tokens 128 --fp8 --stages" "ht --mode ht --tokens 4096 --stages"; do
    set -- $a; name=$1; shift
    left=$(( 585 - ($(date +%s) - t0) ))
    [ $left -lt 15 ] && { echo "!! no time left for moe_bench $name"; status=1; continue; }
    echo; echo "== moe_bench $name"
    DEVCOMM_RUNTIME=cuda timeout $((left < 60 ? left : 60)) $R $B/b/bin/moe_bench --nccl "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log || { echo "!! moe_bench $name failed"; status=1; }
done
date -u
echo "call4: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
