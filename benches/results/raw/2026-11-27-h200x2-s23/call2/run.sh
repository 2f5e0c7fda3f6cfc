#!/usr/bin/env bash
# Session 23 call 2: the plain-CUDA MoE LL dispatch floor (benches/gpu/moe_floor.cu)
# beside main's moe_bench (LL 128 tokens, NCCL path and stages) in the same call.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b23b.tar.xz b
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
# The library's JIT happens in moe_bench's first run (both ranks), in the background.
(DEVCOMM_RUNTIME=cuda timeout 420 $B/b/bin/devcomm-run -n 2 $B/b/bin/moe_bench --nccl --stages --tokens 128 > $OUT/logs/moe_bench_jit.log 2>&1; echo "moe_bench (JIT run): rc $? at $(date -u +%T)" >> $OUT/logs/moe_bench_jit.log) &
P=$!
step nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o /tmp/moe_floor benches/gpu/moe_floor.cu
step timeout 120 /tmp/moe_floor
wait $P; tail -6 $OUT/logs/moe_bench_jit.log
save_jitcache
echo "== moe_floor, idle machine"; timeout 120 /tmp/moe_floor | tee $OUT/logs/moe_floor.log || status=1
moe_bench_run b ll --tokens 128
moe_bench_run b ll2 --tokens 128
date -u
echo "call2: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
