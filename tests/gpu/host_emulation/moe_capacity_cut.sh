#!/usr/bin/env bash
# Cuts the dropless permutation kernels and the capacity-dropping kernels out of
# megatron/core/ops/cuda/moe_router.cu for moe_capacity_emu.cpp (tests/CMakeLists.txt builds it
# into ctest host_emulation.moe_capacity).
#   tests/gpu/host_emulation/moe_capacity_cut.sh MOE_ROUTER_CU OUT_INC
set -euo pipefail
SRC="$1"
OUT="$2"
mkdir -p "$(dirname "$OUT")"
{ awk '/^\/\/ ---- block scans/{p=1} /^template <class X, class O>/{p=0} p' "$SRC"
  awk '/^\/\/ ---- capacity dropping/{p=1} /^}  \/\/ namespace$/{p=0} p' "$SRC"; } |
  sed 's/extern __shared__ int64_t offs\[\];/int64_t* offs = g_offs;/' > "$OUT.tmp"
for f in block_scan_flag permute_rank_kernel permute_scatter_kernel capacity_select_kernel capacity_scatter_kernel "offs = g_offs"; do
  grep -q "$f" "$OUT.tmp" || { echo "moe_capacity_cut.sh: '$f' not found in $SRC"; rm -f "$OUT.tmp"; exit 1; }
done
mv "$OUT.tmp" "$OUT"
