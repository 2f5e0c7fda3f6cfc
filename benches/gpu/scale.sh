#!/usr/bin/env bash
# The scale run (issue 17) on one host with 4 or 8 GPUs, from the repository
# root after `cargo xtask bundle`:
#   run(kind: nvidia-h200-x4, carry: [".device"], command: "SCALE_PHASE=tests bash benches/gpu/scale.sh")
#   run(kind: nvidia-h200-x4, carry: [".device"], command: "SCALE_PHASE=bench bash benches/gpu/scale.sh")
#
# SCALE_PHASE=tests: the topology, then every test binary of the bundle on
#   CUDA, one rank per GPU where the GPUs suffice (rank r on GPU r % gpus; at
#   most DEVCOMM_TEST_RANKS_PER_GPU=2, so 8-rank cases on 4 GPUs share them).
#   A binary is not started once SCALE_DEADLINE seconds (default 540) have
#   passed, nor run past SCALE_HARD (575, inside a device call's 600 s); the
#   summary names it "not run", and a later call runs only those
#   with SCALE_TESTS="name ..." (binary names without their hash).
# SCALE_PHASE=bench: lsa_bench, gin_bench, devcomm_perf (every collective,
#   NCCL beside it) and moe_bench (NCCL path beside it), at 2 ranks and at
#   every GPU (4 or 8), one rank per GPU; then the collectives over LSA teams
#   of 2 (DEVCOMM_LSA_SIZE=2, GIN between the teams), flat and hierarchical.
# Logs in $OUT: scale_<phase>.log, summary.txt, logs_<phase>.tgz (per run).
set -uo pipefail
source "$(dirname "$0")/common.sh"

export DEVCOMM_TEST_RANKS_PER_GPU=${DEVCOMM_TEST_RANKS_PER_GPU:-2}
PHASE=${SCALE_PHASE:-tests}
DEADLINE=${SCALE_DEADLINE:-540}
# No test binary runs past this (the device call's own limit is 600 s).
HARD=${SCALE_HARD:-575}
LOGS=/tmp/scale-logs
mkdir -p "$LOGS"
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
summary=$OUT/summary.txt
touch "$summary"
SECONDS=0

# One test binary on CUDA: its log, exit status, time and result line.
test_binary() {
    local t=$1 name short rc result skipped took
    name=$(basename "$t")
    short=${name%-*}
    if [ -n "${SCALE_TESTS:-}" ] && ! [[ " $SCALE_TESTS " == *" $short "* ]]; then
        return
    fi
    if [ "$SECONDS" -ge "$DEADLINE" ]; then
        printf '%-22s not run (deadline %ss reached)\n' "$short" "$DEADLINE" >>"$summary"
        return
    fi
    echo "== $name ($(date -u +%T))"
    local start=$SECONDS limit=$((HARD - SECONDS))
    [ "$limit" -gt "${SCALE_TEST_TIMEOUT:-420}" ] && limit=${SCALE_TEST_TIMEOUT:-420}
    timeout "$limit" env DEVCOMM_RUNTIME=cuda "$t" --test-threads=1 >"$LOGS/t_$short.log" 2>&1
    rc=$?
    took=$((SECONDS - start))
    result=$(grep -E '^test result' "$LOGS/t_$short.log" | tail -n 1)
    skipped=$(grep -ci 'skipped' "$LOGS/t_$short.log")
    printf '%-22s exit %-3s %4ss skipped-lines %-3s %s\n' "$short" "$rc" "$took" "$skipped" "$result" >>"$summary"
    [ "$rc" = 0 ] || { echo "!! FAILED ($rc): $name"; grep -E 'FAILED|panicked|^failures' "$LOGS/t_$short.log" | head -20; status=1; }
}

# One benchmark: `bench NAME RANKS PROGRAM ARGS...` (variables for the ranks in $BENCH_ENV).
bench() {
    local name=$1 n=$2 prog=$3
    shift 3
    echo "== $name: -n $n $prog $* ($(date -u +%T))"
    local start=$SECONDS
    timeout "${SCALE_BENCH_TIMEOUT:-200}" env DEVCOMM_RUNTIME=cuda ${BENCH_ENV:-} $B/bin/devcomm-run -n "$n" $B/bin/$prog "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    echo "   exit $rc $((SECONDS - start))s"
    printf '%-28s exit %-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >>"$summary"
    [ "$rc" = 0 ] || { tail -n 20 "$LOGS/$name.log"; status=1; }
}

exec > >(tee "$OUT/scale_$PHASE.log") 2>&1
date -u
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
echo "phase $PHASE, $GPUS GPUs, deadline ${DEADLINE}s, DEVCOMM_TEST_RANKS_PER_GPU=$DEVCOMM_TEST_RANKS_PER_GPU"
case $PHASE in
tests)
    nvidia-smi topo -m
    echo "bundle PTX: $(head -n 5 $B/devcomm_kernels.ptx | grep -E 'inputs' | tr '\n' ' ')"
    # The collectives and MoE first (the most cases with 4 and 8 ranks).
    for t in $B/tests/coll-* $B/tests/moe-* $B/tests/gin-* $B/tests/lsa-* $B/tests/sendrecv-* $B/tests/route-*; do
        test_binary "$t"
    done
    for t in $B/tests/*; do
        case $(basename "$t") in coll-* | moe-* | gin-* | lsa-* | sendrecv-* | route-*) ;; *) test_binary "$t" ;; esac
    done
    ;;
bench)
    P=$(( GPUS >= 8 ? 8 : 4 ))
    for n in 2 $P; do
        bench lsa_$n $n lsa_bench
    done
    for n in 2 $P; do
        bench gin_$n $n gin_bench
    done
    for n in 2 $P; do
        bench ar_$n $n devcomm_perf --nccl -o all_reduce -b 8 -e 128M -f 4 --in-kernel --floor
    done
    for op in reduce_scatter all_gather all_to_all broadcast reduce sendrecv; do
        bench ${op}_$P $P devcomm_perf --nccl -o $op -b 8 -e 128M -f 4
    done
    bench ar_${P}_again $P devcomm_perf --nccl -o all_reduce -b 8 -e 128M -f 4
    for k in "ll --tokens 128" "ll_fp8 --tokens 128 --fp8" "ht --mode ht --tokens 4096"; do
        set -- $k
        name=$1
        shift
        bench moe_${name}_$P $P moe_bench --nccl "$@"
    done
    for mode in flat hier; do
        BENCH_ENV=DEVCOMM_LSA_SIZE=2 bench ar_teams2_${P}_$mode $P devcomm_perf -o all_reduce -b 8 -e 128M -f 4 \
            --multi-team $mode
    done
    ;;
*)
    echo "SCALE_PHASE must be tests or bench"
    exit 2
    ;;
esac
echo
echo "== summary ($SECONDS s)"
cat "$summary"
echo "scale ($PHASE): overall status $status"
(cd "$LOGS" && tar czf "$OUT/logs_$PHASE.tgz" ./*.log)
exit $status
