#!/usr/bin/env bash
# The MoE low-latency variants of the library's kernels, measured against
# each other in one call (one JIT): `moe_variants.sh BUNDLE DIR`, e.g.
# `moe_variants.sh b22a.tar.xz a`. The bundle holds bin/{devcomm-run,
# devcomm_perf, moe_bench, moe} and tests/moe (see docs/gpu.md). Steps:
# registers and stack of the MoE kernels (`ptxas -v`, seconds), the JIT
# alone (no job limit, lesson 19), the moe tests and the example, then
# moe_bench at 128 tokens × 7168 bf16, top-8 of 256, with stages and the
# NCCL path: the default (per-expert pack, per-rank combine), each
# variant (`--token-major-pack`, `--combine-per-expert`, both); fp8 with
# both packs; the high-throughput mode at 4096 tokens.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" "$2"
W=$2
D=$B/$W
exec > >(tee "$OUT/logs/moe_variants.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
ptxas_report moe_dispatch moe_combine_bf16 moe_ht_combine_bf16
WARM_TIMEOUT=480 warm_jit "$2"
wait_jit "$2"
moe_tests "$W"
step env DEVCOMM_RUNTIME=cuda timeout 30 $D/bin/moe
for a in "default" "tokenmajor --token-major-pack" "combine --combine-per-expert" \
    "both --token-major-pack --combine-per-expert" "fp8 --fp8" "fp8tm --fp8 --token-major-pack" "ht --mode ht --tokens 4096"; do
    set -- $a; name=$1; shift
    [ "$name" = ht ] || set -- --tokens 128 "$@"
    moe_bench_run "$W" "$name" "$@"
done
date -u
echo "moe_variants: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
