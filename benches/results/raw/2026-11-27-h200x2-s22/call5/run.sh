#!/usr/bin/env bash
# Session 22, call 5 (issue 16): call 3's build without the fence word
# (its every_call tests hung; events again), keeping the submitter's
# driver calls outside the in-flight lock. Every tests/p2p case alone
# (timeouts of their own), the example, then p2p_bench 1-64 KiB old
# (main f4f200a) and new, alternating, NCCL beside the new; 1-256 MiB new.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b22q.tar.xz q
D=$B/q
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
for t in endpoint_dropped_mid_stream_over_shared_memory endpoints_in_one_process_with_host_memory \
    every_call_between_processes_over_tcp every_call_between_processes_same_host_ipc \
    every_call_between_processes_same_host_ipc_with_tcp_control; do
    step env DEVCOMM_RUNTIME=cuda timeout 40 $D/tests/p2p --exact $t --test-threads=1
done
step env DEVCOMM_RUNTIME=cuda timeout 120 $D/tests/p2p --test-threads=1 --skip endpoint_dropped --skip endpoints_in_one --skip every_call
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/p2p
run() {
    local name=$1; shift
    local left=$(( 400 - ($(date +%s) - t0) ))
    [ $left -lt 20 ] && { echo "!! no time left for $name"; status=1; return; }
    echo; echo "== $name: $*"
    timeout $((left < 90 ? left : 90)) env DEVCOMM_RUNTIME=cuda "$@" > $OUT/logs/$name.log 2>&1 || { echo "!! $name failed"; status=1; }
    cat $OUT/logs/$name.log
}
S="--min-bytes 1024 --max-bytes 65536 --factor 2"
run old_1 $D/bin/p2p_bench_old $S
run new_1 $D/bin/p2p_bench --nccl $S
run old_2 $D/bin/p2p_bench_old $S
run new_2 $D/bin/p2p_bench $S
run large_new $D/bin/p2p_bench --nccl --min-bytes 1048576 --max-bytes 268435456 --factor 16
date -u
echo "call5: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
