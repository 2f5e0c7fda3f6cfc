#!/usr/bin/env bash
# The point-to-point engine's large messages against the copy engine and
# NCCL, three runs (64 MiB to 1 GiB): `bash benches/gpu/p2p_large_call.sh b23e.tar.xz`.
set -uo pipefail
source benches/gpu/common.sh
unpack_bundle "$1" e
exec > >(tee "$OUT/logs/p2p_large_call.log") 2>&1
date -u; nvidia-smi -L
for i in 1 2 3; do
    echo "== p2p_bench large $i"
    DEVCOMM_RUNTIME=cuda timeout 120 $B/e/bin/p2p_bench --nccl --min-bytes 67108864 --max-bytes 1073741824 --factor 4 || status=1
done
date -u; echo "p2p_large_call: overall status $status"
exit $status
