#!/usr/bin/env bash
# Session 29, call 2: where is the high-throughput dispatch's receive tail
# (~25-45 us after the last send, call 1)? Call 1's bundle (s29a), in the
# window, 4096 tokens: without --stages (the stamps' CTA syncs hold a
# CTA's early spans until its last send), then channels 32/64/128/256,
# CTAs 64/132, threads 128, each with the stages.
set -uo pipefail
source benches/gpu/common.sh
t0=$(date +%s)
unpack_bundle s29a.tar.xz a
exec > >(tee "$OUT/logs/call2.log") 2>&1
date -u; nvidia-smi -L
nostages() {
    local name=$1; shift
    echo; echo "== moe_bench $name (no stages): $*"
    DEVCOMM_RUNTIME=cuda timeout 60 $B/a/bin/devcomm-run -n 2 $B/a/bin/moe_bench --nccl "$@" 2>&1 | tee $OUT/logs/moe_bench_$name.log
}
nostages win_ns --mode ht --in-window --tokens 4096
nostages ps_ns --mode ht --per-source --tokens 4096
for g in 32 64 128 256; do
    moe_bench_run a win_g$g --mode ht --in-window --tokens 4096 --channels $g
done
moe_bench_run a win_c64 --mode ht --in-window --tokens 4096 --ctas 64
moe_bench_run a win_c132 --mode ht --in-window --tokens 4096 --ctas 132
moe_bench_run a win_t128 --mode ht --in-window --tokens 4096 --threads 128
nostages win_ns2 --mode ht --in-window --tokens 4096
date -u
echo "call2: overall status $status"
exit $status
