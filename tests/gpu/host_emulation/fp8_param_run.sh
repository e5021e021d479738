#!/usr/bin/env bash
# Runs transpose_bytes_kernel of megatron/core/ops/cuda/fp8_param.cu on the CPU, without a GPU or
# nvcc (fp8_param_emu.cpp): the kernel source is cut out of the .cu (its anonymous namespace) and
# compiled as C++ with host stand-ins for threads and __syncthreads. A few seconds.
#   tests/gpu/host_emulation/fp8_param_run.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
W="${1:-$(mktemp -d /tmp/fp8_param_emu.XXXXXX)}"
mkdir -p "$W"
awk '/^namespace \{/{p=1} p; /^}  \/\/ namespace$/{p=0}' "$HERE/../../../megatron/core/ops/cuda/fp8_param.cu" > "$W/kernels.inc"
grep -q transpose_bytes_kernel "$W/kernels.inc" || { echo "kernel source not found"; exit 1; }
g++ -std=c++20 -O1 -pthread -I"$W" -I"$HERE/../../.." -o "$W/emu" "$HERE/fp8_param_emu.cpp"
"$W/emu"
