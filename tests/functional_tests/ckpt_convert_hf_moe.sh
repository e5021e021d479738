#!/usr/bin/env bash
# convert_checkpoint with Hugging Face mixture-of-experts models (tests/reference/hf_moe/, written
# by transformers through generate_hf_moe_fixtures.py): Mixtral, Qwen3-MoE and Qwen2-MoE HF -> our checkpoint
# -> HF gives back model.safetensors byte for byte and the same config settings; each import
# loads in run_text_generation_server with the model flags convert_checkpoint printed, generates,
# and its log-probs of the fixture's tokens equal log_softmax of transformers' logits within
# 1e-4 x max(1, max |logit|): the logits agree to 1e-5 of their largest magnitude (HFMoE.* unit
# tests), log_softmax = logit - logsumexp adds at most that again, so 2e-5 x max |logit|, with a
# 5x margin for the server's own float32 rounding; a Qwen2-MoE config with a sliding window is
# refused naming the field. First, pretrain_gpt's own MoE checkpoints export (see below). Without the
# fixtures it then fails, naming the generator.
# Args: <bin dir> <source dir>
set -euo pipefail
BIN=$1; SRC=$2
FIX="$SRC/tests/reference/hf_moe"
DIR=$(mktemp -d /tmp/ckpt_convert_moe.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
# Export of pretrain_gpt's own MoE checkpoints (no fixture needed): every layer MoE (stacked keys)
# -> Mixtral, a dense layer + --qk-layernorm (per-layer keys) -> Qwen3-MoE with mlp_only_layers, a
# dense layer + a gated shared expert + q/k/v bias -> Qwen2-MoE; HF -> mcore -> HF again gives the
# same file.
T=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 32
  --max-position-embeddings 32 --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 128
  --disable-bias-linear --swiglu --normalization RMSNorm --position-embedding-type rope
  --untie-embeddings-and-output-weights --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48
  --tokenizer-type NullTokenizer --vocab-size 128 --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr 1e-3
  --mock-data --data-cache-path "$DIR/cache" --eval-iters 0 --save-interval 2)
for leg in "mixtral:" "qwen3_moe:--qk-layernorm --moe-layer-freq [1,0]" \
  "qwen2_moe:--moe-layer-freq [0,1] --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate --add-qkv-bias"; do
  want=${leg%%:*}; read -r -a extra <<< "${leg#*:}"
  "$BIN/pretrain_gpt" "${T[@]}" "${extra[@]}" --save "$DIR/tr_$want" > "$DIR/tr_$want.log" 2>&1 \
    || { tail -20 "$DIR/tr_$want.log"; echo "FAIL: pretrain_gpt ($want leg)"; exit 1; }
  "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$DIR/tr_$want" --save-dir "$DIR/tr_$want.hf" > /dev/null
  got=$(python3 -c "import json; c = json.load(open('$DIR/tr_$want.hf/config.json')); print(c['model_type'], c.get('mlp_only_layers'))")
  case "$want:$got" in "mixtral:mixtral None"|"qwen3_moe:qwen3_moe [1]"|"qwen2_moe:qwen2_moe [0]") ;;
    *) echo "FAIL: $want leg exported as '$got'"; exit 1;; esac
  "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$DIR/tr_$want.hf" --save-dir "$DIR/tr_$want.back" > /dev/null
  "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$DIR/tr_$want.back" --save-dir "$DIR/tr_$want.hf2" > /dev/null
  cmp "$DIR/tr_$want.hf/model.safetensors" "$DIR/tr_$want.hf2/model.safetensors"
  echo "pretrain_gpt MoE checkpoint -> $got; HF -> mcore -> HF identical"
done
FIXTURES="mixtral_tiny qwen3_moe_tiny qwen2_moe_tiny"
for m in $FIXTURES; do
  if [ ! -f "$FIX/$m/model.safetensors" ]; then
    echo "FAIL: $FIX/$m is missing: run 'python3 tests/reference/hf_moe/generate_hf_moe_fixtures.py tests/reference/hf_moe/'" \
         "on a machine with torch + transformers (or tests/reference/hf_moe/run_on_gpu_machine.sh) and commit the folders"
    exit 1
  fi
done
for m in $FIXTURES; do
  "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$FIX/$m" --save-dir "$DIR/$m.ckpt" > "$DIR/$m.import.log"
  grep -q -- "--num-experts" "$DIR/$m.import.log" || { cat "$DIR/$m.import.log"; echo "FAIL: $m: no MoE flags printed"; exit 1; }
  "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$DIR/$m.ckpt" --save-dir "$DIR/$m.hf" > "$DIR/$m.export.log"
  cmp "$FIX/$m/model.safetensors" "$DIR/$m.hf/model.safetensors"
  # Re-import of the export prints the same Megatron flags.
  "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$DIR/$m.hf" --save-dir "$DIR/$m.ckpt2" > "$DIR/$m.import2.log"
  diff <(grep '^model flags:' "$DIR/$m.import.log") <(grep '^model flags:' "$DIR/$m.import2.log")
  echo "$m: HF -> mcore -> HF identical, same model flags"
