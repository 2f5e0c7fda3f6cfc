# Sourced by the GPU run scripts: the device machine's rules (NVLink
# multicast off), the bundle and log locations, and a `step` that runs a
# command, echoes it, and records failure in $status.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=.device
# A bundle over 64 MiB travels packed (`cargo xtask bundle` packs it).
if [ -f "$B/bundle.tar.xz" ] && [ ! -d "$B/tests" ]; then
    tar -xJf "$B/bundle.tar.xz" -C "$B"
fi
OUT=${OUT:-/tmp/devcomm-out}
mkdir -p "$OUT"
status=0
step() { echo; echo "== $*"; "$@" || { echo "!! FAILED ($?): $*"; status=1; }; }
# The driver's PTX JIT takes minutes on a fresh machine. Its cache comes
# back from one call as $OUT/jitcache.tar.xz (`save_jitcache`) and goes to
# the next as .device/jitcache.tar.xz (carried), unpacked here.
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/jitcache} CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-2147483648}
if [ -f "$B/jitcache.tar.xz" ] && [ ! -d "$CUDA_CACHE_PATH" ]; then
    mkdir -p "$CUDA_CACHE_PATH" && tar -xJf "$B/jitcache.tar.xz" -C "$CUDA_CACHE_PATH"
    echo "JIT cache: $(du -sh "$CUDA_CACHE_PATH" | cut -f1) from $B/jitcache.tar.xz"
fi
# xz on every core at level 1: `tar -cJ` compresses on one core at level 6,
# slow for two builds' cache (~100 MB) in a 10-minute call.
save_jitcache() { [ -d "$CUDA_CACHE_PATH" ] && tar -c -C "$CUDA_CACHE_PATH" . | xz -T0 -1 > "$OUT/jitcache.tar.xz" && ls -la "$OUT/jitcache.tar.xz"; }
