#!/usr/bin/env bash
# --use-checkpoint-args (Megatron's load_args_from_checkpoint, docs/checkpointing.md "Taking the
# arguments from the checkpoint"):
#  1. a tiny GPT trained with non-default architecture flags (3 layers, hidden 48, 6 heads,
#     kv-channels 16, ffn 80, SwiGLU, RMSNorm, RoPE 50% base 5000, no linear biases, untied
#     embeddings, GQA with 2 groups, dropout 0) saves at iteration 3; resumed with only --load
#     --use-checkpoint-args and the training flags -- plus wrong values of flags Megatron always
#     takes from the checkpoint (--normalization LayerNorm, --position-embedding-type
#     learned_absolute, --add-qkv-bias, --attention-dropout 0.1) -- its arguments block shows the
#     saving run's flags (checked against those flags, not against what we wrote), it prints
#     Megatron's "Setting num_layers to 3 from checkpoint" lines, and it continues bitwise as the
#     resume with the explicit flags: the iteration lines are identical and the weights and
#     optimizer state saved at iteration 6 are byte-identical files;
#     run_text_generation_server with --use-checkpoint-args answers as with the flags;
#  2. a flag Megatron takes only when it is None here (--hidden-size 64) stays the user's: the load
#     is then refused naming hidden_size (check_checkpoint_args), one error line;
#  3. --use-mp-args-from-checkpoint-args: a TP2 checkpoint loaded on 2 ranks without
#     --tensor-model-parallel-size runs TP2 with the flag and TP1 x DP2 without it;
#  4. Megatron-LM's own torch_dist checkpoint (tests/reference/torch_dist/megatron_llama_tp1, args
#     pickled by Megatron) with no architecture flags continues exactly as with the LLaMA flags;
#  5. bad input, one error line each (exit 1), nothing written: --use-checkpoint-args without
#     --load; a checkpoint without args (Megatron's "Checkpoint provided does not have arguments
#     saved, using provided arguments." then --num-layers is required); no checkpoint (Megatron's
#     "Checkpoint not found ...", and with --exit-on-missing-checkpoint an error); a checkpoint
#     argument megatron.cpp does not implement (hybrid_layer_pattern); a checkpoint value our flag
#     refuses (normalization Foo).
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1; SRC=$2
OUT=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$OUT"' EXIT
export OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPI=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -np 2)
TRAIN=(--micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --seed 1234 --train-iters 6
       --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$OUT/cache"
       --log-interval 1 --eval-interval 100 --eval-iters 0 --save-interval 100)
ARCH=(--num-layers 3 --hidden-size 48 --num-attention-heads 6 --kv-channels 16 --ffn-hidden-size 80
      --seq-length 32 --max-position-embeddings 64 --swiglu --normalization RMSNorm --position-embedding-type rope
      --rotary-percent 0.5 --rotary-base 5000 --disable-bias-linear --untie-embeddings-and-output-weights
      --group-query-attention --num-query-groups 2 --attention-dropout 0.0 --hidden-dropout 0.0
      --make-vocab-size-divisible-by 32)
