#!/usr/bin/env bash
# NCCL backend checks on a machine with >= 2 GPUs (run by the lead on the H200 machine).
#   tests/gpu/run_nccl_tests.sh [BUILD_DIR]      (BUILD_DIR default: build; configured with CUDA)
# 1. the DistNccl* collectives with 2 ranks under megatron_launch (NCCL bootstrapped through
#    MASTER_ADDR/MASTER_PORT, no MPI);
# 2. the same under mpirun (rank/world from OMPI_COMM_WORLD_*, NCCL still bootstrapped by the store);
# 3. a rank that never joins a collective ends the job through the watchdog (5 s timeout).
# Prints one PASS/FAIL line per check and exits non-zero if any failed.
set -u
B=${1:-build}
export NCCL_NVLS_ENABLE=0 MEGATRON_TEST_DIST_BACKEND=nccl
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ ! -x "$B/bin/unit_tests" ] || [ ! -x "$B/bin/megatron_launch" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRON_CUDA=ON >/dev/null || exit 1
  cmake --build "$B" -j"$(nproc)" --target unit_tests megatron_launch || exit 1
fi
LOG=$(mktemp -d /tmp/nccl_tests.XXXXXX)
status=0
check() {  # name, expected-passing-rank-count, log
  local got; got=$(grep -c "\[  PASSED  \]" "$3" || true)
  if [ "$got" = "$2" ] && ! grep -q "SKIPPED\|FAILED" "$3"; then echo "PASS $1"; else echo "FAIL $1 (see $3)"; tail -30 "$3"; status=1; fi
}
timeout 300 "$B/bin/megatron_launch" --nproc-per-node 2 --master-port 29731 \
  "$B/bin/unit_tests" --gtest_filter='DistNccl.*' --gtest_color=no >"$LOG/launch.log" 2>&1
check "nccl collectives, megatron_launch 2 ranks" 2 "$LOG/launch.log"
if command -v mpirun >/dev/null; then
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29732 timeout 300 mpirun -np 2 --allow-run-as-root --bind-to none \
    -x NCCL_NVLS_ENABLE -x MEGATRON_TEST_DIST_BACKEND -x MASTER_ADDR -x MASTER_PORT \
    bash -c 'LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK exec "$0" "$@"' \
    "$B/bin/unit_tests" --gtest_filter='DistNccl.*' --gtest_color=no >"$LOG/mpirun.log" 2>&1
  check "nccl collectives, mpirun 2 ranks" 2 "$LOG/mpirun.log"
fi
start=$(date +%s)
MEGATRON_TEST_DIST_FAILURE=hang MEGATRON_TEST_DIST_TIMEOUT_S=5 timeout 120 "$B/bin/megatron_launch" --nproc-per-node 2 \
  --master-port 29733 "$B/bin/unit_tests" --gtest_filter='DistNcclFailure.*' --gtest_color=no >"$LOG/hang.log" 2>&1
rc=$?; secs=$(( $(date +%s) - start ))
if [ $rc -eq 1 ] && grep -q "watchdog: all_reduce" "$LOG/hang.log" && [ $secs -le 60 ]; then
  echo "PASS nccl watchdog ends a hung job (${secs}s)"
else
  echo "FAIL nccl watchdog (rc=$rc, ${secs}s, see $LOG/hang.log)"; tail -30 "$LOG/hang.log"; status=1
fi
echo "commit $(git rev-parse --short HEAD 2>/dev/null) $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
exit $status
