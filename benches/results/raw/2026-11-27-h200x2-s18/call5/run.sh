#!/usr/bin/env bash
# Session 18, call 5: why one-way send/recv of 64 MiB messages runs at 0.83 x
# the copy engine while write runs at 0.99: p2p_bench from 64 MiB, medians of
# 5, as is; with the client waiting 2 ms after the server posted its
# receives (--settle-us 2000); with control frames over the control socket.
set -uo pipefail
source benches/gpu/common.sh
mkdir -p $B/e && tar -xJf $B/b18e.tar.xz -C $B/e
mkdir -p $OUT/logs
exec > >(tee "$OUT/logs/call5.log") 2>&1
date -u; nvidia-smi -L
for extra in "" "--settle-us 2000" "--control tcp" "--iters 32"; do
  echo "== p2p_bench --min-bytes 64M $extra"
  DEVCOMM_RUNTIME=cuda timeout 120 $B/e/bin/p2p_bench --min-bytes $((64 << 20)) $extra || status=1
done
date -u
echo "call5: overall status $status"
tar -czf $OUT/logs.tar.gz -C $OUT logs
exit $status
