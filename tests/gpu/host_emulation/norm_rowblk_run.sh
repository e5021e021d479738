#!/usr/bin/env bash
# Runs the row-block LayerNorm/RMSNorm backward of megatron/core/ops/cuda/norm.cu
# (norm_bwd_rowblk_kernel: 1024 < h <= 8192, bf16 rows; Session 12) and the general backward it
# replaces at those h (norm_bwd_kernel, atomics and deterministic forms) on the CPU, without a GPU
# or nvcc: the three pieces of kernel source (norm_bwd_kernel, Pack8, the row-block kernel between
# its begin/end markers) are cut out of the .cu and compiled as C++ with host stand-ins
# (norm_rowblk_emu.cpp: a block's threads are std::threads meeting at every __syncthreads and
# shuffle). Checks dx and every block's dgamma/dbeta partial row against float64, the old kernel
# within tolerance of the new one, and two runs of the new one bitwise equal. Tens of seconds on
# 2 idle cores (every shuffle is a 32-thread barrier).
#   tests/gpu/host_emulation/norm_rowblk_run.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$HERE/../../.."
W="${1:-$(mktemp -d /tmp/norm_rowblk_emu.XXXXXX)}"
mkdir -p "$W"
SRC="$ROOT/megatron/core/ops/cuda/norm.cu"
{
  awk '/^\/\/ kDet \(deterministic mode/{p=1} /^\/\/ dgamma \(blockIdx.y = 0\)/{p=0} p' "$SRC" |
    sed 's/extern __shared__ float sm\[\];/float* sm = g_smem_f;/'
  awk '/^\/\/ Eight elements of one row as stored/{p=1} /^constexpr int kRegMaxChunks/{p=0} p' "$SRC"
  awk '/^\/\/ ---- norm_bwd_rowblk begin/{p=1} p; /^\/\/ ---- norm_bwd_rowblk end/{p=0}' "$SRC"
} > "$W/kernels.inc"
for k in norm_bwd_kernel 'struct alignas(16) Pack8' norm_bwd_rowblk_kernel 'float\* sm = g_smem_f'; do
  grep -q "$k" "$W/kernels.inc" || { echo "FAIL kernel source not found: $k"; exit 1; }
done
g++ -std=c++20 -O1 -pthread -I"$W" -I"$ROOT" -I"$HERE" -o "$W/emu" "$HERE/norm_rowblk_emu.cpp" \
  "$ROOT/megatron/core/tensor/dtype.cpp"
"$W/emu"
