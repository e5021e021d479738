#!/usr/bin/env bash
# convert_checkpoint: Hugging Face (files written by transformers, tests/reference/hf/) -> our
# checkpoint -> Hugging Face again must give back model.safetensors byte for byte; and a config
# with an unsupported option fails with a message naming the key.
# Args: <bin dir> <source dir>
set -euo pipefail
BIN=$1; SRC=$2
DIR=$(mktemp -d /tmp/ckpt_convert.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
n=0
for m in llama_tiny gpt2_tiny; do
  "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$SRC/tests/reference/hf/$m" --save-dir "$DIR/$m.ckpt"
  [ "$(cat "$DIR/$m.ckpt/latest_checkpointed_iteration.txt")" = release ]
  "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$DIR/$m.ckpt" --save-dir "$DIR/$m.hf"
  cmp "$SRC/tests/reference/hf/$m/model.safetensors" "$DIR/$m.hf/model.safetensors"
  echo "$m: HF -> mcore -> HF identical"
  n=$((n + 1))
done
mkdir -p "$DIR/bad"
cp "$SRC/tests/reference/hf/llama_tiny/model.safetensors" "$DIR/bad/"
sed 's/"rope_scaling": null/"rope_scaling": {"rope_type": "llama3", "factor": 8.0}/; s/"pretraining_tp": 1,/"pretraining_tp": 1, "rope_scaling": {"rope_type": "llama3", "factor": 8.0},/' \
  "$SRC/tests/reference/hf/llama_tiny/config.json" > "$DIR/bad/config.json"
if "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$DIR/bad" --save-dir "$DIR/bad.ckpt" 2> "$DIR/err"; then
  echo "FAIL: unsupported rope_scaling accepted"; exit 1
fi
grep -q "rope_scaling.rope_type 'llama3'" "$DIR/err" || { cat "$DIR/err"; exit 1; }
echo "ckpt_convert_hf: $((n + 1)) passed, 0 failed"
