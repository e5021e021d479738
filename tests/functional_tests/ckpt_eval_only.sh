#!/usr/bin/env bash
# pretrain_gpt --skip-train (evaluation only) of a checkpoint saved under another layout
# (issue 12: reshard to one GPU for evaluation). A tiny fp32 GPT on mock data (dropout 0) trains
# 4 iterations under TP2 and, separately, DP2 with the distributed optimizer, evaluating at
# iteration 4 (--eval-interval 4 --eval-iters 2) and saving there. One process then loads each
# checkpoint with --skip-train --no-load-optim --no-load-rng and evaluates.
#  * Its "validation loss at iteration 4 on validation set" must equal the training run's
#    "validation loss at iteration 4 |" (the same weights on the same first 2 validation batches:
#    the eval-only run starts the validation data at sample 0, as the first in-training
#    evaluation does) within 1e-6 relative. Why 1e-6: TP2 vs one rank differ only in fp32
#    summation order (~1e-7 relative) and the line prints 7 significant digits (one printed unit
#    at a loss of ~4.8 is 2e-7 relative); a wrongly resharded weight moves the loss by >= 1e-3.
#  * Memory: the eval-only run's "allocated bytes" line must show 0 bytes of main grads and
#    optimizer state, and its total must be below 1/3 of the training layout's total over both
#    ranks (training: parameters + fp32 grads + Adam m and v = 4x the parameters).
#  * Also: without --no-load-optim/--no-load-rng (the checkpoint's schedule must not be applied),
#    and evaluation under PP2 (two ranks) of the TP2 checkpoint: same loss.
# Args: bin dir, source dir.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --log-interval 1 --eval-interval 4 --eval-iters 2 --distributed-backend nccl)

launch() {  # launch NP LOG ARGS...
  local np=$1 log=$2; shift 2
  local l=()
  [ "$np" -gt 1 ] && l=("${MPIRUN[@]}" -np "$np")
  timeout 180 "${l[@]}" "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" >"$log" 2>&1 \
    || { tail -30 "$log" >&2; fail "$(basename "$log" .log) exited with status $?"; }
}
val() {  # val LOG PATTERN: the lm loss value of the first validation line matching PATTERN
  grep -E "validation loss at $2" "$1" | head -1 | sed -n 's/.*lm loss value: \([0-9.E+-]*\).*/\1/p'
}
alloc_total() {  # alloc_total LOG: sum over ranks of parameters + main grads + optimizer state bytes
  grep 'allocated bytes: parameters' "$1" |
    sed 's/.*parameters \([0-9]*\) | main grads \([0-9]*\) | optimizer state \([0-9]*\).*/\1 \2 \3/' |
    awk '{t += $1 + $2 + $3} END {print t + 0}'
}
close() {  # close A B: |a-b| <= 1e-6 |a|
  python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-6*abs(a) else 1)" "$1" "$2"
}
check() {  # check NAME NP LAYOUT...: train + save under LAYOUT, evaluate on one rank
  local name=$1 np=$2; shift 2
  launch "$np" "$LOGDIR/$name.log" "$@" --train-iters 4 --save "$LOGDIR/$name" --save-interval 4
  local ref; ref=$(val "$LOGDIR/$name.log" 'iteration 4 \|')
  [ -n "$ref" ] || fail "$name: no validation line at iteration 4"
  launch 1 "$LOGDIR/${name}_eval.log" --skip-train --load "$LOGDIR/$name" --no-load-optim --no-load-rng
  local log="$LOGDIR/${name}_eval.log" got
  grep -q 'successfully loaded checkpoint from .* at iteration 4' "$log" || { tail -20 "$log" >&2; fail "$name: no load line"; }
  grep -q 'skipping training (--skip-train is on)' "$log" || fail "$name: no skip-train line"
  got=$(val "$log" 'iteration 4 on validation set')
  [ -n "$got" ] || { tail -20 "$log" >&2; fail "$name: eval-only run printed no validation line"; }
  close "$ref" "$got" || fail "$name: eval-only validation loss $got vs $ref of the training run (> 1e-6 relative)"
  grep -q 'allocated bytes: parameters [0-9]* | main grads 0 | optimizer state 0$' "$log" ||
    fail "$name: eval-only run allocated grads or optimizer state: $(grep 'allocated bytes' "$log")"
  local te tt; te=$(alloc_total "$log"); tt=$(alloc_total "$LOGDIR/$name.log")
  [ "$te" -gt 0 ] && [ $((te * 3)) -lt "$tt" ] || fail "$name: eval-only allocates $te bytes vs training $tt (want < 1/3)"
  echo "OK $name: eval-only validation loss $got = training's $ref; allocated $te bytes vs $tt training"
}
check tp2 2 --tensor-model-parallel-size 2
check dp2_distopt 2 --use-distributed-optimizer
# Without --no-load-optim / --no-load-rng: the checkpoint's optimizer state and schedule are not
# needed and must not be applied (no "learning rate does not match" error), same loss.
launch 1 "$LOGDIR/plain_eval.log" --skip-train --load "$LOGDIR/tp2"
got=$(val "$LOGDIR/plain_eval.log" 'iteration 4 on validation set')
ref=$(val "$LOGDIR/tp2.log" 'iteration 4 \|')
[ -n "$got" ] && close "$ref" "$got" || fail "eval-only without --no-load-optim: '$got' vs '$ref'"
echo "OK eval-only without --no-load-optim: $got"
# Evaluation only under another multi-rank layout (PP2) of the TP2 checkpoint: same loss, and
# no rank allocates grads or optimizer state.
launch 2 "$LOGDIR/pp2_eval.log" --skip-train --load "$LOGDIR/tp2" --pipeline-model-parallel-size 2
got=$(val "$LOGDIR/pp2_eval.log" 'iteration 4 on validation set')
[ -n "$got" ] && close "$ref" "$got" || fail "eval-only under PP2: '$got' vs '$ref'"
[ "$(grep -c 'allocated bytes: parameters [0-9]* | main grads 0 | optimizer state 0$' "$LOGDIR/pp2_eval.log")" = 2 ] ||
  fail "eval-only under PP2: grads or optimizer state allocated: $(grep 'allocated bytes' "$LOGDIR/pp2_eval.log")"
echo "OK eval-only under PP2: $got"
echo "PASS ckpt_eval_only"
