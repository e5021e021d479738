#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on a machine with an NVIDIA GPU (H200 here).
#   tests/gpu/run_gpu_tests.sh [BIN_DIR] [OUT_DIR] [what]
# BIN_DIR holds gpu_ops_test and gpu_bench (default build/bin); logs go to OUT_DIR (default
# $OUT or ./gpu-test-out); what = all (default) | test | bench.
# Steps: 1) gpu_ops_test: every CUDA op vs float64 host references on fresh random inputs;
# 2) compute-sanitizer memcheck (and racecheck on attention) on the small shapes;
# 3) gpu_bench (our kernels) and bench/gpu/torch_peers.py (cuDNN/FlashAttention SDPA,
# torch.matmul) on the same shapes. Exit status: non-zero iff a check failed.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${1:-$ROOT/build/bin}"
OUTD="${2:-${OUT:-$ROOT/gpu-test-out}}"
WHAT="${3:-all}"
mkdir -p "$OUTD"

# CUDA libraries: the toolkit's, and those of the PyTorch wheel (cuBLASLt, cuDNN) if present.
. "$(dirname "${BASH_SOURCE[0]}")/cuda_libs.sh"

status=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUTD/gpu.txt"
if [ "$WHAT" = all ] || [ "$WHAT" = test ]; then
  echo "== gpu_ops_test"
  "$BIN/gpu_ops_test" 2>&1 | tee "$OUTD/gpu_ops_test.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  echo "== fp8_gpu_test (docs/fp8.md)"
  "$BIN/fp8_gpu_test" --no-timing 2>&1 | tee "$OUTD/fp8_gpu_test.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$SAN" ]; then
    echo "== compute-sanitizer memcheck (small shapes)"
    "$SAN" --tool memcheck --error-exitcode 3 "$BIN/gpu_ops_test" --small > "$OUTD/sanitizer.log" 2>&1
    rc=$?; tail -3 "$OUTD/sanitizer.log"; echo "memcheck exit $rc"; [ $rc = 0 ] || status=1
    echo "== compute-sanitizer racecheck (small shapes)"
    "$SAN" --tool racecheck --error-exitcode 3 "$BIN/gpu_ops_test" --small > "$OUTD/racecheck.log" 2>&1
    rc=$?; tail -3 "$OUTD/racecheck.log"; echo "racecheck exit $rc"; [ $rc = 0 ] || status=1
  else
    echo "compute-sanitizer not found"
  fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  echo "== gpu_bench"
  "$BIN/gpu_bench" 2>&1 | tee "$OUTD/gpu_bench.log"
  echo "== torch peers"
  PYTHONUNBUFFERED=1 python3 "$ROOT/bench/gpu/torch_peers.py" 2>&1 | tee "$OUTD/torch_peers.log"
fi
echo "run_gpu_tests: status $status"
exit $status
