#!/usr/bin/env bash
# Oracle for merge_datasets: Megatron-LM's own tools/merge_datasets.py (torch + numpy, so on the
# GPU machine's CPU; no GPU is used) and our build/bin/merge_datasets on the same inputs must
# write byte-identical .bin and .idx files.
#   tests/gpu/merge_datasets_oracle.sh BIN_DIR [MEGATRON_LM_DIR]
# MEGATRON_LM_DIR (default .oracle/Megatron-LM, an ignored folder of the repo) is a copy of
# github.com/NVIDIA/Megatron-LM. Inputs: five datasets our preprocess_data writes (NullTokenizer,
# names whose sorted order differs from creation order, one non-ASCII), plus two written by
# Megatron's IndexedDatasetBuilder (several sequences per document as --split-sentences makes,
# empty documents, an empty dataset), and a --multimodal set (Megatron's builder, modes). If
# `import megatron.core` fails for a missing optional package, Megatron's indexed_dataset.py is
# loaded on its own with stand-ins for its storage helpers (object storage, MSC, logging; they
# do not touch the builder or reader code) and the summary says so.
# Results in ${OUT:-/tmp/out}/merge_oracle/ (summary.txt). Exit status 1 iff a check FAILed.
set -u
BIN="$(cd "${1:?usage: merge_datasets_oracle.sh BIN_DIR [MEGATRON_LM_DIR]}" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MLM="$(cd "${2:-$ROOT/.oracle/Megatron-LM}" 2>/dev/null && pwd)" || { echo "FAIL: no Megatron-LM copy at ${2:-$ROOT/.oracle/Megatron-LM}"; exit 1; }
O="${OUT:-/tmp/out}/merge_oracle"
rm -rf "$O"; mkdir -p "$O"
S="$O/summary.txt"; : > "$S"
status=0
pass() { echo "PASS: $*" | tee -a "$S"; }
failc() { echo "FAIL: $*" | tee -a "$S"; status=1; }
PY=${PYTHON:-python3}
"$PY" -c 'import torch, numpy' 2>/dev/null || { failc "python3 has no torch/numpy (set PYTHON=)"; exit 1; }
cat > "$O/run_megatron.py" <<'PY'
# Runs Megatron's tools/merge_datasets.py (argv[1] = Megatron-LM dir, the rest its flags), or
# writes datasets with Megatron's IndexedDatasetBuilder ("--write DIR").
import importlib.util, os, runpy, sys, types
mlm = sys.argv[1]
sys.path.insert(0, mlm)
mode = "megatron.core"
try:
    import megatron.core.datasets.indexed_dataset as idx
except Exception as e:  # a missing optional dependency of megatron.core
    mode = f"indexed_dataset.py alone ({type(e).__name__}: {e})"
    for name in ["megatron", "megatron.core", "megatron.core.datasets"]:
        m = types.ModuleType(name); m.__path__ = []; sys.modules[name] = m
    osu = types.ModuleType("megatron.core.datasets.object_storage_utils")
    class _Cfg: pass
    osu.S3Config = osu.ObjectStorageConfig = _Cfg
    osu.is_object_storage_path = lambda p: False
    for f in ["cache_index_file", "dataset_exists", "get_index_cache_path", "get_object_storage_access", "parse_s3_path"]:
        setattr(osu, f, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("object storage not available")))
    msc = types.ModuleType("megatron.core.msc_utils")
    class _F:
        @staticmethod
        def is_enabled(): return False
    msc.MultiStorageClientFeature = _F
    msc.maybe_msc = types.SimpleNamespace(open=open)
    ut = types.ModuleType("megatron.core.utils")
    ut.log_single_rank = lambda logger, level, msg, *a, **k: None
    for m in (osu, msc, ut): sys.modules[m.__name__] = m
    spec = importlib.util.spec_from_file_location("megatron.core.datasets.indexed_dataset",
                                                  os.path.join(mlm, "megatron/core/datasets/indexed_dataset.py"))
    idx = importlib.util.module_from_spec(spec); sys.modules[spec.name] = idx; spec.loader.exec_module(idx)
