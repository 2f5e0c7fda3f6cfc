#!/usr/bin/env bash
# Session 7 call 8: waits with 16 acquire polls first: gin_bench, then the test binaries that wait most.
set -uo pipefail
source benches/gpu/common.sh
export DEVCOMM_TEST_RANKS_PER_GPU=4
{
date -u
echo "== gin_bench"; SECONDS=0; DEVCOMM_RUNTIME=cuda timeout 200 $B/bin/devcomm-run -n 2 $B/bin/gin_bench > $OUT/gin_bench.log 2>&1; echo "exit $? ${SECONDS}s"
grep -E "csv,gin_(rate|pingpong)" $OUT/gin_bench.log
for t in gin lsa moe rma sendrecv gin_get coll; do
  f=$(ls $B/tests/$t-* | head -1); SECONDS=0
  timeout 200 env DEVCOMM_RUNTIME=cuda $f --test-threads=1 > /tmp/t_$t.log 2>&1; rc=$?
  echo "$t exit $rc ${SECONDS}s skipped $(grep -c skipped /tmp/t_$t.log) $(grep -E '^test result' /tmp/t_$t.log | tail -1)"
  [ $rc = 0 ] || tail -30 /tmp/t_$t.log > $OUT/fail_$t.log
done
} 2>&1 | tee $OUT/run8.log
