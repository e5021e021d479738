#!/usr/bin/env bash
# Megatron-LM torch_dist (PyTorch DCP) checkpoints (issue 25), checked against an independent
# reading/writing with Python's standard library (tests/reference/torch_dist/dcp_stdlib.py:
# pickle with stand-in classes named like torch's, zipfile; no torch here):
#  1. --ckpt-format torch_dist writes a checkpoint whose every tensor (read by Python from .metadata
#     and the chunks' torch.save archives) equals the same run's own-format checkpoint, args pickled
#     as argparse.Namespace, _extra_state objects present;
#  2. a checkpoint written by Python in Megatron's layout (chunks split differently, pickle
#     protocol 4, TE-fused layer-norm names / distributed-optimizer key names, the step in
#     Megatron's common state) loads with --load and continues with the same lm loss, learning
#     rate and grad norm (exact strings) as continuing from our own format: weights, Adam state,
#     step and schedule all arrive; and our own torch_dist checkpoint resumes exactly too;
#  3. several ranks (mpirun): TP2 and DP2 + distributed optimizer torch_dist saves load like
#     their own-format saves;
#  4. bad input: truncated .distcp, a pickle naming os.system, an MoE key: one error line naming
#     the file and key, exit status 1.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
SRC=$2
PY="python3 $SRC/tests/reference/torch_dist/dcp_stdlib.py"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
ARGS=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
      --micro-batch-size 2 --global-batch-size 4 --train-iters 8 --lr 3e-3 --min-lr 3e-4
      --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
      --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$OUT/cache"
      --log-interval 1 --eval-interval 100 --eval-iters 1 --save-interval 100)
