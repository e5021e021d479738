#!/usr/bin/env bash
# FP8 training state in --ckpt-format torch_dist checkpoints (docs/checkpointing.md, "FP8 state"),
# CPU emulation of the FP8 GEMMs, for the delayed (hybrid) and the blockwise recipes:
#  1. an FP8 run saved as torch_dist at iteration 2 and resumed to 4 prints iterations 3..4 as the
#     straight 4-iteration run does (tests/functional_tests/support/resumed_log.py's rule; exact
#     strings): weights, Adam state and the amax histories / scales all arrive;
#  2. control (delayed recipe): the same checkpoint with the FP8 state removed from .metadata
#     loads (fresh FP8 state, as Megatron-LM does with a checkpoint without it) and iteration 3
#     then differs from the straight run, so check 1 sees the restored FP8 state;
#  3. a bf16 torch_dist checkpoint loads into an FP8 run (fresh FP8 state);
#  4. an FP8 torch_dist checkpoint loads into a bf16 run with one note line that its FP8 state is
#     not used, and continues exactly like the bf16 run loading the same run's own-format save.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
SRC=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export MEGATRON_DEVICE=cpu
RL="python3 $SRC/tests/functional_tests/support/resumed_log.py"
ARGS=(--num-layers 2 --hidden-size 128 --ffn-hidden-size 256 --num-attention-heads 2 --kv-channels 64
      --seq-length 32 --max-position-embeddings 32 --position-embedding-type rope --swiglu --normalization RMSNorm
      --untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0 --hidden-dropout 0
      --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --lr 1e-2 --min-lr 1e-3
      --lr-decay-style cosine --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
      --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$OUT/cache"
      --log-interval 1 --eval-iters 0 --bf16 --save-interval 100)
FP8=(--fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max)
fail() { for f in "$OUT"/*.log; do echo "== $f"; tail -8 "$f"; done; echo "FAIL: $*"; exit 1; }
field() { grep " iteration *$2/ *4 " "$1" | sed 's/.*lm loss: \([0-9.E+-]*\) .*/\1/'; }

for recipe in delayed blockwise; do
  R=("${FP8[@]}" --fp8-recipe "$recipe")
  "$BIN/pretrain_gpt" "${ARGS[@]}" "${R[@]}" > "$OUT/$recipe.a.log" 2>&1 || fail "$recipe straight run"
  "$BIN/pretrain_gpt" "${ARGS[@]}" "${R[@]}" --ckpt-format torch_dist --save "$OUT/$recipe" --exit-interval 2 \
    > "$OUT/$recipe.b1.log" 2>&1 || fail "$recipe torch_dist save"
  grep -aq 'megatron_cpp.decoder.layers.0.mlp.linear_fc1._extra_state.fp8.amax_history' "$OUT/$recipe/iter_0000002/.metadata" ||
    fail "$recipe: no FP8 state in the torch_dist checkpoint"
  "$BIN/pretrain_gpt" "${ARGS[@]}" "${R[@]}" --load "$OUT/$recipe" > "$OUT/$recipe.b2.log" 2>&1 || fail "$recipe torch_dist resume"
  $RL compare "$OUT/$recipe.a.log" "$OUT/$recipe.b2.log" --iterations 3-4 --name "$recipe torch_dist resume" ||
    fail "$recipe: resume from torch_dist differs from the straight run"
done

# 2. Control: the delayed checkpoint without its FP8 state.
cp -r "$OUT/delayed" "$OUT/nofp8"
python3 - "$SRC/tests/reference/torch_dist" "$OUT/nofp8/iter_0000002/.metadata" <<'PY'
import pickle, sys
sys.path.insert(0, sys.argv[1])
import dcp_stdlib  # noqa: F401  (the stand-in classes the pickle names)
md = pickle.load(open(sys.argv[2], 'rb'))
gone = [k for k in md.state_dict_metadata if '._extra_state.fp8.' in k]
assert gone, 'no FP8 keys'
for k in gone:
    del md.state_dict_metadata[k]
md.storage_data = {i: v for i, v in md.storage_data.items() if i.fqn not in gone}
pickle.dump(md, open(sys.argv[2], 'wb'), protocol=4)
PY
"$BIN/pretrain_gpt" "${ARGS[@]}" "${FP8[@]}" --load "$OUT/nofp8" > "$OUT/nofp8.log" 2>&1 || fail "load without FP8 state"
a=$(field "$OUT/delayed.a.log" 3); b=$(field "$OUT/nofp8.log" 3)
[[ -n "$b" && "$a" != "$b" ]] || fail "fresh FP8 state gave the restored state's loss at iteration 3 ($a): check 1 has no teeth"

# 3. bf16 torch_dist checkpoint -> FP8 run.
"$BIN/pretrain_gpt" "${ARGS[@]}" --ckpt-format torch_dist --save "$OUT/bf16" --exit-interval 2 > "$OUT/bf16.log" 2>&1 ||
  fail "bf16 torch_dist save"
"$BIN/pretrain_gpt" "${ARGS[@]}" "${FP8[@]}" --load "$OUT/bf16" > "$OUT/bf16_fp8.log" 2>&1 || fail "bf16 checkpoint into an FP8 run"
[[ -n "$(field "$OUT/bf16_fp8.log" 4)" ]] || fail "bf16 checkpoint into an FP8 run: no iteration 4"

# 4. FP8 checkpoint -> bf16 run, against the same run's own-format checkpoint.
"$BIN/pretrain_gpt" "${ARGS[@]}" "${FP8[@]}" --save "$OUT/own" --exit-interval 2 > "$OUT/own.log" 2>&1 || fail "own-format save"
"$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/own" > "$OUT/own_bf16.log" 2>&1 || fail "own FP8 checkpoint into a bf16 run"
"$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/delayed" > "$OUT/td_bf16.log" 2>&1 || fail "torch_dist FP8 checkpoint into a bf16 run"
[[ $(grep -c 'FP8 state (amax histories, scales) of the checkpoint is not used' "$OUT/td_bf16.log") -eq 1 ]] ||
  fail "no note that the FP8 state is not used"
for it in 3 4; do
  a=$(field "$OUT/own_bf16.log" $it); b=$(field "$OUT/td_bf16.log" $it)
  [[ -n "$a" && "$a" == "$b" ]] || fail "bf16 continuation from torch_dist ($b) vs own format ($a) at iteration $it"
done
echo "PASS: FP8 state in torch_dist checkpoints (delayed + blockwise exact resume, fresh-state control, cross loads)"
