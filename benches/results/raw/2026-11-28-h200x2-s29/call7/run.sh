#!/usr/bin/env bash
# Session 29, call 7 (diagnostic build e, not committed): is the
# per-source dispatch's receive tail cold code? Build e = d + the same
# receives run a second time in the same launch after a CTA barrier
# (their words are in, their code warm; the counts come out doubled, which
# the in-window bench's check does not read). Stages: "counted" = the
# first pass's last channel, "packed" = the second pass's end. Bundle
# .device/s29e.tar.xz: e's moe_bench (a cubin of its four HT kernels
# only), d's moe_bench as moe_bench_d with d's library cubin.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29e.tar.xz e
# e's cubin holds only the HT kernels: skip the load-every-kernel step
# (its first try failed on a kernel the partial image lacks).
export DEVCOMM_NO_PRELOAD=1
exec > >(tee "$OUT/logs/call7.log") 2>&1
date -u; nvidia-smi -L
for round in 1 2; do
    moe_bench_run e diag_win_$round --mode ht --in-window --tokens 4096
done
MOE_BENCH=moe_bench_d moe_bench_run e d_win --mode ht --in-window --tokens 4096
moe_bench_run e diag_ps --mode ht --per-source --tokens 4096
moe_bench_run e diag_win_g128 --mode ht --in-window --tokens 4096 --channels 128
date -u
echo "call7: overall status $status"
exit $status
