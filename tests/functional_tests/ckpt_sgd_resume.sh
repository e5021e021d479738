#!/usr/bin/env bash
# --optimizer sgd exact resume: SGD's momentum buffers (torch.optim.SGD state "momentum_buffer")
# are saved as "optimizer.state.momentum_buffer.<param key>" and restored.
#  * Single rank, bf16 model (fp32 main params): 8 iterations straight vs 4 (--exit-interval 4
#    saves) + --load + 4 more: iterations 5..8 (consumed samples, lr, lm loss, grad norm as printed)
#    and the final validation loss bitwise identical (iteration 6, the resumed run's second line, prints
#    the mean of 5 and 6 as Megatron: within print rounding of the straight run's mean,
#    tests/functional_tests/support/resumed_log.py). Also with --sgd-momentum 0 (no buffers saved).
#  * Control: the same resume with --no-load-optim must print a different iteration-6 loss (the
#    momentum is what the comparison sees).
#  * Distributed optimizer (dropout 0): DP2 with --use-distributed-optimizer saves at iteration 2 (each rank
#    its flat ranges of the buffers); DP2 resumes bitwise, and 1 rank without the distributed
#    optimizer loads it (resharded) and matches iterations 3 and 4 within 1e-6 relative (fp32
#    summation order differs between layouts, ~1e-7; the log prints 7 significant digits).
# Args: bin dir, source dir.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
ARGS=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
      --micro-batch-size 2 --global-batch-size 4 --train-iters 8 --lr 3e-2 --min-lr 3e-3
      --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
      --optimizer sgd --sgd-momentum 0.9
      --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
      --log-interval 1 --eval-interval 4 --eval-iters 1 --distributed-backend nccl)
run() {  # run NP LOG ARGS...
  local np=$1 log=$2; shift 2
  local l=()
  [ "$np" -gt 1 ] && l=("${MPIRUN[@]}" -np "$np")
  timeout 180 "${l[@]}" "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" >"$log" 2>&1 \
    || { tail -30 "$log" >&2; fail "$(basename "$log" .log) exited with status $?"; }
}
fields() {  # fields LOG IT TOTAL
  grep -E "\] iteration +$2/ +$3 \|" "$1" |
    sed 's/.*\(consumed samples: *[0-9]*\).*\(learning rate: [^|]*\).*\(lm loss: [^|]*\).*\(grad norm: [^|]*\).*/\1 \2 \3 \4/'
}
loss() { grep -E "\] iteration +$2/ +$3 \|" "$1" | head -1 | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p'; }
# The resumed run's second line prints the mean of its first two iterations (Megatron's first logged
# iteration does not reset the interval): tests/functional_tests/support/resumed_log.py compares it.
RESUMED=(python3 "$SRC/tests/functional_tests/support/resumed_log.py")
FIELDS='consumed samples,learning rate,lm loss,grad norm'
has_key() { grep -rqa "$2" "$1"; }  # has_key DIR STRING: the string occurs in the checkpoint's files

exact_resume() {  # exact_resume NAME ARGS...: 8 straight vs 4 + resume 4, single rank
  local name=$1; shift
  run 1 "$LOGDIR/$name.a.log" "$@" --save "$LOGDIR/$name.a" --save-interval 100
  run 1 "$LOGDIR/$name.b1.log" "$@" --save "$LOGDIR/$name.b" --save-interval 100 --exit-interval 4
  run 1 "$LOGDIR/$name.b2.log" "$@" --load "$LOGDIR/$name.b" --save "$LOGDIR/$name.b" --save-interval 100
  grep -q 'successfully loaded checkpoint from .* at iteration 4' "$LOGDIR/$name.b2.log" || fail "$name: no load line"
  local a b
  "${RESUMED[@]}" compare "$LOGDIR/$name.a.log" "$LOGDIR/$name.b2.log" --iterations 5-8 --fields "$FIELDS" --name "$name" \
    || fail "$name: the resumed run differs from the straight run"
  a=$(grep 'validation loss at iteration 8 on validation set' "$LOGDIR/$name.a.log")
  b=$(grep 'validation loss at iteration 8 on validation set' "$LOGDIR/$name.b2.log")
  [ -n "$a" ] && [ "$a" == "$b" ] || fail "$name: final validation differs: '$a' vs '$b'"
  echo "OK $name: iterations 5..8 identical after resume (6: the mean of 5 and 6): $(fields "$LOGDIR/$name.b2.log" 8 8)"
}

exact_resume sgd_bf16 --bf16
has_key "$LOGDIR/sgd_bf16.b/iter_0000004" 'optimizer.state.momentum_buffer.decoder.layers.mlp.linear_fc1.weight' \
  || fail "no optimizer.state.momentum_buffer.* key in the SGD checkpoint"
! has_key "$LOGDIR/sgd_bf16.b/iter_0000004" 'optimizer.state.exp_avg' || fail "SGD checkpoint has Adam state"
exact_resume sgd_mom0 --sgd-momentum 0
! has_key "$LOGDIR/sgd_mom0.b/iter_0000004" 'momentum_buffer' || fail "--sgd-momentum 0 checkpoint has momentum buffers"

# Control: without the optimizer state the momentum is lost and iteration 6 moves.
run 1 "$LOGDIR/nooptim.log" --bf16 --load "$LOGDIR/sgd_bf16.b" --ckpt-step 4 --no-load-optim
# (iteration 6 is the resumed run's second line: the mean of 5 and 6, compared with the straight run's)
a=$("${RESUMED[@]}" expected "$LOGDIR/sgd_bf16.a.log" --iterations 5-8 --field 'lm loss' --at 6); b=$(loss "$LOGDIR/nooptim.log" 6 8)
[ -n "$a" ] && [ -n "$b" ] || fail "control: no iteration 6 loss"
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) > 1e-6*abs(a) else 1)" "$a" "$b" \
  || fail "--no-load-optim: iteration 6 loss $b equals $a: the momentum is not what the resume test checks"
