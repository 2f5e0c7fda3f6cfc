#!/usr/bin/env bash
# Session 7 call 2: cooperative vs plain launches of the collectives; GIN bench (relaxed polls + acquire re-read).
set -uo pipefail
source benches/gpu/common.sh
P="timeout 200 env DEVCOMM_RUNTIME=cuda $B/bin/devcomm-run -n 2 $B/bin/devcomm_perf"
run_perf() { name=$1; shift; echo "== $name: $*"; SECONDS=0; $P "$@" > $OUT/perf_$name.log 2>&1; echo "exit $? ${SECONDS}s"; }
{
date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv
for op in all_reduce broadcast all_to_all all_gather reduce_scatter; do
  run_perf ${op}_coop -o $op -b 8 -e 128M -f 4 --nccl
  run_perf ${op}_plain -o $op -b 8 -e 128M -f 4 --nccl --no-cooperative
done
run_perf ar_two_plain -o all_reduce -b 16K -e 128M -f 4 --algorithm two_shot --no-cooperative
echo "== gin_bench"; SECONDS=0
DEVCOMM_RUNTIME=cuda timeout 300 $B/bin/devcomm-run -n 2 $B/bin/gin_bench > $OUT/gin_bench.log 2>&1; echo "exit $? ${SECONDS}s"
} 2>&1 | tee $OUT/run2.log
cd $OUT && tar czf logs.tgz perf_*.log gin_bench.log && rm perf_*.log gin_bench.log