fail() { for f in "$OUT"/*.log; do echo "== $f"; tail -5 "$f"; done; echo "FAIL: $*"; exit 1; }
fields() { grep " iteration        $2/       8 " "$1" |
           sed 's/.*\(learning rate: [^|]*\).*\(lm loss: [^|]*\).*\(grad norm: [^|]*\).*/\1 \2 \3/'; }
same_tail() {  # iterations 5..8 of $1 and $2 print the same fields
  for it in 5 6 7 8; do
    a=$(fields "$1" $it); b=$(fields "$2" $it)
    [[ -n "$a" && "$a" == "$b" ]] || fail "iteration $it differs: '$a' vs '$b' ($1, $2)"
  done
}

"$BIN/pretrain_gpt" "${ARGS[@]}" --save "$OUT/ours" --exit-interval 4 > "$OUT/ours.log" 2>&1 || fail "own-format save"
"$BIN/pretrain_gpt" "${ARGS[@]}" --save "$OUT/td" --exit-interval 4 --ckpt-format torch_dist > "$OUT/td.log" 2>&1 || fail "torch_dist save"
[[ -f "$OUT/td/iter_0000004/__0_0.distcp" && -f "$OUT/td/iter_0000004/common.pt" ]] || fail "no .distcp / common.pt"
$PY compare "$OUT/td/iter_0000004" "$OUT/ours/iter_0000004" > "$OUT/cmp.log" 2>&1 || fail "Python reading of our torch_dist checkpoint"

"$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/ours" --save "$OUT/r0" > "$OUT/r0.log" 2>&1 || fail "resume from own format"
"$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/td" --save "$OUT/r1" > "$OUT/r1.log" 2>&1 || fail "resume from our torch_dist"
same_tail "$OUT/r0.log" "$OUT/r1.log"
# A Megatron checkpoint's RNG state (torch generators) is not used: compare with --no-load-rng.
"$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/ours" --save "$OUT/r3" --no-load-rng > "$OUT/r3.log" 2>&1 || fail "resume without RNG"
for v in --te-names --distopt; do
  rm -rf "$OUT/py"; mkdir -p "$OUT/py"
  $PY convert "$OUT/ours/iter_0000004" "$OUT/py/iter_0000004" $v > "$OUT/conv.log" 2>&1 || fail "Python writer $v"
  printf 4 > "$OUT/py/latest_checkpointed_iteration.txt"
  "$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/py" --save "$OUT/r2" > "$OUT/r2.log" 2>&1 || fail "resume from Python's torch_dist ($v)"
  grep -q 'RNG state of a Megatron-LM torch_dist checkpoint' "$OUT/r2.log" || fail "no RNG note for a Megatron checkpoint"
  same_tail "$OUT/r3.log" "$OUT/r2.log"
done

# convert_checkpoint --loader torch_dist exports the same Hugging Face files as from our format.
"$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$OUT/ours" --save-dir "$OUT/hf0" > "$OUT/hf0.log" 2>&1 || fail "HF export (ours)"
"$BIN/convert_checkpoint" --loader torch_dist --saver hf --load-dir "$OUT/td" --save-dir "$OUT/hf1" > "$OUT/hf1.log" 2>&1 || fail "HF export (torch_dist)"
cmp "$OUT/hf0/model.safetensors" "$OUT/hf1/model.safetensors" || fail "HF export from torch_dist differs"
cmp "$OUT/hf0/config.json" "$OUT/hf1/config.json" || fail "HF config from torch_dist differs"

# Several ranks (mpirun, CPU): TP2 and DP2 + distributed optimizer (whose flat ranges are written
# as boxes) save torch_dist; one rank loads each and continues exactly like loading the same
# run's own-format checkpoint.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPI=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -np 2)
export OMP_NUM_THREADS=1
for lay in "--tensor-model-parallel-size 2" "--use-distributed-optimizer"; do
  for fmt in own td; do
    extra=(); [[ $fmt == td ]] && extra=(--ckpt-format torch_dist)
    rm -rf "$OUT/m_$fmt"
    "${MPI[@]}" "$BIN/pretrain_gpt" "${ARGS[@]}" $lay --hidden-dropout 0 --attention-dropout 0 --distributed-backend nccl \
      --make-vocab-size-divisible-by 64 --save "$OUT/m_$fmt" --exit-interval 4 "${extra[@]}" > "$OUT/m_$fmt.log" 2>&1 || fail "mpirun save $fmt ($lay)"
    "$BIN/pretrain_gpt" "${ARGS[@]}" --hidden-dropout 0 --attention-dropout 0 --make-vocab-size-divisible-by 64 \
      --load "$OUT/m_$fmt" --save "$OUT/ml_$fmt" --no-load-rng > "$OUT/ml_$fmt.log" 2>&1 || fail "load $fmt ($lay)"
  done
  same_tail "$OUT/ml_own.log" "$OUT/ml_td.log"
done

bad() {  # $1: name, $2: expected text; the last run must fail with one error line containing it
  if "$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/bad" > "$OUT/$1.log" 2>&1; then fail "$1 accepted"; fi
  [[ $(grep -c '^error: ' "$OUT/$1.log") -eq 1 ]] || fail "$1: not one error line"
  grep '^error: ' "$OUT/$1.log" | grep -qF "$2" || fail "$1: error does not say '$2': $(grep '^error: ' "$OUT/$1.log")"
}
cp -r "$OUT/td" "$OUT/bad"
truncate -s 100000 "$OUT/bad/iter_0000004/__0_0.distcp"
bad truncated "__0_0.distcp"
rm -rf "$OUT/bad"; cp -r "$OUT/td" "$OUT/bad"
python3 - "$OUT/bad/iter_0000004/.metadata" <<'PY'
import sys
p = sys.argv[1]
open(p, 'wb').write(b'\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R.')
PY
bad evil_global "pickle global os.system is not allowed"
rm -rf "$OUT/bad"; mkdir -p "$OUT/bad"
$PY convert "$OUT/ours/iter_0000004" "$OUT/bad/iter_0000004" > /dev/null
printf 4 > "$OUT/bad/latest_checkpointed_iteration.txt"
python3 - "$SRC/tests/reference/torch_dist" "$OUT/bad/iter_0000004" <<'PY'
import pickle, sys
sys.path.insert(0, sys.argv[1])
import dcp_stdlib as d
p = sys.argv[2] + '/.metadata'
md = pickle.load(open(p, 'rb'))
md.state_dict_metadata['decoder.layers.mlp.experts.linear_fc1.weight'] = md.state_dict_metadata['decoder.layers.mlp.linear_fc1.weight']
pickle.dump(md, open(p, 'wb'), protocol=4)
PY
bad moe "decoder.layers.mlp.experts.linear_fc1.weight"
echo "PASS: torch_dist checkpoints (Python stdlib cross-check, resume, bad input)"
