#!/usr/bin/env bash
# Runs the multi-tensor Adam kernels of megatron/core/ops/cuda/adam_multi.cu (v1 and the u2/u4
# kernels, with and without evict-first hints, on persistent grids and one block per tile) on the
# CPU, without a GPU or nvcc: the kernel source is cut out of the .cu (from kThreads to the kernel
# table), with adam_update.cuh's element update and streaming.cuh's accesses, and compiled as C++
# with host stand-ins for the CUDA intrinsics (adam_multi_emu.cpp), then checked: v1 against the
# float64 formula, every other kernel bit-identical to v1. A development check of the indexing
# (tiles, tails, the tensor-table walk) where no GPU is available; the GPU is checked by
# gpu_ops_test --only adam and dev/cuda/adam_multi. About 15 s on 2 cores (the compile); ctest
# host_emulation.adam_multi builds and runs the same.
#   tests/gpu/host_emulation/adam_multi_run.sh [WORK_DIR]
#   tests/gpu/host_emulation/adam_multi_run.sh --cut-only DIR   (only the cut sources, into DIR:
#       the CMake build of ctest host_emulation.adam_multi)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$HERE/../../.."
SRC="$ROOT/megatron/core/ops/cuda"
cut_only=0
if [ "${1:-}" = --cut-only ]; then cut_only=1; shift; fi
W="${1:-$(mktemp -d /tmp/adam_emu.XXXXXX)}"
mkdir -p "$W"
awk '/^constexpr int kThreads = 256;/{p=1} /^\/\/ The kernels by index/{p=0} p' "$SRC/adam_multi.cu" > "$W/kernels.inc"
awk '/^namespace megatron::ops::cuda \{/{p=1; next} /^\}  \/\/ namespace/{p=0} p' "$SRC/adam_update.cuh" > "$W/update.inc"
awk '/^namespace megatron::ops::cuda::detail \{/{p=1; next} /^\}  \/\/ namespace/{p=0} p' "$SRC/streaming.cuh" > "$W/streaming.inc"
for f in kernels:adam_multi_v2_kernel update:adam_update8 streaming:st4; do
  grep -q "${f#*:}" "$W/${f%%:*}.inc" || { echo "FAIL kernel source ${f#*:} not found in $SRC"; exit 1; }
done
[ $cut_only = 1 ] && exit 0
g++ -std=c++20 -O1 -fno-strict-aliasing -I"$W" -I"$HERE" -I"$ROOT" -o "$W/emu" "$HERE/adam_multi_emu.cpp" "$ROOT/megatron/core/tensor/dtype.cpp"
"$W/emu"
