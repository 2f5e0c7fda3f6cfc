#!/usr/bin/env bash
# Collectives on 2 GPUs, CUDA graphs among them. Modes:
#   tests   the coll test binary (2 ranks per GPU up to 4 ranks, 4 per GPU
#           for 6 and 8) and sendrecv;
#   perf    small all-reduces, broadcasts and reduces with and without
#           graphs, NCCL beside them in the same run (graphed alike);
#   final   after a change of the device code: the coop test, the coll
#           cases up to 4 ranks in one team, then perf's timings, LL against
#           direct for broadcast and reduce, a trace and the probe;
#   verify  the coll cases `final` leaves out, and sendrecv (next call,
#           JIT cache carried);
#   diag    where a graphed small all-reduce's time goes;
#   large   512 KiB to 128 MiB: all-reduce (in kernel too), all-gather,
#           reduce-scatter and all-to-all, NCCL beside them (not graphed);
#   ctas    graphed 1-4 MiB all-reduces with fewer CTAs (max_ctas,
#           bytes_per_cta): issue 14's 2 MiB goal (13.5 us on 128 CTAs,
#           9.4 in kernel; is the rest the launch of 128 CTAs?).
# Bundle: .device/{tests,bin} (coll, runtime, sendrecv, devcomm_perf,
# devcomm-run), or .device/small*.tar.xz unpacked into it.
set -uo pipefail
source benches/gpu/common.sh
if [ ! -d $B/tests ]; then for t in $B/small*.tar.xz; do tar -xJf $t -C $B; done; fi
what=${1:-tests}
exec > >(tee $OUT/graph-$what.log) 2>&1
date -u; nvidia-smi -L
echo "PTX: $(grep -a -m1 -o 'inputs: sha256:[0-9a-f]*' $B/tests/coll-*)"
if [ "$what" = verify ]; then
    # The coll cases `final` leaves out (several LSA teams, GIN, the
    # checking mode at 2 ranks per GPU; 6 and 8 ranks at 4 per GPU) and
    # sendrecv: run after `final` on the same device code, the JIT cache
    # carried (.device/jitcache.tar.xz) or the first step has the time.
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 300 $B/tests/coll-* --test-threads=1 teams gin mismatched --skip 4_teams --skip coll_6 --skip coll_8
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 240 $B/tests/coll-* --test-threads=1 coll_8_ranks coll_6_ranks coll_hierarchical_moves_fewer_gin_bytes_4_teams
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 60 $B/tests/sendrecv-* --test-threads=1
fi
if [ "$what" = tests ]; then
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 400 $B/tests/coll-* --test-threads=1 --skip coll_8_ranks --skip coll_6_ranks --skip coll_8_ranks_in_four --skip coll_hierarchical_moves_fewer_gin_bytes_4_teams
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 200 $B/tests/coll-* --test-threads=1 coll_8_ranks coll_6_ranks coll_hierarchical_moves_fewer_gin_bytes_4_teams
    step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=4 timeout 120 $B/tests/sendrecv-* --test-threads=1
elif [ "$what" = perf ]; then
    # ITERS calls per repetition (default 200: a host-side skew of the
    # ranks' first launches of 50 us adds 0.25 us per call, not 2.5 as
    # with 20).
    n=${ITERS:-200}
    P="timeout 150 $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
    for g in --graph ""; do
        step env DEVCOMM_RUNTIME=cuda $P -o all_reduce -b 8 -e 2M -f 4 -n $n --reps 7 --nccl --floor --in-kernel $g
        step env DEVCOMM_RUNTIME=cuda $P -o broadcast -b 8 -e 64K -f 8 -n $n --reps 7 --nccl --floor $g
        step env DEVCOMM_RUNTIME=cuda $P -o reduce -b 8 -e 64K -f 8 -n $n --reps 7 --nccl --floor $g
    done
    for a in ll one_shot; do
        step env DEVCOMM_RUNTIME=cuda $P -o all_reduce -b 8 -e 8 -n $n --reps 7 --algorithm $a --graph
        step env DEVCOMM_RUNTIME=cuda $P -o broadcast -b 8 -e 8 -n $n --reps 7 --algorithm $a --graph
        step env DEVCOMM_RUNTIME=cuda $P -o reduce -b 8 -e 8 -n $n --reps 7 --algorithm $a --graph
    done
    step env DEVCOMM_RUNTIME=cuda $P -o all_reduce -b 8 -e 8 --trace 40 --trace-only --algorithm ll
    step env DEVCOMM_RUNTIME=cuda $P -o all_gather -b 8 -e 8 --trace 40 --trace-only
