#!/usr/bin/env bash
# Compares the cuDNN attention graphs that megatron/core/ops/cuda/cudnn_attention.cpp builds at git
# revision REV (default HEAD) with the working tree's: every backend descriptor, attribute and value,
# in order, and the engine / plan selection, for 48 shape variants (cudnn_graph_record.cpp, a
# recording fake cuDNN; no GPU or cuDNN library needed, only the CUDA and cuDNN headers and
# libcudart). For refactors that must leave the graphs unchanged. A few seconds.
#   tests/gpu/host_emulation/cudnn_graph_diff.sh [REV] [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
REV="${1:-HEAD}"
W="${2:-$(mktemp -d /tmp/cudnn_graph.XXXXXX)}"
mkdir -p "$W"
git -C "$ROOT" show "$REV:megatron/core/ops/cuda/cudnn_attention.cpp" > "$W/rev_cudnn_attention.cpp"
CUDA="${CUDA_HOME:-/usr/local/cuda}"
for v in rev tree; do
  src="$W/rev_cudnn_attention.cpp"; [ $v = tree ] && src="$ROOT/megatron/core/ops/cuda/cudnn_attention.cpp"
  g++ -std=c++20 -O1 -DMEGATRON_WITH_CUDA=1 -I"$ROOT" -isystem "$CUDA/include" -DSRC="\"$src\"" \
    "$HERE/cudnn_graph_record.cpp" "$HERE/cudnn_graph_stubs.cpp" -o "$W/record_$v" -ldl -L"$CUDA/lib64" -lcudart
  LD_LIBRARY_PATH="$CUDA/lib64:${LD_LIBRARY_PATH:-}" "$W/record_$v" "$W/$v.log"
done
if cmp -s "$W/rev.log" "$W/tree.log"; then
  echo "cudnn_graph_diff: IDENTICAL graphs ($(grep -c '^==' "$W/tree.log") shapes, $(wc -l < "$W/tree.log") calls) at $REV and in the working tree"
else
  diff "$W/rev.log" "$W/tree.log" | head -20 || true
  echo "cudnn_graph_diff: graphs DIFFER between $REV and the working tree (logs $W/rev.log, $W/tree.log)"
  exit 1
fi
