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
