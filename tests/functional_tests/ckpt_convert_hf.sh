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
sed 's/"pretraining_tp": 1,/"pretraining_tp": 1, "rope_scaling": {"rope_type": "yarn", "factor": 8.0},/' \
  "$SRC/tests/reference/hf/llama_tiny/config.json" > "$DIR/bad/config.json"
if "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$DIR/bad" --save-dir "$DIR/bad.ckpt" 2> "$DIR/err"; then
  echo "FAIL: unsupported rope_scaling accepted"; exit 1
fi
grep -q "rope_scaling.rope_type 'yarn'" "$DIR/err" || { cat "$DIR/err"; exit 1; }
# Llama-3.1 rope_scaling (rope_type llama3) maps to --use-rope-scaling --rope-scaling-factor and
# comes back in the exported config.json.
mkdir -p "$DIR/l31"
cp "$SRC/tests/reference/hf/llama_tiny/model.safetensors" "$DIR/l31/"
sed 's/"pretraining_tp": 1,/"pretraining_tp": 1, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},/; s/"rope_type": "default"/"rope_type": "llama3", "factor": 8.0/' \
  "$SRC/tests/reference/hf/llama_tiny/config.json" > "$DIR/l31/config.json"
"$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$DIR/l31" --save-dir "$DIR/l31.ckpt" > "$DIR/l31.log"
grep -q -- "--use-rope-scaling --rope-scaling-factor 8" "$DIR/l31.log" || { cat "$DIR/l31.log"; echo "FAIL: no rope scaling flags"; exit 1; }
"$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$DIR/l31.ckpt" --save-dir "$DIR/l31.hf"
python3 -c "import json,sys; r=json.load(open('$DIR/l31.hf/config.json'))['rope_scaling']; sys.exit(0 if r['rope_type']=='llama3' and r['factor']==8.0 and r['original_max_position_embeddings']==8192 else 1)" \
  || { cat "$DIR/l31.hf/config.json"; echo "FAIL: rope_scaling not exported"; exit 1; }
cmp "$DIR/l31/model.safetensors" "$DIR/l31.hf/model.safetensors"
echo "llama3 rope_scaling: HF -> mcore -> HF keeps it"
echo "ckpt_convert_hf: $((n + 2)) passed, 0 failed"
