#!/usr/bin/env bash
# Runs the FP8 quantize kernels of megatron/core/ops/cuda/fp8_cast.cu (quantize_rows_kernel and
# the vectorized quantize_transpose_vec_kernel) on the CPU, without a GPU or nvcc: the kernel
# source is cut out of the .cu (from pack8's helper to amax_kernel; the fused sources from fp8_sources.cuh) and compiled as C++ with host
# stand-ins for the CUDA intrinsics (fp8_cast_emu.cpp), then checked against a plain loop with the
# CPU FP8 conversions. A development check of indexing/tiling/swizzle/byte transposes where no GPU
# is available; the GPU is checked by fp8_gpu_test. About 10 s on 2 cores.
#   tests/gpu/host_emulation/fp8_cast_run.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$HERE/../../.."
W="${1:-$(mktemp -d /tmp/fp8_emu.XXXXXX)}"
mkdir -p "$W"
{ awk '/^\/\/ ---- sources/{p=1; next} /^\/\/ ---- end of sources/{p=0} p' \
    "$ROOT/megatron/core/ops/cuda/fp8_sources.cuh"
  awk '/^\/\/ Two floats to two FP8 bytes/{p=1} /__global__ void amax_kernel/{p=0} p' \
    "$ROOT/megatron/core/ops/cuda/fp8_cast.cu" | sed '$d'; } > "$W/kernels.inc"
grep -q quantize_transpose_vec_kernel "$W/kernels.inc" || { echo "kernel source not found"; exit 1; }
g++ -std=c++20 -O1 -pthread -I"$W" -I"$ROOT" -o "$W/emu" "$HERE/fp8_cast_emu.cpp" "$ROOT/megatron/core/tensor/dtype.cpp"
"$W/emu"
