#!/usr/bin/env bash
# merge_datasets (Megatron's tools/merge_datasets.py) against an independent reading of the
# format: a Python-stdlib writer/reader of the .bin/.idx layout of docs/datasets.md computes what
# Megatron's script produces (prefixes in sorted() order, .bin files back to back, lengths
# concatenated, pointers recomputed from 0 in int64, document indices shifted, the leading 0 of
# each input dropped) and the outputs must equal it byte for byte. Inputs: preprocess_data outputs
# Python-written ones with several sequences per document (as
# --split-sentences makes) and an empty dataset, names whose sorted order differs from creation
# order (uppercase, digits, non-ASCII). Then the refusals (one line each, nothing written):
# mismatched dtypes, a .bin without .idx, a stray file, an empty folder, output == input, a
# .bin of the wrong size, --multimodal with inputs without modes; and --multimodal modes merged.
# Megatron's own script as oracle: tests/gpu/merge_datasets_oracle.sh (needs torch + numpy).
set -euo pipefail
BIN=$1 SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
n=0
mkdir -p "$T/in" "$T/out"
# preprocess_data inputs (NullTokenizer, like Megatron's, cannot tokenize an empty text: the
# empty documents come from the Python-written input below)
python3 - "$T" <<'PY'
import sys
t = sys.argv[1]
for name, docs in [("zeta", 7), ("Alpha", 5), ("beta10", 3), ("beta9", 4), ("\u00e9t\u00e9", 2)]:
    with open(f"{t}/{name}.jsonl", "w", encoding="utf-8") as f:
        for i in range(docs):
            text = " ".join(str((i * 13 + j) % 1000) for j in range(i + 2))
            f.write('{"text": "%s"}\n' % text)
PY
for name in zeta Alpha beta10 beta9 été; do
  "$BIN/preprocess_data" --input "$T/$name.jsonl" --output-prefix "$T/in/$name" --tokenizer-type NullTokenizer \
    --vocab-size 1000 --workers 1 > /dev/null 2> "$T/pp.err" || { cat "$T/pp.err"; fail "preprocess_data $name"; }
done
cat > "$T/fmt.py" <<'PY'
# The .bin/.idx layout (docs/datasets.md): "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64
# sequence count S, u64 document-index count D, int32 lengths[S], int64 pointers[S],
# int64 document_indices[D], optionally int8 modes[S] (multimodal).
import struct, sys, os
SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
def read_idx(p, multimodal=False):
    b = open(p, "rb").read()
    assert b[:9] == b"MMIDIDX\x00\x00" and struct.unpack_from("<Q", b, 9)[0] == 1
    code = b[17]; S, D = struct.unpack_from("<QQ", b, 18); o = 34
    lens = list(struct.unpack_from(f"<{S}i", b, o)); o += 4 * S
    ptrs = list(struct.unpack_from(f"<{S}q", b, o)); o += 8 * S
    docs = list(struct.unpack_from(f"<{D}q", b, o)); o += 8 * D
    modes = list(struct.unpack_from(f"<{S}b", b, o)) if multimodal else None
    return code, lens, ptrs, docs, modes
def write_idx(p, code, lens, docs, modes=None):
    ptrs, cur = [], 0
    for n in lens:
        ptrs.append(cur); cur += n * SIZE[code]
    with open(p, "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, code) + struct.pack("<QQ", len(lens), len(docs)))
        f.write(struct.pack(f"<{len(lens)}i", *lens) + struct.pack(f"<{len(lens)}q", *ptrs) + struct.pack(f"<{len(docs)}q", *docs))
        if modes is not None: f.write(struct.pack(f"<{len(modes)}b", *modes))
def write_dataset(prefix, code, documents, modes=None):
    """documents: list of documents, each a list of sequences (lists of token ids)."""
    fmt = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}[code]
    lens, docs = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for d in documents:
            for s in d:
                f.write(struct.pack(f"<{len(s)}{fmt}", *s)); lens.append(len(s))
            docs.append(len(lens))
    write_idx(prefix + ".idx", code, lens, docs, modes)
def expected_merge(indir, multimodal=False):
    """What Megatron's merge_datasets.py writes: (bin bytes, idx bytes)."""
    prefixes = sorted({os.path.splitext(n)[0] for n in os.listdir(indir) if os.path.isfile(os.path.join(indir, n))})
    code0 = None; lens, docs, modes, data = [], [0], [] if multimodal else None, b""
    for p in prefixes:
        code, l, _, d, m = read_idx(os.path.join(indir, p + ".idx"), multimodal)
        code0 = code if code0 is None else code0
        assert code == code0
        off = len(lens); lens += l; docs += [off + x for x in d[1:]]
        if multimodal: modes += m
        data += open(os.path.join(indir, p + ".bin"), "rb").read()
    write_idx(indir + ".expected.idx", code0, lens, docs, modes)
    return data, open(indir + ".expected.idx", "rb").read(), prefixes
