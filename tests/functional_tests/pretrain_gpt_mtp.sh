#!/usr/bin/env bash
# pretrain_gpt --mtp-num-layers end to end (docs/training.md, Multi-token prediction):
#  * the iteration line carries Megatron's "mtp_<k> loss" fields after "lm loss", TensorBoard gets
#    "mtp_<k> loss", "mtp_<k>_acceptance_rate", "mtp_<k>_cumulative_acceptance_rate" every iteration;
#  * a tiny LLaMA with dropout and D = 2: 8 iterations straight vs 4 + --load + 4 print identical
#    lm and MTP losses and grad norms (the MTP parameters are checkpointed and resume bitwise; the
#    resumed run's second line prints the mean of its first two iterations, as Megatron);
#  * PP2 (mpirun; MTP and the shared-embedding copy on the last stage, tied weights, distributed
#    optimizer) prints the single-rank run's lm loss, MTP loss and grad norm (1e-5 / printed unit),
#    and its checkpoint resumed by one process continues like the uninterrupted run;
#  * refused: learned absolute positions, --mtp-num-layers -1, uniform recompute of 2 layers, and
#    the MTP flags not implemented (--mtp-use-repeated-layer): one "error:" line, non-zero exit.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
OUT=$LOGDIR
ARGS=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
      --swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights
      --disable-bias-linear --attention-dropout 0.1 --hidden-dropout 0.1
      --micro-batch-size 2 --global-batch-size 4 --train-iters 8 --lr 3e-3 --min-lr 3e-4
      --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --seed 1234
      --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$OUT/cache"
      --log-interval 1 --eval-interval 4 --eval-iters 1 --mtp-num-layers 2 --mtp-loss-scaling-factor 0.2)
dump() { for f in "$OUT"/*.log; do echo "== $f"; tail -30 "$f"; done; fail "$*"; }

"$BIN/pretrain_gpt" "${ARGS[@]}" --save "$OUT/straight" --save-interval 100 --tensorboard-dir "$OUT/tb" \
  > "$OUT/a.log" 2>&1 || dump "straight run"
"$BIN/pretrain_gpt" "${ARGS[@]}" --save "$OUT/resume" --save-interval 100 --exit-interval 4 > "$OUT/b1.log" 2>&1 \
  || dump "first half"
"$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/resume" --save "$OUT/resume" --save-interval 100 > "$OUT/b2.log" 2>&1 \
  || dump "resumed run"

grep -qE ' lm loss: [0-9.E+-]+ \| mtp_1 loss: [0-9.E+-]+ \| mtp_2 loss: [0-9.E+-]+ \| loss scale: ' "$OUT/a.log" \
  || dump "no 'mtp_1 loss | mtp_2 loss' fields after lm loss"
fields() { grep " iteration        $2/       8 " "$1" | sed 's/.*\(consumed samples: *[0-9]*\).*\(lm loss: .*\)loss scale.*\(grad norm: [^|]*\).*/\1 \2 \3/'; }
# Iteration 6, the resumed run's second line, prints the mean of 5 and 6 (lm and MTP losses; Megatron's
# first logged iteration does not reset the interval): within print rounding of the straight run's.
RESUMED=(python3 "$SRC/tests/functional_tests/support/resumed_log.py" compare)
"${RESUMED[@]}" "$OUT/a.log" "$OUT/b2.log" --iterations 5-8 \
  --fields 'consumed samples,lm loss,mtp_1 loss,mtp_2 loss,grad norm' --name "resumed run" || dump "resumed run differs"
echo "exact resume with MTP: iterations 5..8 identical ($(fields "$OUT/a.log" 8))"

if command -v protoc >/dev/null && /usr/bin/python3 -c 'import google.protobuf' 2>/dev/null; then
  ev=$(ls "$OUT"/tb/events.out.tfevents.*)
  /usr/bin/python3 "$SRC/tests/reference/tensorboard/read_events.py" "$ev" > "$OUT/tb.txt" || dump "event file unreadable"
  for it in 1 2 3 4 5 6 7 8; do
    for tag in "mtp_1 loss" "mtp_2 loss" "mtp_1_acceptance_rate" "mtp_2_cumulative_acceptance_rate"; do
      grep -qE "^step $it .* $tag=" "$OUT/tb.txt" || dump "TensorBoard has no '$tag' at step $it"
    done
  done
  echo "TensorBoard: mtp_<k> loss / acceptance-rate tags at every iteration"
else
  echo "TensorBoard check skipped: python3-protobuf or protoc not installed"
fi

# PP2 vs one rank (tied output layer: the last stage's embedding copy is also the output weight).
PP=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
    --position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0
    --micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 3e-3 --seed 1234
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$OUT/cache"
    --log-interval 1 --eval-interval 100 --eval-iters 1 --mtp-num-layers 1 --use-distributed-optimizer)