print("megatron code loaded as:", mode, file=sys.stderr)
if sys.argv[2] == "--write":
    import numpy, torch
    d = sys.argv[3]
    b = idx.IndexedDatasetBuilder(d + "/in/Mid_sentences.bin", dtype=numpy.uint16)
    b.add_document(torch.tensor([1, 2, 3, 4, 5, 6]), [3, 1, 2])
    b.add_document(torch.tensor([], dtype=torch.int64), [])        # an empty document
    b.add_document(torch.tensor([7, 8, 9, 10]), [4])
    b.add_document(torch.tensor([11, 12, 13]), [1, 2])
    b.finalize(d + "/in/Mid_sentences.idx")
    b = idx.IndexedDatasetBuilder(d + "/in/empty.bin", dtype=numpy.uint16)  # no documents at all
    b.finalize(d + "/in/empty.idx")
    for name, docs, modes in [("b", [([1, 2, 3], [2, 1]), ([4], [1])], [[0, 1], [2]]), ("a", [([5, 6, 7], [3])], [[3]])]:
        b = idx.IndexedDatasetBuilder(f"{d}/mm/{name}.bin", dtype=numpy.uint16, multimodal=True)
        for (toks, lens), m in zip(docs, modes):
            b.add_document(torch.tensor(toks), lens, modes=m)
        b.finalize(f"{d}/mm/{name}.idx")
    sys.exit(0)
sys.argv = [os.path.join(mlm, "tools/merge_datasets.py")] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
mkdir -p "$O/in" "$O/mm" "$O/out"
for name in zeta Alpha beta10 beta9 été; do
  "$PY" -c "
import sys
with open(sys.argv[1], 'w', encoding='utf-8') as f:
    for i in range(int(sys.argv[2])): f.write('{\"text\": \"%s\"}\n' % ' '.join(str((i * 13 + j) % 1000) for j in range(i + 2)))
" "$O/$name.jsonl" "${#name}"
  "$BIN/preprocess_data" --input "$O/$name.jsonl" --output-prefix "$O/in/$name" --tokenizer-type NullTokenizer \
    --vocab-size 1000 --workers 1 > /dev/null 2>> "$O/preprocess.err" || failc "preprocess_data $name"
done
"$PY" "$O/run_megatron.py" "$MLM" --write "$O" 2> "$O/write.err" || { cat "$O/write.err"; failc "Megatron's builder did not run"; exit 1; }
info_mode=$(grep -m1 'megatron code loaded as' "$O/write.err"); echo "INFO: $info_mode" | tee -a "$S"
for set in in mm; do
  mm=(); [[ $set == mm ]] && mm=(--multimodal)
  "$PY" "$O/run_megatron.py" "$MLM" --input "$O/$set" --output-prefix "$O/out/megatron_$set" "${mm[@]}" > "$O/megatron_$set.log" 2>&1 ||
    { cat "$O/megatron_$set.log"; failc "$set: Megatron's merge_datasets.py failed"; continue; }
  "$BIN/merge_datasets" --input "$O/$set" --output-prefix "$O/out/ours_$set" "${mm[@]}" > "$O/ours_$set.log" 2>&1 ||
    { cat "$O/ours_$set.log"; failc "$set: our merge_datasets failed"; continue; }
  for ext in bin idx; do
    if cmp "$O/out/megatron_$set.$ext" "$O/out/ours_$set.$ext" >> "$S" 2>&1; then
      pass "$set ($(ls "$O/$set" | grep -c '\.idx$') prefixes${mm:+, --multimodal}): .$ext byte-identical ($(stat -c %s "$O/out/ours_$set.$ext") bytes)"
    else
      failc "$set: .$ext differs from Megatron's"
    fi
  done
done
exit $status
