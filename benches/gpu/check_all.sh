#!/usr/bin/env bash
# Every test binary of the bundle on CUDA, hello as the README runs it and
# through devcomm-run, then (unless CHECK_ALL_BENCH=0) the GIN benchmark.
# From the repository root after `cargo xtask bundle`:
#   run(kind: nvidia-h200-x2, carry: [".device"], command: "bash benches/gpu/check_all.sh")
# Multi-rank cases share the GPUs (rank r on GPU r % gpus); DEVCOMM_TEST_RANKS_PER_GPU caps the ranks per GPU
# (4 here: the 8-rank cases on 2 GPUs).
# Logs: $OUT/check_all.log, $OUT/summary.txt (per binary: exit status, the
# harness's result line, and how many cases said they skipped), $OUT/gin_bench.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
export DEVCOMM_TEST_RANKS_PER_GPU=${DEVCOMM_TEST_RANKS_PER_GPU:-4}
summary=$OUT/summary.txt
: >"$summary"

# Runs one test binary on CUDA and adds its line to the summary.
test_binary() {
    local t=$1 name log rc result skipped
    name=$(basename "$t")
    log=/tmp/check_all_$name.log
    echo; echo "== $name"
    timeout ${CHECK_ALL_TEST_TIMEOUT:-240} env DEVCOMM_RUNTIME=cuda "$t" --test-threads=1 >"$log" 2>&1
    rc=$?
    cat "$log"
    result=$(grep -E '^test result' "$log" | tail -n 1)
    skipped=$(grep -c 'skipped' "$log")
    printf '%-22s exit %-3s skipped-lines %-3s %s\n' "$name" "$rc" "$skipped" "$result" >>"$summary"
    [ "$rc" = 0 ] || { echo "!! FAILED ($rc): $name"; status=1; }
}

exec > >(tee "$OUT/check_all.log") 2>&1
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version --format=csv
    echo "DEVCOMM_ variables set: $(env | grep '^DEVCOMM_' | tr '\n' ' ')"
    echo "bundle PTX: $(head -n 5 $B/devcomm_kernels.ptx | grep -E 'toolchain|inputs' | tr '\n' ' ')"
    echo "bundle test-kernel PTX: $(head -n 5 $B/devcomm_test_kernels.ptx | grep -E 'toolchain|inputs' | tr '\n' ' ')"
    for t in $B/tests/*; do
        test_binary "$t"
    done
    # The README's first command runs this program (it starts its own ranks).
    step env -u DEVCOMM_TEST_RANKS_PER_GPU $B/examples/hello
    step env -u DEVCOMM_TEST_RANKS_PER_GPU DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/examples/hello
    if [ "${CHECK_ALL_BENCH:-1}" != 0 ]; then
        echo; echo "== gin_bench"
        DEVCOMM_RUNTIME=cuda timeout 300 $B/bin/devcomm-run -n 2 $B/bin/gin_bench 2>&1 | tee "$OUT/gin_bench.log" \
            || { echo "!! gin_bench failed"; status=1; }
    fi
    echo; echo "== summary"; cat "$summary"
    echo
    echo "check_all: overall status $status"
}
exit $status
