#!/usr/bin/env bash
# pretrain_gpt on bad input: one clear line on stderr, non-zero exit. Args: bin dir, source dir.
set -uo pipefail
BIN=$1
BASE=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
      --micro-batch-size 2 --global-batch-size 8 --train-iters 2 --lr 1e-3 --mock-data
      --tokenizer-type NullTokenizer --vocab-size 128)
fail=0
expect() {  # expect "<stderr line>" args...
  local want=$1; shift
  local err rc
  err=$("$BIN/pretrain_gpt" "$@" 2>&1 >/dev/null); rc=$?
  if [[ $rc -eq 0 ]]; then echo "FAIL: exit 0 for: $*"; fail=1; return; fi
  if [[ "$err" != "$want" ]]; then echo "FAIL: got '$err' want '$want'"; fail=1; return; fi
  echo "ok: $want"
}
expect "error: unknown flag --hiden-size; did you mean --hidden-size?" "${BASE[@]}" --hiden-size 3
expect "error: --hidden-size (64) must be divisible by --num-attention-heads (5) (or give --kv-channels)" "${BASE[@]}" --num-attention-heads 5
expect "error: --global-batch-size (7) is not divisible by --micro-batch-size (2) x data-parallel size (1)" "${BASE[@]}" --global-batch-size 7
expect "error: --max-position-embeddings (32) must be greater than or equal to --seq-length (64)" "${BASE[@]}" --seq-length 64
expect "error: use either --train-iters or --train-samples, not both" "${BASE[@]}" --train-samples 16
expect "error: --lr-decay-style: invalid choice 'exp' (choose from constant, linear, cosine, inverse-square-root, WSD)" "${BASE[@]}" --lr-decay-style exp
# A switch takes no value (argparse: "ignored explicit argument"); --bf16=0 is not "off".
expect "error: argument --bf16: ignored explicit argument '0' (--bf16 is a switch and takes no value: give --bf16 alone, or leave it out)" "${BASE[@]}" --bf16=0
# argparse: a value never looks like an option (--load would otherwise swallow --finetune).
expect "error: argument --load: expected one argument" "${BASE[@]}" --load --finetune
expect "error: argument --tensorboard-dir: expected one argument" "${BASE[@]}" --tensorboard-dir --seed 5
expect "error: argument --profile-ranks: expected at least one argument" "${BASE[@]}" --profile-ranks --bf16
expect "error: unrecognized arguments: 1 (pretrain_gpt takes only --flags; each value follows its flag)" "${BASE[@]}" --profile-ranks=0 1
expect "error: unrecognized arguments: --foo (pretrain_gpt takes only --flags; each value follows its flag)" "${BASE[@]}" -- --foo
# Sizes and divisors are range-checked where they are parsed (0 used to divide by zero).
expect "error: argument --num-layers-per-virtual-pipeline-stage: invalid value 0 (must be >= 1)" "${BASE[@]}" --num-layers-per-virtual-pipeline-stage 0
expect "error: argument --num-virtual-stages-per-pipeline-rank: invalid value -2 (must be >= 1)" "${BASE[@]}" --num-virtual-stages-per-pipeline-rank -2
expect "error: unknown flag --untie-embeddings; did you mean --untie-embeddings-and-output-weights?" "${BASE[@]}" --untie-embeddings
# Device choice (docs/training.md "Device"): an unknown MEGATRON_DEVICE is refused.
MEGATRON_DEVICE=tpu expect "error: MEGATRON_DEVICE=tpu: unknown device (use cpu or cuda, or leave it unset for GPU when present)" "${BASE[@]}"
# Input files: a tokenizer.json without "model" (or with a mistyped field) is one user line naming
# --tokenizer-model; it was "internal error: [json.exception.type_error.306] cannot use value() with null".
TOK=$(mktemp -d); echo '{}' > "$TOK/tokenizer.json"
NOTOK=(); skip=0; for x in "${BASE[@]}"; do  # BASE without its NullTokenizer pair
  if [[ $skip -gt 0 ]]; then skip=$((skip - 1)); continue; fi
  case $x in --tokenizer-type|--vocab-size) skip=1; continue ;; esac
  NOTOK+=("$x")
done
expect "error: --tokenizer-model $TOK: a field of tokenizer.json or tokenizer_config.json is missing or of the wrong type ([json.exception.type_error.306] cannot use value() with null); give a Hugging Face byte-level BPE tokenizer" \
  "${NOTOK[@]}" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOK"
rm -rf "$TOK"
# A checkpoint's metadata.json that parses but is not an object (a field of the wrong type): one line naming it.
CK=$(mktemp -d); mkdir "$CK/iter_0000001"; echo 1 > "$CK/latest_checkpointed_iteration.txt"; echo '[]' > "$CK/iter_0000001/metadata.json"
expect "error: $CK/iter_0000001/metadata.json: a field is missing or of the wrong type ([json.exception.type_error.306] cannot use value() with array): the file was edited or damaged after the save; restore it from a copy or re-save the checkpoint" \
  "${BASE[@]}" --load "$CK"
rm -rf "$CK"
# A checkpoint without checksums (older) whose common.json has a field of the wrong type: one error
# line naming the checkpoint (after the warning that nothing is verified), not a JSON exception.
CK=$(mktemp -d); mkdir "$CK/iter_0000001"; echo 1 > "$CK/latest_checkpointed_iteration.txt"
printf '%s' '{"sharded_backend":"megatron_cpp_safetensors","sharded_backend_version":1}' > "$CK/iter_0000001/metadata.json"
echo '[]' > "$CK/iter_0000001/common.json"
err=$("$BIN/pretrain_gpt" "${BASE[@]}" --load "$CK" 2>&1 >/dev/null); rc=$?
want="error: --load $CK: a field of the checkpoint's common state (common.json) is missing or of the wrong type ([json.exception.type_error.306] cannot use value() with array): the file was edited or damaged after the save; restore it from a copy or re-save the checkpoint"
if [[ $rc -ne 0 && "$(grep '^error' <<<"$err")" == "$want" && $(grep -c . <<<"$err") -le 2 ]]; then echo "ok: $want"
else echo "FAIL: rc $rc, got '$err' want '$want'"; fail=1; fi
# The same file read for --use-checkpoint-args (the args, and checkpoint_version of the wrong type).
echo '{"args": {"num_layers": 2}, "checkpoint_version": "x"}' > "$CK/iter_0000001/common.json"
err=$("$BIN/pretrain_gpt" "${BASE[@]}" --load "$CK" --use-checkpoint-args 2>&1 >/dev/null); rc=$?
want="error: --load $CK: a field of the checkpoint's common state (common.json) is missing or of the wrong type ([json.exception.type_error.302] type must be number, but is string): the file was edited or damaged after the save; restore it from a copy or re-save the checkpoint"
if [[ $rc -ne 0 && "$(grep '^error' <<<"$err")" == "$want" && $(grep -c . <<<"$err") -le 2 ]]; then echo "ok: $want"
else echo "FAIL: rc $rc, got '$err' want '$want'"; fail=1; fi
rm -rf "$CK"
exit $fail
