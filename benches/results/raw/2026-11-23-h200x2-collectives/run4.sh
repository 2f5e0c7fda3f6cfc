#!/usr/bin/env bash
# Session 7 call 4: every other test binary on CUDA (waits changed), hello, gin_bench.
set -uo pipefail
source benches/gpu/common.sh
export DEVCOMM_TEST_RANKS_PER_GPU=4
summary=$OUT/summary.txt; : > $summary
{
date -u
for t in $B/tests/*; do
  name=$(basename $t)
  case $name in coll-*) continue;; esac
  SECONDS=0
  timeout 240 env DEVCOMM_RUNTIME=cuda "$t" --test-threads=1 > /tmp/t_$name.log 2>&1; rc=$?
  printf '%-26s exit %-3s %4ss skipped-lines %-3s %s\n' "$name" "$rc" "$SECONDS" "$(grep -c skipped /tmp/t_$name.log)" "$(grep -E '^test result' /tmp/t_$name.log | tail -1)" | tee -a $summary
  [ $rc = 0 ] || tail -40 /tmp/t_$name.log > $OUT/fail_$name.log
done
env -u DEVCOMM_TEST_RANKS_PER_GPU $B/examples/hello > $OUT/hello.log 2>&1; echo "hello exit $?"
echo "== gin_bench"; DEVCOMM_RUNTIME=cuda timeout 200 $B/bin/devcomm-run -n 2 $B/bin/gin_bench > $OUT/gin_bench.log 2>&1; echo "exit $?"
} 2>&1 | tee $OUT/run4.log
