#!/usr/bin/env bash
# Session 24, call 7: `DEVCOMM_CUBIN_DIR` on a fresh machine with no JIT
# cache — the library module loaded from `cargo xtask cubin`'s image
# (ptxas 12.9 on the build machine) instead of the driver compiling the
# PTX (343 s in call 4). moe_bench HT and LL: started in seconds, 0 wrong,
# times as calls 4-5. Bundle .device/b24g.tar.xz (bin/moe_bench built with
# the lookup, bin/devcomm-run) and cubin/ (the library image).
set -uo pipefail
source benches/gpu/common.sh
export CALL_LIMIT=150
unpack_bundle b24g.tar.xz c
exec > >(tee "$OUT/logs/call7.log") 2>&1
date -u; nvidia-smi -L
ls -la $B/c/cubin; ls $CUDA_CACHE_PATH 2>/dev/null | head -2 || echo "no JIT cache"
export DEVCOMM_CUBIN_DIR=$PWD/$B/c/cubin DEVCOMM_LOG=info
t0=$(date +%s)
moe_bench_run c ht --mode ht --tokens 4096
echo "ht run ended $(( $(date +%s) - t0 )) s after the start"
moe_bench_run c ll --tokens 128
echo "both ended $(( $(date +%s) - t0 )) s after the start"
date -u
echo "call7: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
