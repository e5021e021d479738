#!/usr/bin/env bash
# Resuming with schedule flags that differ from the checkpoint's (Megatron's
# OptimizerParamScheduler.load_state_dict / _check_and_set): without a flag a clear error naming
# both flags; --use-checkpoint-opt_param-scheduler continues the saved schedule (the learning rate
# of iteration 3 equals that of the uninterrupted run with the saved flags);
# --override-opt_param-scheduler uses the new flags (a different learning rate).
# Args: <bin dir> <source dir>
set -euo pipefail
BIN=$(cd "$1" && pwd)
T=$(mktemp -d /tmp/ckpt_sched.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
A=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
   --micro-batch-size 2 --global-batch-size 4 --lr-decay-style cosine --lr-warmup-iters 1 --min-lr 3e-4
   --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --log-interval 1 --eval-iters 0
   --data-cache-path "$T/cache" --train-iters 4)
lr3() { sed -n 's/.*iteration \+3\/ .*learning rate: \([0-9.E+-]*\) .*/\1/p' "$1"; }
"$BIN/pretrain_gpt" "${A[@]}" --lr 3e-3 > "$T/straight.log" 2>&1 || { cat "$T/straight.log"; fail "straight run"; }
"$BIN/pretrain_gpt" "${A[@]}" --lr 3e-3 --exit-interval 2 --save "$T/ck" --save-interval 2 > "$T/save.log" 2>&1 \
  || { cat "$T/save.log"; fail "save run"; }
if "$BIN/pretrain_gpt" "${A[@]}" --lr 1e-1 --load "$T/ck" > "$T/mismatch.log" 2>&1; then fail "a changed --lr was accepted"; fi
grep -q "^error: OptimizerParamScheduler: class input value 0.1 and checkpoint value 0.003 for learning rate" "$T/mismatch.log" \
  || { cat "$T/mismatch.log"; fail "mismatch message"; }
grep -q -- "--use-checkpoint-opt_param-scheduler" "$T/mismatch.log" || fail "message does not name the flag"
"$BIN/pretrain_gpt" "${A[@]}" --lr 1e-1 --load "$T/ck" --use-checkpoint-opt_param-scheduler > "$T/use.log" 2>&1 \
  || { cat "$T/use.log"; fail "use-checkpoint run"; }
[ -n "$(lr3 "$T/straight.log")" ] && [ "$(lr3 "$T/use.log")" = "$(lr3 "$T/straight.log")" ] \
  || fail "use-checkpoint lr $(lr3 "$T/use.log") != straight $(lr3 "$T/straight.log")"
"$BIN/pretrain_gpt" "${A[@]}" --lr 1e-1 --load "$T/ck" --override-opt_param-scheduler > "$T/ovr.log" 2>&1 \
  || { cat "$T/ovr.log"; fail "override run"; }
[ "$(lr3 "$T/ovr.log")" != "$(lr3 "$T/straight.log")" ] || fail "override kept the checkpoint's lr"
if "$BIN/pretrain_gpt" "${A[@]}" --load "$T/ck" --lr 3e-3 --override-opt_param-scheduler --use-checkpoint-opt_param-scheduler \
  > "$T/both.log" 2>&1; then fail "both flags accepted"; fi
grep -q "^error: --override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler" "$T/both.log" || fail "both-flags message"
echo "ckpt_scheduler_flags: ok (lr at iteration 3: straight $(lr3 "$T/straight.log"), use-checkpoint $(lr3 "$T/use.log"), override $(lr3 "$T/ovr.log"))"
