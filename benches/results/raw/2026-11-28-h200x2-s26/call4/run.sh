#!/usr/bin/env bash
# Session 26, call 4: build c (call 3's bundle .device/s26c.tar.xz), the
# graphed all-reduce with smaller staging areas (`--stage-bytes`): with the
# default 32 MiB each of the 128 parts pushes its 16 KiB of a 2 MiB
# all-reduce 256 KiB apart from the next part's, over 16 pages of 2 MiB of
# the peer's window; the plain floor pushes into one contiguous 2 MiB.
# Whether the spread costs the meet (devcomm's sent -> synced 8.0 us, the
# floor's 7.4). Then the whole sweep to 128 MiB with the default and with
# the best smaller staging, NCCL beside.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s26c.tar.xz c
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
R="$B/c/bin/devcomm-run -n 2"
for round in 1 2; do
    for sb in default 4M 8M 16M; do
        opt=""; [ $sb != default ] && opt="--stage-bytes $sb"
        echo; echo "== stage $sb round $round"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $B/c/bin/devcomm_perf -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph $opt 2>&1 | grep -v "^\[rank 1\]"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $B/c/bin/devcomm_perf -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --stages $opt 2>&1 | grep "stages rank"
    done
done
date -u +%T
for sb in default 4M; do
    opt=""; [ $sb != default ] && opt="--stage-bytes $sb"
    echo; echo "== sweep, stage $sb"
    DEVCOMM_RUNTIME=cuda timeout 120 $R $B/c/bin/devcomm_perf -o all_reduce -b 8 -e 128M -f 4 -n 50 --reps 5 --graph --nccl $opt 2>&1 | grep -v "^\[rank 1\]"
done
date -u
echo "call4: overall status $status"
exit $status
