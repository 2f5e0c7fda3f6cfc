#!/usr/bin/env bash
# Session 22, call 3 (issue 16): the P2P engine's copies marked done by a
# stream write of a fence word (host-mapped, read by the progress thread
# without a driver call) instead of an event each, and no lock held across
# the submitter's driver calls. tests/p2p and the example, then p2p_bench
# 1-64 KiB with NCCL: the previous build (p2p_bench_old, main f4f200a), the
# new one, the new one with DEVCOMM_P2P_COPY_DONE=event; twice, alternating;
# then 1 MiB-256 MiB old and new.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b22p.tar.xz p
D=$B/p
exec > >(tee "$OUT/logs/call3.log") 2>&1
date -u; nvidia-smi -L
t0=$(date +%s)
step env DEVCOMM_RUNTIME=cuda timeout 150 $D/tests/p2p --test-threads=1
step env DEVCOMM_RUNTIME=cuda timeout 60 $D/bin/p2p
run() { # name, env..., binary, args
    local name=$1; shift
    local left=$(( 570 - ($(date +%s) - t0) ))
    [ $left -lt 20 ] && { echo "!! no time left for $name"; status=1; return; }
    echo; echo "== $name: $*"
    timeout $((left < 90 ? left : 90)) env DEVCOMM_RUNTIME=cuda "$@" > $OUT/logs/$name.log 2>&1 || { echo "!! $name failed"; status=1; }
    cat $OUT/logs/$name.log
}
S="--min-bytes 1024 --max-bytes 65536 --factor 2"
for i in 1 2; do
    run old_$i $D/bin/p2p_bench_old --nccl $S
    run new_$i $D/bin/p2p_bench --nccl $S
    run event_$i env DEVCOMM_P2P_COPY_DONE=event $D/bin/p2p_bench $S
done
L="--min-bytes 1048576 --max-bytes 268435456 --factor 16"
run large_new $D/bin/p2p_bench --nccl $L
run large_old $D/bin/p2p_bench_old $L
date -u
echo "call3: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
