#!/usr/bin/env bash
# A checkpoint with FP8 state (FP8 routed experts and --fp8-output-proj: every FP8 linear's
# _extra_state.fp8.*) loaded by a run without --fp8-format: the weights load, the run trains, and
# it says once that the checkpoint's FP8 state is not used -- in megatron.cpp's own format as in
# torch_dist (before, only torch_dist said so; the own format dropped it silently); and
# convert_checkpoint's Hugging Face export says it leaves the FP8 state out (before: silently).
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export MEGATRON_DEVICE=cpu
ARGS=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 2 --seq-length 16
      --max-position-embeddings 16 --swiglu --normalization RMSNorm --position-embedding-type rope
      --untie-embeddings-and-output-weights --disable-bias-linear --num-experts 2 --moe-router-topk 2
      --micro-batch-size 1 --global-batch-size 2 --train-iters 4 --lr 1e-3 --lr-warmup-iters 0
      --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --log-interval 1 --bf16
      --mock-data --tokenizer-type NullTokenizer --vocab-size 64 --data-cache-path "$OUT/cache")
fail() { echo "FAIL: $*"; exit 1; }
MSG="FP8 state (amax histories, scales) of the checkpoint is not used: this run does not train in FP8"
for fmt in torch torch_dist; do
  "$BIN/pretrain_gpt" "${ARGS[@]}" --fp8-format hybrid --fp8-output-proj --exit-interval 2 --save "$OUT/$fmt" \
    --save-interval 2 --ckpt-format "$fmt" > "$OUT/save_$fmt.log" 2>&1 || fail "$fmt: FP8 save run: $(tail -2 "$OUT/save_$fmt.log")"
  "$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/$fmt" --ckpt-format "$fmt" > "$OUT/load_$fmt.log" 2>&1 ||
    fail "$fmt: the FP8 checkpoint does not load without --fp8-format: $(tail -2 "$OUT/load_$fmt.log")"
  grep -q "successfully loaded checkpoint" "$OUT/load_$fmt.log" || fail "$fmt: nothing loaded"
  grep -q "iteration *4/" "$OUT/load_$fmt.log" || fail "$fmt: the loaded run did not train to iteration 4"
  [[ $(grep -cF "$MSG" "$OUT/load_$fmt.log") == 1 ]] || fail "$fmt: the dropped FP8 state is not reported once"
  # A run with FP8 keeps the state and says nothing of the kind.
  "$BIN/pretrain_gpt" "${ARGS[@]}" --fp8-format hybrid --fp8-output-proj --load "$OUT/$fmt" --ckpt-format "$fmt" \
    > "$OUT/load8_$fmt.log" 2>&1 || fail "$fmt: FP8 reload"
  grep -qF "$MSG" "$OUT/load8_$fmt.log" && fail "$fmt: an FP8 run reports the FP8 state as unused"
  echo "OK: $fmt: FP8 checkpoint loads into a bf16 run, which reports the FP8 state unused"
  # Hugging Face export of the FP8 checkpoint: the weights only, the dropped FP8 state said.
  "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$OUT/$fmt" --save-dir "$OUT/hf_$fmt" \
    > "$OUT/hf_$fmt.log" 2>&1 || fail "$fmt: HF export: $(tail -2 "$OUT/hf_$fmt.log")"
  grep -q "FP8 state tensors .* are not exported" "$OUT/hf_$fmt.log" || fail "$fmt: HF export drops the FP8 state silently"
  grep -aq "_extra_state" "$OUT/hf_$fmt/model.safetensors" && fail "$fmt: FP8 state in the HF checkpoint"
  echo "OK: $fmt: HF export of the FP8 checkpoint says its FP8 state is not exported"
done
