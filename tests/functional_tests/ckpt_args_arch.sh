#!/usr/bin/env bash
# The checkpoint records every argument (common "args", as Megatron's args namespace), and the
# architecture in it is honoured:
#  1. pretrain_gpt --squared-relu --no-bias-gelu-fusion --save: args has squared_relu=true;
#     convert_checkpoint --saver hf exports GPT-2 activation_function "relu2" (transformers'
#     ReLUSquaredActivation, relu(x)^2), with or without --hf-config; a --hf-config that says
#     gelu_new is refused with a line naming activation_function and --squared-relu.
#  2. the same checkpoint exported as LLaMA (config.json with model_type llama) is refused: a
#     LLaMA MLP is gated, squared ReLU without --swiglu is not representable.
#  3. --load with a changed architecture flag (no --squared-relu) is refused before any tensor is
#     read, with a line naming squared_relu and both values (also --disable-bias-linear).
#  4. a checkpoint whose args hold only the old keys (rewritten common.json) still loads.
#  5. --qk-layernorm: export refused naming --qk-layernorm.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1; SRC=$2
OUT=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$OUT"' EXIT
ARGS=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
      --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --seed 1234
      --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$OUT/cache"
      --log-interval 1 --eval-interval 100 --eval-iters 0 --save-interval 100)
