#!/usr/bin/env bash
# examples/mixtral/train_mixtral_8x7b.sh with Megatron's Mixtral flag list (8 experts, top-2, aux
# loss, --moe-grouped-gemm, alltoall dispatcher, bf16, distributed optimizer), scaled down on CPU
# (SCALE_DOWN=1: tiny sizes, PP = EP = 1): 6 iterations with a checkpoint at 6, then a resume to 8
# that must start from the checkpoint (iterations 7 and 8 only). Args: bin dir, source dir.
set -euo pipefail
BIN=$1
SRC=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cd "$OUT"
SCALE_DOWN=1 NPROC_PER_NODE=1 PRETRAIN_GPT="$BIN/pretrain_gpt" EXTRA_ARGS="--vocab-size 512" \
  bash "$SRC/examples/mixtral/train_mixtral_8x7b.sh" "$OUT/ckpt" > log 2>&1 || { cat log; echo "FAIL: the example exited non-zero"; exit 1; }
n=$(grep -c '^ \[[0-9-]* [0-9:.]*\] iteration ' log || true)
[[ "$n" -eq 6 ]] || { cat log; echo "FAIL: expected 6 training lines, got $n"; exit 1; }
grep -q '^ validation loss at iteration 3 | ' log || { cat log; echo "FAIL: no validation at --eval-interval"; exit 1; }
[[ "$(cat "$OUT/ckpt/latest_checkpointed_iteration.txt")" == 6 ]] || { ls -R "$OUT/ckpt"; echo "FAIL: no checkpoint at 6"; exit 1; }
SCALE_DOWN=1 NPROC_PER_NODE=1 TRAIN_ITERS=8 LR_DECAY_ITERS=8 PRETRAIN_GPT="$BIN/pretrain_gpt" EXTRA_ARGS="--vocab-size 512" \
  bash "$SRC/examples/mixtral/train_mixtral_8x7b.sh" "$OUT/ckpt" > log2 2>&1 || { cat log2; echo "FAIL: the resume exited non-zero"; exit 1; }
grep -q 'iteration        7/       8' log2 && ! grep -q 'iteration        1/       8' log2 \
  || { cat log2; echo "FAIL: the resume did not continue from iteration 6"; exit 1; }
echo "Mixtral example (scaled down): 6 iterations, checkpoint, resume to 8"
