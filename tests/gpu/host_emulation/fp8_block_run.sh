#!/usr/bin/env bash
# Runs the blockwise FP8 quantize kernel of megatron/core/ops/cuda/fp8_block.cu on the CPU, without
# a GPU or nvcc (fp8_block_emu.cpp: the kernel source cut out of the .cu and compiled as C++ with
# host stand-ins for the CUDA intrinsics, 256 std::threads per block), against a plain loop of the
# blockwise recipe. A development check of tiling, partial tiles, the warp reductions and the
# scale layouts where no GPU is available, and the fused producers' source path (RMSNorm / SwiGLU
# functors of fp8_sources.cuh filling the tile) against quantizing the producer's output; the GPU
# is checked by fp8_gpu_test --groups blockwise. About 10 s on 2 cores.
#   tests/gpu/host_emulation/fp8_block_run.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$HERE/../../.."
W="${1:-$(mktemp -d /tmp/fp8_block_emu.XXXXXX)}"
mkdir -p "$W"
{ awk '/^\/\/ ---- sources/{p=1; next} /^\/\/ ---- end of sources/{p=0} p' \
    "$ROOT/megatron/core/ops/cuda/fp8_sources.cuh"
  awk '/^\/\/ ---- kernels/{p=1; next} /^\/\/ The outputs of one quantize call/{p=0} p' \
    "$ROOT/megatron/core/ops/cuda/fp8_block.cu"; } |
  sed 's/extern __shared__ __align__(16) unsigned char smem_raw\[\];/unsigned char* smem_raw = g_smem;/' > "$W/kernels.inc"
grep -q "smem_raw = g_smem;" "$W/kernels.inc" && grep -q "block_quantize_tile_kernel" "$W/kernels.inc" ||
  { echo "kernel source not found"; exit 1; }
g++ -std=c++20 -O1 -pthread -I"$W" -I"$ROOT" -o "$W/emu" "$HERE/fp8_block_emu.cpp" "$ROOT/megatron/core/tensor/dtype.cpp"
"$W/emu"
