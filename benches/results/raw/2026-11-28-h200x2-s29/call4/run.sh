#!/usr/bin/env bash
# Session 29, call 4: are the MoE kernels' latency tails instruction
# fetch? Call 3's receives spend ~20 us after their wait on 2 entries of
# routing a thread; the kernels are 110-316 KB of SASS. Nsight Compute's
# warp-stall counters (one pass, no replay: the kernels wait on the peer)
# of the HT per-source dispatch, the in-window combine, the LL dispatch and
# combine, under moe_bench (no NCCL), both ranks profiled.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29b.tar.xz b
exec > >(tee "$OUT/logs/call4.log") 2>&1
date -u; nvidia-smi -L
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; $NCU --version | tail -1
M=smsp__cycles_active.avg,smsp__warps_active.avg.per_cycle_active,smsp__inst_executed.sum
for r in no_instruction long_scoreboard barrier membar sleeping lg_throttle imc_miss branch_resolving wait short_scoreboard mio_throttle drain dispatch_stall misc math_pipe_throttle not_selected selected tex_throttle; do
    M=$M,smsp__warps_issue_stalled_${r}_per_warp_active.pct
done
prof() {
    local name=$1 kern=$2; shift 2
    echo; echo "== ncu $name ($kern): $*"
    DEVCOMM_RUNTIME=cuda timeout 150 $NCU --target-processes all --clock-control none --cache-control none \
        --kernel-name "$kern" --launch-skip 6 --launch-count 1 --metrics "$M" \
        $B/b/bin/devcomm-run -n 2 $B/b/bin/moe_bench -n 4 -w 2 --reps 1 "$@" > $OUT/logs/ncu_$name.log 2>&1
    echo "rc $?"; grep -E "^\s+(smsp|==PROF==|moe_)|moe_|\[rank 0\]  " $OUT/logs/ncu_$name.log | head -60
}
prof ht_disp moe_ht_dispatch_per_source --mode ht --in-window --tokens 4096
prof ht_comb moe_ht_combine_window_bf16 --mode ht --in-window --tokens 4096
prof ll_disp moe_dispatch --tokens 128
prof ll_comb moe_combine_bf16 --tokens 128
date -u
echo "call4: overall status $status"
exit $status
