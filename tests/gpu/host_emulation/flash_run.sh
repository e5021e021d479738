#!/usr/bin/env bash
# Runs the flash attention kernels of megatron/core/ops/cuda/attention.cu (with and without attention
# dropout) on the CPU, without a GPU or nvcc: the kernel source is cut out of the .cu (its anonymous
# namespace up to make_args, minus the helpers written in PTX: mma.sync, ldmatrix, cp.async), compiled
# as C++ with the host stand-ins of flash_attention_emu.cpp (the PTX ISA's fragment layouts; each
# warp's lanes are threads meeting at a std::barrier at every warp-collective instruction), and checked:
# the forward's and backward's dropout masks equal the SplitMix64 stream element for element (probe),
# and those of the generic kernels (attention_generic.cu, emulated alongside), and out/lse/dq/dk/dv
# match a float64 reference and the generic kernels (bf16 1e-2, lse 1e-3), and the two-pass
# (deterministic) backward's dq/dk/dv match the float64 reference, its dk/dv equal the atomics
# backward's bit for bit and a rerun with the blocks in reverse order equals it bit for bit (the
# atomics dq under that order differs: the control). A development check of the kernel logic where
# no GPU is available; the GPU itself is checked by gpu_ops_test --only attn_dropout,attn_det.
#   tests/gpu/host_emulation/flash_run.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
SRC="$HERE/../../../megatron/core/ops/cuda"
W="${1:-$(mktemp -d /tmp/flash_emu.XXXXXX)}"
mkdir -p "$W"
awk '/^namespace \{/{p=1} /^FaArgs make_args/{p=0} !p{next}
     /^__device__ __forceinline__ void (mma16816|ldsm_x4_trans|ldsm_x4|cp_async16|cp_async_wait)\(/{skip=1}
     /^__device__ __forceinline__ void cp_async_commit\(\)/{next}
     /^template <int N>$/{next}
     skip{ if ($0 ~ /^}/) skip=0; next }
     {print}' "$SRC/attention.cu" |
  sed 's/extern __shared__ __align__(16) unsigned char smem_raw\[\];/unsigned char* smem_raw = g_smem;/' > "$W/flash_kernels.inc"
sed -n '/^namespace megatron/,$p' "$SRC/dropout_stream.cuh" > "$W/dstream.inc"
awk '/^namespace \{/{p=1} /^Args make_args/{p=0} p' "$SRC/attention_generic.cu" |
  sed 's/extern __shared__ float smem\[\];/float* smem = g_smem_f;/' > "$W/generic_kernels.inc"
g++ -std=c++20 -O2 -fno-strict-aliasing -pthread -I"$W" -I"$HERE/../../.." -o "$W/emu" "$HERE/flash_attention_emu.cpp" "$HERE/../../../megatron/core/tensor/dtype.cpp"
"$W/emu"