fail() { for f in "$OUT"/*.log; do [[ -f "$f" ]] && { echo "== $f"; grep -m3 -E '^error|Error' "$f" || tail -3 "$f"; }; done; echo "FAIL: $*"; exit 1; }
n=0
# The iteration lines without their time stamp and time per iteration.
iters() { grep -E ' iteration +[0-9]+/' "$1" | sed -E 's/^.* (iteration +[0-9]+\/)/\1/; s/elapsed time per iteration \(ms\): [0-9.]+ \| //'; }
block() { sed -n '/-- arguments --/,/end of arguments/p' "$1"; }
# refused LOG PATTERN: exit status 1, exactly one error line, and it matches PATTERN.
refused() {
  local rc=$1 log=$2 pat=$3
  [[ $rc == 1 ]] || fail "$log: exit status $rc, expected 1"
  [[ $(grep -c '^error' "$log") == 1 ]] || fail "$log: $(grep -c '^error' "$log") error lines, expected 1"
  grep -q "^error: .*$pat" "$log" || fail "$log: unclear message: $(grep '^error' "$log")"
}

# 1. save, resume with the explicit flags, resume with --use-checkpoint-args
"$BIN/pretrain_gpt" "${TRAIN[@]}" "${ARCH[@]}" --exit-interval 3 --save "$OUT/ck" > "$OUT/save.log" 2>&1 || fail "training"
cp -r "$OUT/ck" "$OUT/ck_b"
"$BIN/pretrain_gpt" "${TRAIN[@]}" "${ARCH[@]}" --load "$OUT/ck" --save "$OUT/ck" > "$OUT/explicit.log" 2>&1 \
  || fail "resume with the explicit flags"
"$BIN/pretrain_gpt" "${TRAIN[@]}" --normalization LayerNorm --position-embedding-type learned_absolute --add-qkv-bias \
  --attention-dropout 0.1 --use-checkpoint-args --load "$OUT/ck_b" --save "$OUT/ck_b" > "$OUT/ckargs.log" 2>&1 \
  || fail "resume with --use-checkpoint-args"
[[ $(iters "$OUT/explicit.log" | wc -l) == 3 ]] || fail "the explicit resume did not run iterations 4..6"
diff <(iters "$OUT/explicit.log") <(iters "$OUT/ckargs.log") > "$OUT/iters.diff" || fail "iteration lines differ: $(cat "$OUT/iters.diff")"
n=$((n + 1))
for f in "$OUT"/ck/iter_0000006/*.safetensors; do
  cmp "$f" "$OUT/ck_b/iter_0000006/$(basename "$f")" || fail "the iteration-6 checkpoints differ ($(basename "$f"))"
done
ls "$OUT"/ck/iter_0000006/*.safetensors > /dev/null || fail "no iteration-6 checkpoint"
n=$((n + 1))
# The arguments block shows the saving run's flags.
for kv in "num_layers 3" "hidden_size 48" "num_attention_heads 6" "kv_channels 16" "ffn_hidden_size 80" \
          "seq_length 32" "max_position_embeddings 64" "swiglu True" "normalization RMSNorm" \
          "position_embedding_type rope" "rotary_percent 0.5" "rotary_base 5000" "add_bias_linear False" \
          "add_qkv_bias False" "untie_embeddings_and_output_weights True" "group_query_attention True" \
          "num_query_groups 2" "attention_dropout 0.0" "hidden_dropout 0.0" "tokenizer_type NullTokenizer" \
          "use_checkpoint_args True"; do
  set -- $kv
  grep -qE "^  $1 \.+ $2\$" "$OUT/ckargs.log" || fail "arguments block: $1 is not $2: $(grep -E "^  $1 " "$OUT/ckargs.log")"
done
# ... and is the explicit run's but for the flag itself, the directories and the vocabulary divisor (Megatron takes
# padded_vocab_size, not make_vocab_size_divisible_by, from the checkpoint).
diff <(block "$OUT/explicit.log" | grep -vE '^  (use_checkpoint_args|make_vocab_size_divisible_by|load|save) ') \
     <(block "$OUT/ckargs.log" | grep -vE '^  (use_checkpoint_args|make_vocab_size_divisible_by|load|save) ') > "$OUT/block.diff" \
  || fail "arguments blocks differ: $(cat "$OUT/block.diff")"
grep -q '^Setting num_layers to 3 from checkpoint$' "$OUT/ckargs.log" || fail "no 'Setting num_layers to 3 from checkpoint'"
grep -q '^Setting padded_vocab_size to 128 from checkpoint$' "$OUT/ckargs.log" || fail "padded_vocab_size not taken"
grep -q '^Checkpoint did not provide arguments apply_layernorm_1p$' "$OUT/ckargs.log" || fail "Megatron's apply_layernorm_1p line missing"
grep -q 'padded vocab (size' "$OUT/ckargs.log" && fail "the vocabulary was padded again instead of taken from the checkpoint"
n=$((n + 1))

# ... and run_text_generation_server takes them too: the same one-shot answer as with the flags.
GEN=(--tokenizer-type NullTokenizer --vocab-size 128 --prompts "1 2 3 4" --num-tokens-to-generate 6)
"$BIN/run_text_generation_server" "${ARCH[@]}" "${GEN[@]}" --load "$OUT/ck" > "$OUT/gen_explicit.log" 2>&1 \
  || fail "generation with the explicit flags"
"$BIN/run_text_generation_server" "${GEN[@]}" --use-checkpoint-args --load "$OUT/ck" > "$OUT/gen_ck.log" 2>&1 \
  || fail "generation with --use-checkpoint-args"
grep -q '"tokens"' "$OUT/gen_explicit.log" || fail "no generation output"
cmp <(tail -1 "$OUT/gen_explicit.log") <(tail -1 "$OUT/gen_ck.log") || fail "generation answers differ"
n=$((n + 1))

# 2. not-None arguments stay the user's
set +e
"$BIN/pretrain_gpt" "${TRAIN[@]}" --hidden-size 64 --use-checkpoint-args --load "$OUT/ck" > "$OUT/hidden.log" 2>&1
rc=$?; set -e
refused $rc "$OUT/hidden.log" "hidden_size (--hidden-size) is 64 in this run but 48 in the checkpoint"
grep -q '^Setting hidden_size' "$OUT/hidden.log" && fail "hidden_size taken although given"
n=$((n + 1))

# 3. --use-mp-args-from-checkpoint-args
SMALL=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
       --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64)
"${MPI[@]}" "$BIN/pretrain_gpt" "${TRAIN[@]}" "${SMALL[@]}" --tensor-model-parallel-size 2 --exit-interval 2 \
 --save "$OUT/tp2" > "$OUT/tp2.log" 2>&1 || fail "TP2 training"
"${MPI[@]}" "$BIN/pretrain_gpt" "${TRAIN[@]}" --exit-interval 3 --use-checkpoint-args --use-mp-args-from-checkpoint-args \
 --load "$OUT/tp2" > "$OUT/mp.log" 2>&1 || fail "load with --use-mp-args-from-checkpoint-args"
grep -q 'data-parallel size: 1, .*tensor-model-parallel size: 2, pipeline-model-parallel size: 1' "$OUT/mp.log" \
  || fail "--use-mp-args-from-checkpoint-args did not take TP2: $(grep 'using world size' "$OUT/mp.log")"
grep -qE '^  tensor_model_parallel_size \.+ 2$' "$OUT/mp.log" || fail "arguments block: tensor_model_parallel_size is not 2"
"${MPI[@]}" "$BIN/pretrain_gpt" "${TRAIN[@]}" --exit-interval 3 --use-checkpoint-args \
 --load "$OUT/tp2" > "$OUT/nomp.log" 2>&1 || fail "load without --use-mp-args-from-checkpoint-args"
grep -q 'data-parallel size: 2, .*tensor-model-parallel size: 1,' "$OUT/nomp.log" \
  || fail "without --use-mp-args-from-checkpoint-args the TP size changed: $(grep 'using world size' "$OUT/nomp.log")"
grep -q 'successfully loaded checkpoint' "$OUT/nomp.log" || fail "TP1 x DP2 did not load the TP2 checkpoint"
n=$((n + 1))

# 4. Megatron-LM's own checkpoint: its pickled args give the LLaMA architecture.
# shellcheck source=tests/functional_tests/support/torch_dist_oracle_flags.sh
source "$SRC/tests/functional_tests/support/torch_dist_oracle_flags.sh"
FX=$SRC/tests/reference/torch_dist/megatron_llama_tp1
TD_TRAIN=(--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --min-lr 1e-3 --lr-decay-style constant --weight-decay 0.01
          --clip-grad 1.0 --seed 1234 --init-method-std 0.02 --mock-data --vocab-size 127 --log-interval 1
          --eval-interval 1000 --eval-iters 0 --no-bias-gelu-fusion --data-cache-path "$OUT/cache"
          --train-iters 7 --use-checkpoint-opt_param-scheduler)
"$BIN/pretrain_gpt" "${TD_MODEL[@]}" "${TD_LLAMA[@]}" --data-cache-path "$OUT/cache" --train-iters 7 \
  --use-checkpoint-opt_param-scheduler --load "$FX" > "$OUT/td_explicit.log" 2>&1 || fail "Megatron checkpoint, explicit flags"
"$BIN/pretrain_gpt" "${TD_TRAIN[@]}" --use-checkpoint-args --load "$FX" > "$OUT/td_ck.log" 2>&1 \
  || fail "Megatron checkpoint with --use-checkpoint-args"
[[ $(iters "$OUT/td_explicit.log" | wc -l) == 2 ]] || fail "Megatron checkpoint: iterations 6, 7 not run"
diff <(iters "$OUT/td_explicit.log") <(iters "$OUT/td_ck.log") > "$OUT/td.diff" || fail "Megatron checkpoint: $(cat "$OUT/td.diff")"
for kv in "swiglu True" "normalization RMSNorm" "position_embedding_type rope" "num_query_groups 2" \
          "add_bias_linear False" "untie_embeddings_and_output_weights True" "num_layers 2" "hidden_size 64"; do
  set -- $kv
  grep -qE "^  $1 \.+ $2\$" "$OUT/td_ck.log" || fail "Megatron checkpoint: $1 is not $2"
done
n=$((n + 1))

# 5. bad input
set +e
"$BIN/pretrain_gpt" "${TRAIN[@]}" --use-checkpoint-args > "$OUT/noload.log" 2>&1
refused $? "$OUT/noload.log" "--use-checkpoint-args requires --load"
n=$((n + 1))
mkdir -p "$OUT/empty"
"$BIN/pretrain_gpt" "${TRAIN[@]}" --use-checkpoint-args --load "$OUT/empty" > "$OUT/none.log" 2>&1
refused $? "$OUT/none.log" "--num-layers is required"
grep -q '^Checkpoint not found to provide arguments, using provided arguments.$' "$OUT/none.log" || fail "no 'Checkpoint not found' line"
"$BIN/pretrain_gpt" "${TRAIN[@]}" --use-checkpoint-args --exit-on-missing-checkpoint --load "$OUT/empty" > "$OUT/exitmiss.log" 2>&1
refused $? "$OUT/exitmiss.log" "no checkpoint found .*--exit-on-missing-checkpoint"
[[ -z $(ls -A "$OUT/empty") ]] || fail "files written into the empty --load directory: $(ls -A "$OUT/empty")"
n=$((n + 1))
set -e
# edit ITER_DIR PYTHON: rewrites the checkpoint's common.json args (a = the args dict) as written
# before checksums existed (an edited common.json is refused otherwise).
edit() {
  python3 - "$1" "$2" <<'PY'
import glob, json, os, sys
d, code = sys.argv[1], sys.argv[2]
p = glob.glob(os.path.join(d, "common*.json"))[0]
c = json.load(open(p)); a = c.get("args"); exec(code); json.dump(c, open(p, "w"))
m = os.path.join(d, "metadata.json"); md = json.load(open(m))
md.pop("megatron_cpp_crc32c", None); md.pop("megatron_cpp_crc32c_self", None); json.dump(md, open(m, "w"))
PY
}
for case in noargs hybrid badnorm; do
  rm -rf "$OUT/$case"; mkdir -p "$OUT/$case"
  cp -r "$OUT/tp2/iter_0000002" "$OUT/tp2/latest_checkpointed_iteration.txt" "$OUT/$case/"
done
edit "$OUT/noargs/iter_0000002" 'del c["args"]'
edit "$OUT/hybrid/iter_0000002" 'a["hybrid_layer_pattern"] = "M*M*"'
edit "$OUT/badnorm/iter_0000002" 'a["normalization"] = "Foo"'
set +e
"$BIN/pretrain_gpt" "${TRAIN[@]}" --use-checkpoint-args --load "$OUT/noargs" > "$OUT/noargs.log" 2>&1
refused $? "$OUT/noargs.log" "--num-layers is required"
grep -q '^Checkpoint provided does not have arguments saved, using provided arguments.$' "$OUT/noargs.log" \
  || fail "no 'does not have arguments saved' line"
n=$((n + 1))
"$BIN/pretrain_gpt" "${TRAIN[@]}" --use-checkpoint-args --load "$OUT/hybrid" > "$OUT/hybrid.log" 2>&1
refused $? "$OUT/hybrid.log" "--use-checkpoint-args: .*iter_0000002 sets hybrid_layer_pattern (--hybrid-layer-pattern) to M\*M\*, which megatron.cpp does not implement"
n=$((n + 1))
"$BIN/pretrain_gpt" "${TRAIN[@]}" --use-checkpoint-args --load "$OUT/badnorm" > "$OUT/badnorm.log" 2>&1
refused $? "$OUT/badnorm.log" "--use-checkpoint-args: .*iter_0000002: the checkpoint's arguments: --normalization: invalid choice 'Foo'"
n=$((n + 1))
set -e
for case in noargs hybrid badnorm; do
  [[ $(ls "$OUT/$case") == "iter_0000002"$'\n'"latest_checkpointed_iteration.txt" ]] || fail "$case: files written: $(ls "$OUT/$case")"
done
echo "ckpt_use_checkpoint_args: $n passed, 0 failed"
