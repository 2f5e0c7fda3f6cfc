#!/usr/bin/env bash
# The MoE kernels with at most 128 registers a thread (`max_registers!`):
# `moe_occupancy.sh BUNDLE DIR`. Registers and spills (`ptxas -v`), the
# JIT alone, the moe tests and the example at the default launch (132 CTAs
# × 256 threads), then moe_bench (128 tokens low-latency, 4096
# high-throughput; stages, NCCL path beside) at 256 threads, 512 threads
# and 264 CTAs (two per SM), both low-latency packs.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" "$2"
D=$B/$2
exec > >(tee "$OUT/logs/moe_occupancy.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
for k in moe_dispatch moe_combine_bf16 moe_ht_dispatch moe_ht_combine_bf16; do
    ptxas -arch=sm_90 -O3 --entry $k -v host/ptx/devcomm_kernels.sm_90.ptx -o /tmp/$k.cubin 2>&1 | grep -E "Used|spill" | head -2 | tr '\n' ' ' | sed "s/^/$k: /"; echo
done
WARM_TIMEOUT=480 warm_jit "$2"
wait_jit "$2"
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $D/tests/moe --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 60 $D/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 40 $D/tests/moe --exact moe_8_ranks --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 30 $D/bin/moe
R="$D/bin/devcomm-run -n 2"
for a in "pe256 --pack-per-expert" "pe512 --pack-per-expert --threads 512" "pe264 --pack-per-expert --ctas 264" \
    "tm256" "tm512 --threads 512" "tm264 --ctas 264" "fp8pe512 --fp8 --pack-per-expert --threads 512" \
    "ht256 --mode ht" "ht512 --mode ht --threads 512" "ht264 --mode ht --ctas 264"; do
    set -- $a; name=$1; shift
    case $name in ht*) set -- --tokens 4096 "$@";; *) set -- --tokens 128 "$@";; esac
    left=$(( 585 - ($(date +%s) - t0) ))
    [ $left -lt 15 ] && { echo "!! no time left for moe_bench $name"; status=1; continue; }
    echo; echo "== moe_bench $name: $*"
    DEVCOMM_RUNTIME=cuda timeout $((left < 60 ? left : 60)) $R $D/bin/moe_bench --nccl --stages "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log || { echo "!! moe_bench $name failed"; status=1; }
done
date -u
echo "moe_occupancy: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
