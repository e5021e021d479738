#!/usr/bin/env bash
# Runs the LayerNorm/RMSNorm register kernels of megatron/core/ops/cuda/norm.cu -- the Session 4
# ones (norm_fwd_reg_kernel, norm_bwd_reg_kernel) and their cp.async-pipelined versions
# (norm_fwd_pipe_kernel, norm_bwd_pipe_kernel) -- on the CPU, without a GPU or nvcc: the kernel
# source is cut out of the .cu (from Pack8 to the block-per-row kernel) and compiled as C++ with
# host stand-ins (norm_pipe_emu.cpp: a warp's 32 lanes are 32 threads meeting at every shuffle;
# each cp.async lands only when cp.async.wait_group lets it, the latest the PTX rules allow, into
# shared memory poisoned with NaN). Checks the pipelined kernels' outputs bitwise against the
# unpipelined ones (a development check of the stage/group indexing and of the rows per warp;
# nvcc's own code is checked on the GPU by gpu_ops_test --only norms) and both against a float64
# reference. About 30 s on 2 idle cores, minutes on busy ones (thread-heavy: every shuffle is a
# 32-thread barrier).
#   tests/gpu/host_emulation/norm_pipe_run.sh [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$HERE/../../.."
W="${1:-$(mktemp -d /tmp/norm_emu.XXXXXX)}"
mkdir -p "$W"
awk '/^\/\/ Eight elements of one row as stored/{p=1} /^constexpr int kRowThreads/{p=0} p' \
  "$ROOT/megatron/core/ops/cuda/norm.cu" |
  sed 's/extern __shared__ uint4 norm_pipe_smem\[\];/uint4* norm_pipe_smem = g_smem;/' > "$W/kernels.inc"
grep -q norm_bwd_pipe_kernel "$W/kernels.inc" || { echo "kernel source not found"; exit 1; }
g++ -std=c++20 -O1 -pthread -I"$W" -I"$ROOT" -o "$W/emu" "$HERE/norm_pipe_emu.cpp" "$ROOT/megatron/core/tensor/dtype.cpp"
"$W/emu"
