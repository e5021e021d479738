#!/usr/bin/env bash
# pretrain_gpt data parallel and tensor parallel under mpirun and megatron_launch: the tiny GPT on
# mock data, 4 iterations of global batch 8, run as one rank, as DP2 (mpirun), DP2 with
# --use-distributed-optimizer (mpirun), TP2 (mpirun), DP2 under megatron_launch (TCP backend), and
# DP2 + distributed optimizer with --calculate-per-token-loss against its own single-rank run.
# Every printed per-iteration lm loss and the validation/test losses must equal the single-rank run
# within 1e-5 relative: the runs differ only in fp32 summation order (a few ulp, ~1e-7 relative)
# and the log prints 7 significant digits (rounding <= 5e-7 relative), so 1e-5 leaves a wide
# margin while any wrong scaling (1/DP, micro-batch count, slicing) shows as >= 1e-2. The grad
# norm is printed with 3 decimals only: it must agree within one printed unit (1e-3 absolute).
# --make-vocab-size-divisible-by 64 keeps the padded vocab at 128 for TP1 and TP2 (docs/megatron-reference.md#vocab-padding), so both
# are the same model.
# Global batch size and consumed samples must be equal as integers. The log lines must come from
# exactly one rank (Megatron's print_rank_last).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/train_log.inc"  # log_summary, summaries_equal
ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --log-interval 1 --eval-interval 2 --eval-iters 1 --distributed-backend nccl)

run() {  # run NAME LAUNCHER... -- EXTRA ARGS
  local name=$1; shift
  run_pretrain_gpt "$name" 120 "$@"
}

# Extracts "iteration consumed gbs loss gradnorm" per training line and the validation values.
summary() { log_summary "$1"; }

compare() {  # compare NAME [REF]: against the single-rank run REF (default single)
  summaries_equal "$LOGDIR/${2:-single}.sum" "$LOGDIR/$1.sum" "$1"
}

run single env --
summary "$LOGDIR/single.log" >"$LOGDIR/single.sum"
run dp2 "${MPIRUN[@]}" -np 2 --
run dp2_distopt "${MPIRUN[@]}" -np 2 -- --use-distributed-optimizer
run tp2 "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2
run dp2_launch "$BIN/megatron_launch" --nproc-per-node 2 --master-port "$(free_port)" --
for name in dp2 dp2_distopt tp2 dp2_launch; do
  summary "$LOGDIR/$name.log" >"$LOGDIR/$name.sum"
  compare $name || { cat "$LOGDIR/single.sum" "$LOGDIR/$name.sum" >&2; fail "$name differs from the single-rank run"; }
  n=$(grep -c '\] iteration ' "$LOGDIR/$name.log")
  [ "$n" = 4 ] || fail "$name: $n training log lines (expected 4: printed by the last rank only)"
  echo "$name: lm loss, grad norm, consumed samples, global batch size and validation losses equal the single-rank run"
done
# --calculate-per-token-loss: grads scaled by 1/(tokens summed over DP) instead of 1/DP.
run single_ptl env -- --calculate-per-token-loss
run dp2_ptl "${MPIRUN[@]}" -np 2 -- --calculate-per-token-loss --use-distributed-optimizer
summary "$LOGDIR/single_ptl.log" >"$LOGDIR/single_ptl.sum"
summary "$LOGDIR/dp2_ptl.log" >"$LOGDIR/dp2_ptl.sum"
compare dp2_ptl single_ptl || fail "DP2 with --calculate-per-token-loss differs from the single-rank run"
echo "dp2 + --calculate-per-token-loss + --use-distributed-optimizer: equal to the single-rank run"
grep -q 'data-parallel size: 2' "$LOGDIR/dp2.log" || fail "dp2: no 'data-parallel size: 2' line"

# Unsupported layouts are one clear error naming the flag.
for bad in "--context-parallel-size 2 --cp-comm-type allgather:--cp-comm-type"; do
  flags=${bad%%:*} want=${bad##*:}
  # shellcheck disable=SC2086
  if timeout 60 "${MPIRUN[@]}" -np 2 "$BIN/pretrain_gpt" "${ARGS[@]}" $flags >"$LOGDIR/bad.log" 2>&1; then
    fail "$flags was accepted"
  fi
  grep -q "^error: $want" "$LOGDIR/bad.log" || { cat "$LOGDIR/bad.log" >&2; fail "$flags: no error naming $want"; }
done
echo "--cp-comm-type allgather: rejected with an error naming the flag (PP/SP/CP: pretrain_gpt_pipeline.sh, pretrain_gpt_cp.sh)"
