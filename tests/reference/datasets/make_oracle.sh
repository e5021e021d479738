#!/usr/bin/env bash
# Prepares Megatron-LM's dataset code as an oracle on a CPU machine with Debian's python3-numpy,
# python3-torch 1.13, python3-pybind11, python3-dev and python3-packaging.
#   tests/reference/datasets/make_oracle.sh <Megatron-LM git dir> [out dir, default .oracle/lite]
# Exports only megatron/core/{datasets,tokenizers} and the few modules they import (Megatron's
# full package import pulls in models that need a newer torch), adds a two-function utils shim,
# and builds helpers_cpp. Then run generate.py with
#   MEGATRON_ORACLE=<out dir> PYTHONPATH=tests/reference/datasets/oracle_stubs /usr/bin/python3 tests/reference/datasets/generate.py
# (oracle_stubs/sitecustomize.py stands in for modules Megatron imports but the dataset code never uses).
set -euo pipefail
GIT=$1
OUT=${2:-.oracle/lite}
rm -rf "$OUT" && mkdir -p "$OUT"
tmp=$(mktemp -d)
git --git-dir="$GIT" archive HEAD megatron/core | tar -x -C "$tmp"
mkdir -p "$OUT/megatron/core"
: > "$OUT/megatron/__init__.py"
: > "$OUT/megatron/core/__init__.py"
cp -r "$tmp/megatron/core/datasets" "$tmp/megatron/core/tokenizers" "$OUT/megatron/core/"
for f in safe_globals _rank_utils _slurm_utils msc_utils enums package_info; do
  [ -f "$tmp/megatron/core/$f.py" ] && cp "$tmp/megatron/core/$f.py" "$OUT/megatron/core/"
done
rm -rf "$tmp"
# numpy 1.24 has no numpy.dtypes
sed -i 's/^from numpy.dtypes import UInt32DType/UInt32DType = type(numpy.dtype("uint32"))/' "$OUT/megatron/core/safe_globals.py"
cat > "$OUT/megatron/core/utils.py" <<'PY'
import inspect
from megatron.core._rank_utils import log_single_rank
def accepts_parameter(func, name):
    return any(p.name == name or p.kind == inspect.Parameter.VAR_KEYWORD
               for p in inspect.signature(func).parameters.values())
def get_te_version():
    return None
PY
PATH=/usr/bin:$PATH make -C "$OUT/megatron/core/datasets"
