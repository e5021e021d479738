#!/usr/bin/env bash
# Tiny-GPT CPU training throughput: pretrain_gpt (mock data, Megatron flags) beside the same model
# in PyTorch (bench/training/torch_tiny_gpt.py), same thread count. Prints tokens/s for both.
# Usage: bash bench/training/run_bench.sh [threads]   (env: LAYERS HIDDEN HEADS SEQ BATCH ITERS)
# pretrain_gpt's figure = tokens per iteration / mean "elapsed time per iteration" of the log
# lines after the first (the first interval includes start-up), like the torch warm-up steps.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${1:-2}
L=${LAYERS:-2}; H=${HIDDEN:-128}; N=${HEADS:-4}; S=${SEQ:-128}; B=${BATCH:-8}; K=${ITERS:-24}
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
OMP_NUM_THREADS=$T build/bin/pretrain_gpt --num-layers "$L" --hidden-size "$H" --num-attention-heads "$N" \
  --seq-length "$S" --max-position-embeddings "$S" --micro-batch-size "$B" --global-batch-size "$B" \
  --train-iters "$K" --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 128 \
  --hidden-dropout 0 --attention-dropout 0 --log-interval 4 --eval-iters 0 --data-cache-path "$OUT/cache" > "$OUT/log"
ms=$(grep ' iteration ' "$OUT/log" | tail -n +3 | sed 's/.*elapsed time per iteration (ms): \([0-9.]*\) .*/\1/' |
     awk '{s+=$1; n++} END {printf "%.3f", s/n}')
echo "megatron.cpp threads $T: $(awk -v ms="$ms" -v t=$((B * S)) 'BEGIN {printf "%.0f", t / (ms / 1000)}') tokens/s ($ms ms/iteration, L=$L h=$H heads=$N s=$S b=$B)"
/usr/bin/python3 bench/training/torch_tiny_gpt.py --threads "$T" --layers "$L" --hidden "$H" --heads "$N" --seq "$S" \
  --batch "$B" --steps $((K - 4)) --warmup 4
