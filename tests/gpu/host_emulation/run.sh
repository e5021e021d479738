#!/usr/bin/env bash
# Runs the kernels of megatron/core/ops/cuda/attention_generic.cu on the CPU, without a GPU or nvcc:
# the kernel source is cut out of the .cu (everything from its anonymous namespace to make_args),
# compiled as C++ with host stand-ins for the CUDA intrinsics (attention_generic_emu.cpp: each
# warp's 32 lanes are 32 threads meeting at a std::barrier at every shuffle and __syncwarp), and
# checked against a float64 reference (fp32 <= 1e-5, bf16 <= 1e-2 relative norm error; the dropout
# keep-scales re-derived from the SplitMix64 definition). A development check of the kernel logic
# (indexing, online softmax, GQA, masks, dropout) where no GPU is available; the GPU itself is
# checked by gpu_ops_test --only attn_generic. About a minute on 2 cores (thread-heavy).
#   tests/gpu/host_emulation/run.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
SRC="$HERE/../../../megatron/core/ops/cuda"
W="${1:-$(mktemp -d /tmp/attn_emu.XXXXXX)}"
mkdir -p "$W"
awk '/^namespace \{/{p=1} /^Args make_args/{p=0} p' "$SRC/attention_generic.cu" |
  sed 's/extern __shared__ float smem\[\];/float* smem = g_smem;/' > "$W/kernels.inc"
sed -n '/^namespace megatron/,$p' "$SRC/dropout_stream.cuh" > "$W/dstream.inc"
g++ -std=c++20 -O1 -pthread -I"$W" -I"$HERE/../../.." -o "$W/emu" "$HERE/attention_generic_emu.cpp" "$HERE/../../../megatron/core/tensor/dtype.cpp"
"$W/emu"
