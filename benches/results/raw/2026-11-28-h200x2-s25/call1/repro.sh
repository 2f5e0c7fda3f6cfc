set -uo pipefail
source benches/gpu/common.sh
unpack_bundle b25b.tar.xz r
T=$B/r/tests/moe
which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer
echo "== per-expert default"; REPRO=1 DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $T --exact moe_2_ranks 2>&1 | grep -E "REPRO|panicked|Err|test result" | head -8
echo "== per-source default"; REPRO=1 REPRO_PS=1 DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $T --exact moe_2_ranks 2>&1 | grep -E "REPRO|panicked|Err|test result" | head -12
echo "== per-source 256,8,4"; REPRO=1 REPRO_PS=1 REPRO_CFG=256,8,4 DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $T --exact moe_2_ranks 2>&1 | grep -E "REPRO|panicked|Err|test result" | head -12
echo "== per-source 64,256,128"; REPRO=1 REPRO_PS=1 REPRO_CFG=64,256,128 DEVCOMM_RUNTIME=cuda DEVCOMM_TEST_RANKS_PER_GPU=1 timeout 60 $T --exact moe_2_ranks 2>&1 | grep -E "REPRO|panicked|Err|test result" | head -12
echo "== per-source 1 rank"; REPRO=1 REPRO_PS=1 DEVCOMM_RUNTIME=cuda timeout 60 $T --exact moe_1_rank 2>&1 | grep -E "REPRO|panicked|Err|test result" | head -12