PY
# Python-written inputs: several sequences per document, an empty document, an empty dataset
python3 - "$T" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); from fmt import write_dataset
t = sys.argv[1]
write_dataset(f"{t}/in/Mid_sentences", 8, [[[1, 2, 3], [4], [5, 6]], [], [[7, 8, 9, 10]], [[11], [12, 13]]])
write_dataset(f"{t}/in/empty", 8, [])
PY
check_merge() {  # INDIR OUTPREFIX [--multimodal]
  local mm=${3:-}
  python3 - "$T" "$1" "$2" "$mm" <<'PY' || fail "merged output differs from the format's definition ($1)"
import sys; sys.path.insert(0, sys.argv[1]); from fmt import expected_merge
data, idx, prefixes = expected_merge(sys.argv[2], sys.argv[4] == "--multimodal")
got_bin, got_idx = open(sys.argv[3] + ".bin", "rb").read(), open(sys.argv[3] + ".idx", "rb").read()
print(f"merged {len(prefixes)} prefixes in order {prefixes}: .bin {len(got_bin)} bytes, .idx {len(got_idx)} bytes")
if got_bin != data: sys.exit(f".bin differs ({len(got_bin)} vs {len(data)} bytes)")
if got_idx != idx: sys.exit(f".idx differs ({len(got_idx)} vs {len(idx)} bytes)")
PY
}
"$BIN/merge_datasets" --input "$T/in" --output-prefix "$T/out/m" > "$T/m.log" 2>&1 || { cat "$T/m.log"; fail "merge"; }
[[ ! -s "$T/m.log" ]] || { cat "$T/m.log"; fail "merge printed output (Megatron's script prints nothing)"; }
check_merge "$T/in" "$T/out/m"
n=$((n + 1))
# the merged dataset is a valid dataset: merging it with itself doubles it
mkdir -p "$T/twice"; cp "$T/out/m.bin" "$T/twice/a.bin"; cp "$T/out/m.idx" "$T/twice/a.idx"
cp "$T/out/m.bin" "$T/twice/b.bin"; cp "$T/out/m.idx" "$T/twice/b.idx"
"$BIN/merge_datasets" --input "$T/twice" --output-prefix "$T/out/t" || fail "merge of merged datasets"
check_merge "$T/twice" "$T/out/t"
n=$((n + 1))

refused() {  # WHAT PATTERN ARGS...: exit 1, one line matching PATTERN, no output written
  local what=$1 pat=$2; shift 2
  rm -rf "$T/out2"; mkdir -p "$T/out2"
  if "$BIN/merge_datasets" "$@" > "$T/r.log" 2>&1; then cat "$T/r.log"; fail "$what: accepted"; fi
  [[ $(wc -l < "$T/r.log") == 1 ]] && grep -q "^error: .*$pat" "$T/r.log" || { cat "$T/r.log"; fail "$what: unclear message"; }
  [[ -z "$(ls -A "$T/out2")" ]] || fail "$what: left $(ls "$T/out2")"
  n=$((n + 1))
}
mkdir -p "$T/dt"; cp "$T/in/zeta_text_document".* "$T/dt/"
python3 - "$T" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); from fmt import write_dataset
write_dataset(sys.argv[1] + "/dt/wide", 4, [[[70000, 1]]])  # int32 tokens
PY
refused "mismatched dtypes" "zeta_text_document.idx: dtype uint16 differs from the merged dataset's int32" --input "$T/dt" --output-prefix "$T/out2/x"
mkdir -p "$T/nb"; cp "$T/in/zeta_text_document.bin" "$T/nb/"; cp "$T/in/Alpha_text_document".* "$T/nb/"
refused "a .bin without .idx" ".idx file not provided for $T/nb/zeta_text_document" --input "$T/nb" --output-prefix "$T/out2/x"
mkdir -p "$T/st"; cp "$T/in/zeta_text_document".* "$T/st/"; echo hi > "$T/st/README.txt"
refused "a stray file" ".idx file not provided for $T/st/README" --input "$T/st" --output-prefix "$T/out2/x"
mkdir -p "$T/none"
refused "an empty folder" "no .bin/.idx dataset to merge" --input "$T/none" --output-prefix "$T/out2/x"
refused "a missing folder" "is not a directory" --input "$T/nope" --output-prefix "$T/out2/x"
refused "a missing output folder" "$T/nope is not a directory" --input "$T/in" --output-prefix "$T/nope/x"
refused "output == input" "is the input" --input "$T/dt" --output-prefix "$T/dt/zeta_text_document"
cmp -s "$T/dt/zeta_text_document.bin" "$T/in/zeta_text_document.bin" || fail "output == input: the input was modified"
mkdir -p "$T/sz"; cp "$T/in/zeta_text_document".* "$T/sz/"; printf 'xx' >> "$T/sz/zeta_text_document.bin"
refused "a .bin larger than its .idx" "zeta_text_document.bin: has .* bytes but .*zeta_text_document.idx describes" --input "$T/sz" --output-prefix "$T/out2/x"
refused "--multimodal without modes" "has no sequence modes" --input "$T/in" --output-prefix "$T/out2/x" --multimodal

# --multimodal: the int8 modes are concatenated too
mkdir -p "$T/mm"
python3 - "$T" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); from fmt import write_dataset
t = sys.argv[1]
write_dataset(f"{t}/mm/b", 8, [[[1, 2], [3]], [[4]]], modes=[0, 1, 2])
write_dataset(f"{t}/mm/a", 8, [[[5, 6, 7]]], modes=[-1])
PY
"$BIN/merge_datasets" --input "$T/mm" --output-prefix "$T/out/mm" --multimodal || fail "--multimodal merge"
check_merge "$T/mm" "$T/out/mm" --multimodal
n=$((n + 1))
echo "merge_datasets: $n passed, 0 failed"