fail() { for f in "$OUT"/*.log "$OUT"/*.err; do [[ -f "$f" ]] && { echo "== $f"; cat "$f"; }; done; echo "FAIL: $*"; exit 1; }
n=0

# 1. squared ReLU GPT -> HF relu2
"$BIN/pretrain_gpt" "${ARGS[@]}" --train-iters 4 --exit-interval 2 --squared-relu --no-bias-gelu-fusion --save "$OUT/sq" \
  > "$OUT/sq.log" 2>&1 || fail "squared-relu training"
common=$(ls "$OUT"/sq/iter_0000002/common*.json 2>/dev/null | head -1 || true)
[[ -n "$common" ]] || fail "no common json in $(ls "$OUT/sq/iter_0000002")"
python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['args']; assert a['squared_relu'] is True and a['bias_gelu_fusion'] is False and a['normalization']=='LayerNorm' and a['num_layers']==2 and a['vocab_size']==128 and len(a)>100, a" "$common" \
  || fail "checkpoint args lack the architecture"
n=$((n + 1))
"$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$OUT/sq" --save-dir "$OUT/sq.hf" > "$OUT/conv1.log" 2>&1 \
  || fail "export without --hf-config"
grep -q '"activation_function": *"relu2"' "$OUT/sq.hf/config.json" || fail "export did not write relu2: $(cat "$OUT/sq.hf/config.json")"
n=$((n + 1))
# a GPT-2 config.json for the same shapes, gelu_new: refused (it would be a different model) ...
sed 's/"activation_function": *"relu2"/"activation_function": "gelu_new"/' "$OUT/sq.hf/config.json" > "$OUT/gpt2cfg.json"
grep -q gelu_new "$OUT/gpt2cfg.json" || fail "could not write a gelu_new config"
if "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$OUT/sq" --save-dir "$OUT/sq2.hf" \
     --hf-config "$OUT/gpt2cfg.json" 2> "$OUT/conv2.err"; then fail "gelu_new --hf-config accepted for a squared-relu checkpoint"; fi
grep -q "activation_function 'gelu_new' but the checkpoint was trained with MLP activation --squared-relu" "$OUT/conv2.err" \
  || fail "unclear message: $(cat "$OUT/conv2.err")"
[[ $(wc -l < "$OUT/conv2.err") == 1 ]] || fail "message is not one line"
n=$((n + 1))
# ... and the relu2 config is accepted and gives the same files.
"$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$OUT/sq" --save-dir "$OUT/sq3.hf" \
  --hf-config "$OUT/sq.hf/config.json" > "$OUT/conv3.log" 2>&1 || fail "relu2 --hf-config refused"
cmp "$OUT/sq.hf/model.safetensors" "$OUT/sq3.hf/model.safetensors" || fail "weights differ"
# HF -> mcore of the relu2 export records squared_relu and prints --squared-relu.
"$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$OUT/sq.hf" --save-dir "$OUT/back" > "$OUT/imp.log" 2>&1 \
  || fail "import of the relu2 export"
grep -q -- "--squared-relu" "$OUT/imp.log" || fail "import did not print --squared-relu"
grep -q -- "--no-bias-gelu-fusion" "$OUT/imp.log" || fail "import did not print --no-bias-gelu-fusion (needed with --squared-relu)"
n=$((n + 1))

# 2. as LLaMA: refused
cat > "$OUT/llamacfg.json" <<'JSON'
{"model_type": "llama", "hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "max_position_embeddings": 32, "vocab_size": 128, "hidden_act": "silu"}
JSON
if "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$OUT/sq" --save-dir "$OUT/ll.hf" \
     --hf-config "$OUT/llamacfg.json" 2> "$OUT/conv4.err"; then fail "squared-relu checkpoint exported as LLaMA"; fi
grep -q "trained with --squared-relu without --swiglu.*LLaMA (LlamaForCausalLM) cannot represent" "$OUT/conv4.err" \
  || fail "unclear message: $(cat "$OUT/conv4.err")"
n=$((n + 1))

# 3. --load with another activation: refused before loading; --finetune loads.
if "$BIN/pretrain_gpt" "${ARGS[@]}" --train-iters 4 --no-bias-gelu-fusion --load "$OUT/sq" > "$OUT/mis.log" 2>&1; then
  fail "--load without --squared-relu accepted"
fi
grep -q "error: .*iter_0000002: squared_relu (--squared-relu) is False in this run but True in the checkpoint" "$OUT/mis.log" \
  || fail "unclear message: $(grep error "$OUT/mis.log")"
grep -q "successfully loaded checkpoint" "$OUT/mis.log" && fail "loaded before refusing"
"$BIN/pretrain_gpt" "${ARGS[@]}" --train-iters 4 --squared-relu --no-bias-gelu-fusion --load "$OUT/sq" > "$OUT/ok.log" 2>&1 \
  || fail "--load with the same flags"
grep -q ' iteration        3/       4 ' "$OUT/ok.log" || fail "resume did not continue at iteration 3"
n=$((n + 1))
# --disable-bias-linear changes the model too (named in the message)
if "$BIN/pretrain_gpt" "${ARGS[@]}" --train-iters 4 --squared-relu --disable-bias-linear --load "$OUT/sq" > "$OUT/mis2.log" 2>&1; then
  fail "--load with --disable-bias-linear accepted"
fi
grep -q "add_bias_linear (--disable-bias-linear) is False in this run but True in the checkpoint" "$OUT/mis2.log" \
  || fail "unclear message: $(grep error "$OUT/mis2.log")"
n=$((n + 1))

# 4. old-style checkpoint (args with the ~15 keys written before): loads with any activation flag
python3 - "$common" <<'PY'
import json, sys, os
p = sys.argv[1]; c = json.load(open(p))
old = ["num_layers", "hidden_size", "num_attention_heads", "seq_length", "padded_vocab_size", "micro_batch_size",
       "global_batch_size", "seed", "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
       "use_distributed_optimizer", "iteration", "consumed_train_samples", "consumed_valid_samples"]
c["args"] = {k: c["args"][k] for k in old}
json.dump(c, open(p + ".tmp", "w")); os.replace(p + ".tmp", p)
# as written before checksums existed (an edited common.json is refused otherwise)
m = os.path.join(os.path.dirname(p), "metadata.json"); d = json.load(open(m))
d.pop("megatron_cpp_crc32c"); d.pop("megatron_cpp_crc32c_self"); json.dump(d, open(m, "w"))
PY
"$BIN/pretrain_gpt" "${ARGS[@]}" --train-iters 4 --squared-relu --no-bias-gelu-fusion --load "$OUT/sq" > "$OUT/old.log" 2>&1 \
  || fail "old-style checkpoint did not load"
grep -q 'successfully loaded checkpoint from .* at iteration 2' "$OUT/old.log" || fail "no 'successfully loaded'"
n=$((n + 1))

# 5. --qk-layernorm cannot be exported (neither GPT-2 nor LLaMA has it)
"$BIN/pretrain_gpt" "${ARGS[@]}" --train-iters 1 --qk-layernorm --save "$OUT/qk" > "$OUT/qk.log" 2>&1 || fail "qk-layernorm training"
if "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$OUT/qk" --save-dir "$OUT/qk.hf" 2> "$OUT/conv5.err"; then
  fail "--qk-layernorm checkpoint exported"
fi
grep -q "trained with --qk-layernorm, which GPT-2 (GPT2LMHeadModel) cannot represent" "$OUT/conv5.err" \
  || fail "unclear message: $(cat "$OUT/conv5.err")"
n=$((n + 1))
echo "ckpt_args_arch: $n passed, 0 failed"