"$BIN/pretrain_gpt" "${PP[@]}" > "$OUT/pp1.log" 2>&1 || dump "single-rank run for PP2"
timeout 600 "${MPIRUN[@]}" -np 2 "$BIN/pretrain_gpt" "${PP[@]}" --pipeline-model-parallel-size 2 > "$OUT/pp2.log" 2>&1 \
  || dump "PP2 run"
summary() { sed -n 's/.* iteration *\([0-9]*\)\/.*lm loss: \([^ ]*\) | mtp_1 loss: \([^ ]*\) |.*grad norm: \([^ ]*\) |.*/\1 \2 \3 \4/p' "$1"; }
python3 - <(summary "$OUT/pp1.log") <(summary "$OUT/pp2.log") <<'PY' || dump "PP2 differs from one rank"
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
assert len(a) == 4 and len(b) == 4, (a, b)
for x, y in zip(a, b):
    for i, (u, v) in enumerate(zip(x, y)):
        tol = 1e-3 if i == 3 else 1e-5 * abs(float(u))
        assert abs(float(u) - float(v)) <= tol, (x, y)
PY
echo "PP2 with MTP on the last stage: lm loss, mtp_1 loss and grad norm equal the single-rank run"

# Resharding: a PP2 checkpoint (the last stage's embedding copy saved as a replica) resumed by one
# process continues like an uninterrupted single-rank run.
"$BIN/pretrain_gpt" "${PP[@]}" --train-iters 6 > "$OUT/rs1.log" 2>&1 || dump "single-rank 6 iterations"
timeout 600 "${MPIRUN[@]}" -np 2 "$BIN/pretrain_gpt" "${PP[@]}" --train-iters 6 --pipeline-model-parallel-size 2 \
  --save "$OUT/pp2ckpt" --save-interval 100 --exit-interval 4 > "$OUT/rs2.log" 2>&1 || dump "PP2 run saving at 4"
"$BIN/pretrain_gpt" "${PP[@]}" --train-iters 6 --load "$OUT/pp2ckpt" > "$OUT/rs3.log" 2>&1 || dump "one rank resuming the PP2 checkpoint"
"${RESUMED[@]}" "$OUT/rs1.log" "$OUT/rs3.log" --iterations 5-6 --fields 'lm loss,mtp_1 loss,grad norm' \
  --tol 'lm loss=rel:1e-5' --tol 'mtp_1 loss=rel:1e-5' --tol 'grad norm=abs:1e-3' --name "PP2 -> one rank" \
  || dump "PP2 -> one rank resume differs"
echo "PP2 checkpoint resumed on one rank: iterations 5, 6 equal the uninterrupted run"

expect_error() {  # expect_error NAME PATTERN args... (one distinct "error:" line; ranks may each print it)
  local name=$1 pat=$2; shift 2
  if ${EXPECT_LAUNCH:-} "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" > "$OUT/err.log" 2>&1; then dump "$name accepted"; fi
  [[ $(grep '^error: ' "$OUT/err.log" | sort -u | wc -l) -eq 1 ]] && grep -q "^error: .*$pat" "$OUT/err.log" || dump "$name: no one-line error matching '$pat'"
}
expect_error "learned absolute positions" "not supported with learned_absolute" --position-embedding-type learned_absolute
expect_error "negative --mtp-num-layers" "mtp-num-layers.*must be >= 0" --mtp-num-layers -1
expect_error "uniform recompute of 2 layers" "recompute-num-layers 1" --recompute-granularity full --recompute-method uniform --recompute-num-layers 2
expect_error "--mtp-use-repeated-layer" "mtp-use-repeated-layer" --mtp-use-repeated-layer
# eh_proj splits --hidden-size by TP (EXPECT_LAUNCH: two ranks, each printing the same line); this was an error
# naming mtp.layers.0.eh_proj.weight.
EXPECT_LAUNCH="${MPIRUN[*]} -np 2" expect_error "hidden size 33 with TP 2" \
  "--mtp-num-layers needs --hidden-size (33) divisible by --tensor-model-parallel-size (2)" \
  --hidden-size 33 --kv-channels 8 --tensor-model-parallel-size 2
echo "refused MTP configurations: one error line each"
