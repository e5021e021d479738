#!/usr/bin/env bash
# The main job: a tiny GPT (2 layers, hidden 64) trained on Megatron's mock data on CPU for 40
# iterations, printing Megatron's log lines; the lm loss falls from ~4.9 (ln 128) to ~2.
# Runs build/bin/pretrain_gpt (build first: bash scripts/build.sh). Extra arguments are appended
# to pretrain_gpt's flags (e.g. --train-iters 100). Takes well under a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PRETRAIN_GPT:-build/bin/pretrain_gpt}
if [[ ! -x "$BIN" ]]; then
  echo "error: $BIN not found; build first: bash scripts/build.sh" >&2
  exit 1
fi
# The mock-data index cache: DATA_CACHE_PATH if given (kept), else a temporary folder removed at exit.
if [[ -n "${DATA_CACHE_PATH:-}" ]]; then CACHE=$DATA_CACHE_PATH
else CACHE=$(mktemp -d -t megatron_quickstart_XXXXXX); trap 'rm -rf "$CACHE"' EXIT; fi

GPT_MODEL_ARGS=(
  --num-layers 2
  --hidden-size 64
  --num-attention-heads 4
  --seq-length 64
  --max-position-embeddings 64
  --attention-dropout 0.0
  --hidden-dropout 0.0
)
TRAINING_ARGS=(
  --micro-batch-size 4
  --global-batch-size 8
  --train-iters 40
  --lr 3e-3
  --min-lr 3e-4
  --lr-decay-style cosine
  --lr-warmup-iters 4
  --weight-decay 0.1
  --clip-grad 1.0
  --seed 1234
)
DATA_ARGS=(
  --mock-data
  --tokenizer-type NullTokenizer
  --vocab-size 128
  --data-cache-path "$CACHE"
)
EVAL_AND_LOGGING_ARGS=(
  --log-interval 5
  --eval-interval 20
  --eval-iters 2
  --log-throughput
)

"$BIN" "${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${DATA_ARGS[@]}" "${EVAL_AND_LOGGING_ARGS[@]}" "$@"
