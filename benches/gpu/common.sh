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
# xz on every core (`tar -cJ` compresses on one core), at level 6: two
# builds' cache at level 1 (19 MB) was over the 16 MiB a returned file may have.
save_jitcache() { [ -d "$CUDA_CACHE_PATH" ] && tar -c -C "$CUDA_CACHE_PATH" . | xz -T0 -6 > "$OUT/jitcache.tar.xz" && ls -la "$OUT/jitcache.tar.xz"; }
# Unpacks bundle `$B/NAME` into `$B/DIR` and makes `$OUT/logs`:
# `unpack_bundle b19a.tar.xz a`. A bundle's `cubin/` (images of its
# builds' PTX, `cargo xtask cubin`, named by the PTX's hash: an A/B
# bundle holds both builds') becomes DEVCOMM_CUBIN_DIR: no JIT at all
# (session 24: a fresh machine ran moe_bench 4 s after the start, where
# the JIT took 343 s).
unpack_bundle() {
    mkdir -p "$B/$2" "$OUT/logs" && tar -xJf "$B/$1" -C "$B/$2" || return 1
    if [ -d "$B/$2/cubin" ]; then
        export DEVCOMM_CUBIN_DIR="$PWD/$B/$2/cubin"
        echo "kernel images: $(ls "$B/$2/cubin" | wc -l) in $DEVCOMM_CUBIN_DIR"
    fi
}
# Starts the driver's JIT of the library and test kernels in the
# background (a one-rank in-kernel all-reduce loads both modules) from the
# unpacked bundle DIR: `warm_jit DIR`; its log is `$OUT/logs/warm_DIR.log`.
# Run work that needs no kernels meanwhile, then `wait_jit DIR`: it waits
# for that process only (never a bare `wait` under `exec > >(tee ...)`)
# and saves the JIT cache for the next call of the same PTX, always: a
# call that did not cost the next one 4.5 minutes (session 19).
warm_jit() {
    (DEVCOMM_RUNTIME=cuda timeout "${WARM_TIMEOUT:-420}" "$B/$1/bin/devcomm-run" -n 1 "$B/$1/bin/devcomm_perf" \
        -o all_reduce -b 8 -e 8 -n 1 -w 1 --reps 1 --in-kernel > "$OUT/logs/warm_$1.log" 2>&1
     echo "warm $1: rc $? at $(date -u +%T)" >> "$OUT/logs/warm_$1.log") &
    WARM_PID=$!
}
wait_jit() { wait "$WARM_PID"; tail -1 "$OUT/logs/warm_$1.log"; save_jitcache; }
# Every `moe` test from the unpacked bundle DIR, after the JIT, on GPUS
# GPUs: 2 by default (1-2 ranks one per GPU, 3-4 two per GPU, 8 four per
# GPU), or 1 (2, 4 and 8 ranks on the one GPU: separate processes that
# time-slice, so correctness only, with longer limits): `moe_tests DIR
# [GPUS]`; `moe_tests_one_gpu DIR` is `moe_tests DIR 1`.
moe_tests() {
    local per=$(( 2 / ${2:-2} )) t=60 t8=40
    [ "${2:-2}" = 1 ] && t=200 t8=240
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=$per timeout $t $B/$1/tests/moe --exact moe_1_rank moe_2_ranks moe_gin_2_ranks --test-threads=1
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=$((2 * per)) timeout $t $B/$1/tests/moe --exact moe_3_ranks moe_4_ranks moe_gin_3_ranks moe_lsa_and_gin_4_ranks --test-threads=1
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=$((4 * per)) timeout $t8 $B/$1/tests/moe --exact moe_8_ranks --test-threads=1
}
moe_tests_one_gpu() { moe_tests "$1" 1; }
# Nsight Compute of one launch of library kernel NAME in a one-rank
# `moe_bench` of bundle DIR (lesson 33: kernel replay is safe with no
# peer waiting): `ncu_stalls DIR NAME [MOE_BENCH ARGS...]`. Writes
# $OUT/logs/ncu_NAME.txt, the per-instruction warp-stall summary
# $OUT/logs/stalls_NAME.txt, and $OUT/src_NAME.csv.xz (the samples).
ncu_stalls() {
    local dir=$1 name=$2; shift 2
    DEVCOMM_RUNTIME=cuda timeout 150 ncu --clock-control none --target-processes all -k regex:"^$name\$" --launch-skip 6 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
        -o "$OUT/$name" -f $B/$dir/bin/devcomm-run -n 1 $B/$dir/bin/moe_bench --tokens 128 -n 4 -w 2 --reps 1 "$@" > /tmp/ncu_run_$name.log 2>&1
    echo "ncu $name rc $?"
    ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/logs/ncu_$name.txt" 2>&1
    grep -E "Duration|Issued Warp|No Eligible|Registers" "$OUT/logs/ncu_$name.txt"
    ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > /tmp/src_$name.csv 2>&1
    python3 benches/results/raw/2026-11-29-s32/call4g/stalls.py /tmp/src_$name.csv > "$OUT/logs/stalls_$name.txt"
    head -3 "$OUT/logs/stalls_$name.txt"
    xz -T0 -6 < /tmp/src_$name.csv > "$OUT/src_$name.csv.xz"
    rm -f "$OUT/$name.ncu-rep"
}
# A call returns at most 8 files: `pack_logs` last tars $OUT/logs into
# $OUT/logs.tar.
pack_logs() { tar -C "$OUT" -cf "$OUT/logs.tar" logs && rm -rf "$OUT/logs"; }
# `moe_bench` on 2 ranks with the NCCL path and stages, from bundle DIR,
# its log in $OUT/logs/moe_bench_NAME.log, while the call (started at $t0)
# has time left before 585 s (or $CALL_LIMIT): `moe_bench_run DIR NAME ARGS...`; another
# build's binary of the bundle with `MOE_BENCH=moe_bench_old moe_bench_run ...`.
# On one GPU, `MOE_RANKS=1 moe_bench_run ...`: one rank (EP1), without
# NCCL (one rank has no link to compare).
moe_bench_run() {
    local dir=$1 name=$2 bin=${MOE_BENCH:-moe_bench} ranks=${MOE_RANKS:-2}; shift 2
    local left=$(( ${CALL_LIMIT:-585} - ($(date +%s) - t0) )) nccl=--nccl
    [ $left -lt 15 ] && { echo "!! no time left for $bin $name"; status=1; return; }
    [ "$ranks" = 1 ] && nccl=
    echo; echo "== $bin $name ($ranks rank(s)): $*"
    DEVCOMM_RUNTIME=cuda timeout $((left < 60 ? left : 60)) $B/$dir/bin/devcomm-run -n "$ranks" $B/$dir/bin/$bin $nccl --stages "$@" 2>&1 \
        | tee $OUT/logs/moe_bench_$name.log || { echo "!! moe_bench $name failed"; status=1; }
}
# Registers, stack and spills of library kernels as ptxas compiles them
# for sm_90 (seconds a kernel, no JIT): `ptxas_report KERNEL...`.
ptxas_report() {
    local k
    for k in "$@"; do
        echo "$k: $(ptxas -arch=sm_90 -O3 --entry $k -v host/ptx/devcomm_kernels.sm_90.ptx -o /tmp/$k.cubin 2>&1 \
            | grep -E "Used|spill" | head -2 | tr '\n' ' ')"
    done
}