echo "OK control --no-load-optim: iteration 6 loss $b vs $a"

# Distributed optimizer, DP2: same-layout exact resume and a resharded load on 1 rank.
# (dropout 0: the per-rank dropout streams differ between DP2 and DP1)
D=(--train-iters 5 --eval-interval 1000 --global-batch-size 8 --attention-dropout 0.0 --hidden-dropout 0.0)
run 2 "$LOGDIR/dp2do.log" "${D[@]}" --use-distributed-optimizer --save "$LOGDIR/dp2do" --save-interval 2
run 2 "$LOGDIR/dp2do_resume.log" "${D[@]}" --use-distributed-optimizer --load "$LOGDIR/dp2do" --ckpt-step 2
"${RESUMED[@]}" compare "$LOGDIR/dp2do.log" "$LOGDIR/dp2do_resume.log" --iterations 3-5 --fields "$FIELDS" \
  --name dp2do_resume || fail "dp2do resume differs from the uninterrupted run"
echo "OK dp2do_resume: iterations 3..5 identical (4: the mean of 3 and 4)"
run 1 "$LOGDIR/dp2do_to_dp1.log" "${D[@]}" --load "$LOGDIR/dp2do" --ckpt-step 2 --exit-interval 4
grep -q 'successfully loaded checkpoint from .* at iteration 2' "$LOGDIR/dp2do_to_dp1.log" || fail "dp2do_to_dp1: no load line"
"${RESUMED[@]}" compare "$LOGDIR/dp2do.log" "$LOGDIR/dp2do_to_dp1.log" --iterations 3-4 --fields 'lm loss' \
  --tol 'lm loss=rel:1e-6' --name dp2do_to_dp1 || fail "dp2do_to_dp1: lm loss differs (> 1e-6 relative)"
echo "OK dp2do_to_dp1: iterations 3, 4 = $(loss "$LOGDIR/dp2do_to_dp1.log" 3 5), $(loss "$LOGDIR/dp2do_to_dp1.log" 4 5)"
# Control: the resharded load without the optimizer state moves iteration 4 by more than the
# tolerance (the momentum buffers are what the comparison above checks).
run 1 "$LOGDIR/dp2do_nooptim.log" "${D[@]}" --load "$LOGDIR/dp2do" --ckpt-step 2 --exit-interval 4 --no-load-optim
a=$("${RESUMED[@]}" expected "$LOGDIR/dp2do.log" --iterations 3-4 --field 'lm loss' --at 4); b=$(loss "$LOGDIR/dp2do_nooptim.log" 4 5)
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) > 1e-5*abs(a) else 1)" "$a" "$b" \
  || fail "dp2do --no-load-optim: iteration 4 loss $b too close to $a: the momentum is not what the check sees"
echo "OK control dp2do --no-load-optim: iteration 4 loss $b vs $a"
