#!/usr/bin/env bash
# Session 35, call 7 on ONE H200: moe_floor.cu after its tidy (pe and
# pe_span share count_expert): both rank counts compile, pe / pe_span /
# stream on one GPU still 0 wrong.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p "$OUT/logs"
exec > >(tee "$OUT/logs/call7.log") 2>&1
date -u; nvidia-smi -L
step nvcc -O3 -arch=sm_90 -DRANKS=1 -Xcompiler -pthread -o /tmp/moe_floor1 benches/gpu/moe_floor.cu -lcuda
step nvcc -O3 -arch=sm_90 -DRANKS=2 -Xcompiler -pthread -o /tmp/moe_floor2 benches/gpu/moe_floor.cu -lcuda
step timeout 60 /tmp/moe_floor1 pe pe_span stream
date -u
exit $status