done
grep -q -- "--moe-layer-freq \[1,0,1\]" "$DIR/qwen3_moe_tiny.import.log" || { echo "FAIL: qwen3_moe_tiny: no layer pattern"; exit 1; }
grep -q -- "--qk-layernorm" "$DIR/qwen3_moe_tiny.import.log" || { echo "FAIL: qwen3_moe_tiny: no --qk-layernorm"; exit 1; }
for f in "--moe-layer-freq \[0,1,0,1\]" "--moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate" "--add-qkv-bias"; do
  grep -q -- "$f" "$DIR/qwen2_moe_tiny.import.log" || { cat "$DIR/qwen2_moe_tiny.import.log"; echo "FAIL: qwen2_moe_tiny: no '$f'"; exit 1; }
done

# Generation from each import with the printed flags: the prompt is the fixture's first sequence.
for m in $FIXTURES; do
  read -r -a FLAGS <<< "$(grep '^model flags:' "$DIR/$m.import.log" | sed 's/^model flags://')"
  PROMPT=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$FIX/$m/inputs.json'))['tokens'][0])))")
  "$BIN/run_text_generation_server" "${FLAGS[@]}" --load "$DIR/$m.ckpt" --tokenizer-type NullTokenizer \
    --vocab-size 128 --seq-length 64 --prompts "$PROMPT" --num-tokens-to-generate 8 > "$DIR/$m.gen.log" 2>&1 \
    || { cat "$DIR/$m.gen.log"; echo "FAIL: run_text_generation_server on the imported $m"; exit 1; }
  grep -q "successfully loaded checkpoint" "$DIR/$m.gen.log" || { cat "$DIR/$m.gen.log"; echo "FAIL: $m not loaded"; exit 1; }
  grep '^{"' "$DIR/$m.gen.log" | tail -1 > "$DIR/$m.gen.json"
  python3 - "$DIR/$m.gen.json" "$FIX/$m" <<'PY'
import json, math, struct, sys
r = json.load(open(sys.argv[1]))
fix = sys.argv[2]
tok = json.load(open(fix + "/inputs.json"))["tokens"][0]
with open(fix + "/logits.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    info = json.loads(f.read(n))["logits"]
    b, s, V = info["shape"]
    lo, hi = info["data_offsets"]
    f.seek(8 + n + lo)
    x = struct.unpack("<%df" % (b * s * V), f.read(hi - lo))
ref, big = [], 1.0
for j in range(s - 1):  # log p(tok[j+1] | tok[:j+1]) from transformers' logits of sequence 0
    row = x[j * V:(j + 1) * V]
    m = max(row)
    big = max(big, max(abs(v) for v in row))
    ref.append(row[tok[j + 1]] - m - math.log(sum(math.exp(v - m) for v in row)))
got = r["logprobs"][0]
assert len(r["tokens"][0]) == s + 8, ("expected prompt + 8 generated tokens", len(r["tokens"][0]))
d = max(abs(a - c) for a, c in zip(got[: s - 1], ref))
print("generated", r["tokens"][0][s:], "; max |prompt log-prob - transformers| = %.2e (bound %.1e)" % (d, 1e-4 * big))
sys.exit(0 if d <= 1e-4 * big else 1)
PY
  echo "$m: run_text_generation_server loads the import; prompt log-probs equal transformers'"
done

# A Qwen2-MoE with a sliding window (Megatron's attention is full causal) is refused, naming the field.
mkdir -p "$DIR/q2"
cp "$FIX/qwen2_moe_tiny/model.safetensors" "$DIR/q2/"
python3 -c "import json; c = json.load(open('$FIX/qwen2_moe_tiny/config.json')); c['use_sliding_window'] = True; json.dump(c, open('$DIR/q2/config.json', 'w'))"
if "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$DIR/q2" --save-dir "$DIR/q2.ckpt" 2> "$DIR/q2.err"; then
  echo "FAIL: qwen2_moe with use_sliding_window accepted"; exit 1
fi
grep -q "use_sliding_window" "$DIR/q2.err" || { cat "$DIR/q2.err"; exit 1; }
[ ! -e "$DIR/q2.ckpt" ] || { echo "FAIL: refused import left $DIR/q2.ckpt"; exit 1; }
echo "ckpt_convert_hf_moe: 10 passed, 0 failed"