elif [ "$what" = final ]; then
    # After a change of the device code: the coop test, the coll cases up
    # to 4 ranks (LL all-reduce numbered on the device, LL broadcast/reduce,
    # graphs), then the small sizes graphed and not, NCCL beside them. The
    # first step compiles the PTX on a fresh machine (its parent loads the
    # library's and the test kernels' modules: 211 s in session 15; the
    # runtime binary's every_thread loads only the test kernels'): 420 s.
    if [ -z "${SKIP_TESTS:-}" ]; then
        step env DEVCOMM_RUNTIME=cuda timeout 420 $B/tests/coll-* --test-threads=1 coll_1_rank
        save_jitcache
        step env DEVCOMM_RUNTIME=cuda timeout 60 $B/tests/runtime-* --test-threads=1 every_thread
        step env DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=2 timeout 200 $B/tests/coll-* --test-threads=1 coll_2_ranks coll_3_ranks coll_4_ranks --skip teams --skip gin
    fi
    P="$B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
    for g in --graph ""; do
        step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 8 -e 2M -f 4 -n 200 --reps 7 --nccl --floor --in-kernel $g
        step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o broadcast -b 8 -e 64K -f 8 -n 200 --reps 7 --nccl $g
        step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o reduce -b 8 -e 64K -f 8 -n 200 --reps 7 --nccl $g
    done
    for a in ll one_shot; do
        for o in all_reduce broadcast reduce; do
            step env DEVCOMM_RUNTIME=cuda timeout 30 $P -o $o -b 8 -e 8 -n 200 --reps 7 --algorithm $a --graph
        done
    done
    # Where LL stops paying for broadcast and reduce (Auto's threshold).
    for a in ll one_shot; do
        for o in broadcast reduce; do
            step env DEVCOMM_RUNTIME=cuda timeout 30 $P -o $o -b 8 -e 16K -f 4 -n 200 --reps 5 --algorithm $a --graph
        done
    done
    step env DEVCOMM_RUNTIME=cuda timeout 30 $P -o all_reduce -b 8 -e 8 --trace 40 --trace-only --algorithm ll --graph
    # What each piece of a collective kernel costs a graphed launch.
    step env DEVCOMM_RUNTIME=cuda timeout 60 $P --probe --graph -n 200 --reps 7
elif [ "$what" = large ]; then
    P="$B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
    step env DEVCOMM_RUNTIME=cuda timeout 120 $P -o all_reduce -b 512K -e 128M -f 4 -n 20 --reps 5 --nccl --in-kernel
    step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 512K -e 8M -f 2 -n 200 --reps 7 --nccl --graph
    for o in all_gather reduce_scatter all_to_all; do
        step env DEVCOMM_RUNTIME=cuda timeout 90 $P -o $o -b 8M -e 128M -f 16 -n 20 --reps 5 --nccl
    done
elif [ "$what" = ctas ]; then
    P="$B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
    step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --nccl --in-kernel --graph
    for c in 32 64 96; do
        step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --in-kernel --graph --max-ctas $c
    done
    for b in 32K 64K; do
        step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --in-kernel --graph --bytes-per-cta $b
    done
    step env DEVCOMM_RUNTIME=cuda timeout 40 $P -o all_reduce -b 1M -e 4M -f 2 -n 200 --reps 7 --graph --no-cooperative
elif [ "$what" = diag ]; then
    # Where a graphed small all-reduce's time goes: the headline sizes
    # (graphed, NCCL graphed beside), then the traced all-reduce kernel
    # (the same device code, stamped) launched as one graph, with the
    # host's and the device's sequence numbers; then nsys, when there.
    P="$B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
    # The first run JITs the PTX (minutes on a fresh machine).
    step env DEVCOMM_RUNTIME=cuda timeout 400 $P -o all_reduce -b 8 -e 8 -n 5 --reps 1 --in-kernel --floor --nccl
    step env DEVCOMM_RUNTIME=cuda timeout 120 $P -o all_reduce -b 8 -e 2M -f 4 -n 200 --reps 7 --nccl --floor --in-kernel --graph
    step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o broadcast -b 8 -e 64K -f 8 -n 200 --reps 7 --nccl --floor --graph
    step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o reduce -b 8 -e 64K -f 8 -n 200 --reps 7 --nccl --graph
    for ds in "" --device-seq; do
        step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_reduce -b 8 -e 8 --trace 40 --trace-only --algorithm ll --graph $ds
    done
    step env DEVCOMM_RUNTIME=cuda timeout 60 $P -o all_gather -b 8 -e 8 --trace 40 --trace-only --graph
    NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
    echo "nsys: ${NSYS:-none}"
    if [ -n "$NSYS" ]; then
        step env DEVCOMM_RUNTIME=cuda timeout 120 $NSYS profile -o /tmp/ar --force-overwrite true --trace cuda $P -o all_reduce -b 8 -e 8 -n 100 --reps 2 --graph
        step timeout 60 $NSYS stats -q -r cuda_gpu_kern_sum -f csv /tmp/ar.nsys-rep
    fi
fi
save_jitcache
echo; echo "graph $what: overall status $status"
