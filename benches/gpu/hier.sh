#!/usr/bin/env bash
# Collectives over several LSA teams on one GPU: the multi-team cases of the
# coll test binary on CUDA (2 teams of 2 flat / hierarchical / over TCP, 2
# teams of 3, 4 teams of 2, one-rank teams, the GIN-bytes check), then
# devcomm-perf with 4 ranks as 2 LSA teams of 2 (DEVCOMM_LSA_SIZE=2; GIN over
# the copy engine between the teams), flat and hierarchical, per operation.
# From the repository root after `cargo xtask bundle`:
#   run(kind: nvidia-h100-x1, carry: [".device"], command: "bash benches/gpu/hier.sh")
# HIER_PERF_MAX (default 64M) bounds the benchmark's sizes; HIER_TESTS=0 skips the tests.
# Logs: $OUT/hier.log, $OUT/hier_perf_<op>_<flat|hier>.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
exec > >(tee "$OUT/hier.log") 2>&1
date -u
nvidia-smi --query-gpu=index,name,driver_version --format=csv
if [ "${HIER_TESTS:-1}" != 0 ]; then
    coll=$(ls $B/tests/coll-* | head -n 1)
    for t in coll_hierarchical_moves_fewer_gin_bytes coll_4_ranks_in_two_lsa_teams coll_6_ranks_in_two_lsa_teams_of_3_hierarchical \
        coll_8_ranks_in_four_lsa_teams_hierarchical coll_3_ranks_over_gin_tcp; do
        # (a name filter: coll_4_ranks_in_two_lsa_teams also runs its _hierarchical variants)
        step env DEVCOMM_RUNTIME=cuda timeout 600 "$coll" --test-threads=1 "$t"
    done
fi
for op in all_reduce reduce_scatter all_gather broadcast reduce; do
    for mode in flat hier; do
        echo; echo "== devcomm_perf $op, 2 LSA teams of 2, $mode"
        DEVCOMM_RUNTIME=cuda DEVCOMM_LSA_SIZE=2 timeout 300 $B/bin/devcomm-run -n 4 $B/bin/devcomm_perf -o $op \
            -b 8 -e "${HIER_PERF_MAX:-64M}" -f 4 -n 10 -w 3 --reps 3 --multi-team $mode 2>&1 \
            | tee "$OUT/hier_perf_${op}_${mode}.log" || { echo "!! devcomm_perf $op $mode failed"; status=1; }
    done
done
exit $status
