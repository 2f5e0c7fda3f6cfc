#!/usr/bin/env bash
# Session 27, call 2 (call 1's bundles, plus .device/s27b.tar.xz: the image
# of main's test kernels, which main's in-kernel all-reduce loads; call 1
# lacked it, so main's `--in-kernel` runs sat in the driver's JIT until
# their 60 s timeout): the 2 MiB all-reduce old / n twice more (graphed
# with NCCL; stages and in kernel), then every other test binary of the
# bundle on CUDA (coll, moe and lsa ran in call 1; 4 ranks per GPU at
# most), summary in $OUT/logs/summary.txt.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s27a.tar.xz ab
tar -xJf $B/s27b.tar.xz -C $B/ab
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L; echo "kernel images: $(ls $B/ab/cubin | wc -l)"
R="$B/bin/devcomm-run -n 2"
for round in 1 2; do
    for v in old n; do
        bin=$B/bin/devcomm_perf; [ $v = old ] && bin=$B/ab/bin/devcomm_perf_old
        echo; echo "== $v round $round: graphed with NCCL"
        DEVCOMM_RUNTIME=cuda timeout 90 $R $bin -o all_reduce -b 512K -e 2M -f 4 -n 200 --reps 7 --graph --nccl 2>&1 | tee $OUT/logs/perf_${v}_$round.log
        echo; echo "== $v round $round: stages, in kernel"
        DEVCOMM_RUNTIME=cuda timeout 60 $R $bin -o all_reduce -b 2M -e 2M -n 200 --reps 7 --graph --in-kernel --stages 2>&1 | tee $OUT/logs/stages_${v}_$round.log
    done
done
date -u +%T
export DEVCOMM_TEST_RANKS_PER_GPU=4
summary=$OUT/logs/summary.txt; : > $summary
for t in $B/tests/*; do
    name=$(basename $t)
    case $name in coll-*|moe-*|lsa-*) continue;; esac
    log=$OUT/logs/t_$name.log
    echo; echo "== $name ($(date -u +%T))"
    timeout 200 env DEVCOMM_RUNTIME=cuda $t --test-threads=1 > $log 2>&1; rc=$?
    tail -3 $log
    printf '%-40s exit %-3s skipped-lines %-3s %s\n' $name $rc "$(grep -c skipped $log)" "$(grep -E '^test result' $log | tail -1)" >> $summary
    [ $rc = 0 ] || { echo "!! FAILED ($rc): $name"; status=1; }
done
step env -u DEVCOMM_TEST_RANKS_PER_GPU $B/examples/hello
echo; cat $summary
date -u
echo "call2: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs && find $OUT/logs -name "*.log" ! -name call2.log -delete
exit $status
