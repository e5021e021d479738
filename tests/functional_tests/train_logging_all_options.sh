#!/usr/bin/env bash
# Every logging / TensorBoard / timer option at once, with evaluation, checkpointing, --log-progress
# and the exit flags, under TP2, PP2 and DP2 + distributed optimizer (mpirun, 2 ranks each) and on
# one rank. Guards issue 20 items 1, 3 (exit/progress flags), 4 and 7:
#  1. no rank may reach a collective that another rank skips (the params norm inside the last
#     rank's TensorBoard block hung TP2/PP2/DP2 at iteration 1): each run must finish within its
#     timeout (a hang is reported as such);
#  4. the TensorBoard event file holds exactly Megatron's tags for these options (the list below is
#     read off Megatron-LM's training.py training_log / evaluate_and_print_results and
#     core/timers.py Timers.write, not produced by our code), at the steps Megatron writes them;
#  3. --exit-duration-in-mins 0 is off (Megatron's `if args.exit_duration_in_mins:`), --log-progress
#     writes <save>/progress.txt in Megatron's line format, --exit-interval saves and exits, and
#     --ckpt-format torch says what it writes;
#  7. a NaN loss (fp32 and bf16, one rank and DP2) stops with Megatron's message as a user error
#     (exit status 1, "error: ...", no "internal error").
# The TensorBoard tag check needs protoc and python3-protobuf (tb_python_reader.sh); without them
# it is reported as not run and the rest still runs.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
PY=/usr/bin/python3
HAVE_TB_READER=1
if ! command -v protoc >/dev/null || ! $PY -c 'import google.protobuf' 2>/dev/null; then HAVE_TB_READER=0; fi

BASE=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --make-vocab-size-divisible-by 64 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --distributed-backend nccl)
ALL=(--train-iters 4 --log-interval 1 --eval-interval 3 --eval-iters 1
  --log-params-norm --log-num-zeros-in-grad --log-throughput --log-timers-to-tensorboard
  --log-memory-to-tensorboard --log-world-size-to-tensorboard --log-validation-ppl-to-tensorboard
  --timing-log-level 2 --timing-log-option minmax --tensorboard-log-interval 1 --tensorboard-queue-size 3
  --save-interval 2 --log-progress --exit-signal-handler --exit-duration-in-mins 0)

run() {  # run NAME TIMEOUT LAUNCHER... -- ARGS...   (fails on a non-zero status, names a hang)
  local name=$1 t=$2; shift 2
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  local rc=0
  timeout "$t" "${launch[@]}" "$BIN/pretrain_gpt" "${BASE[@]}" "$@" >"$LOGDIR/$name.log" 2>&1 || rc=$?
  [ "$rc" = 124 ] && { tail -20 "$LOGDIR/$name.log" >&2; fail "$name: HANG (killed after ${t}s)"; }
  [ "$rc" = 0 ] || { tail -30 "$LOGDIR/$name.log" >&2; fail "$name exited with status $rc"; }
}

# Megatron's tags for this run. training_log: learning-rate, batch-size, the loss dict (lm loss),
# loss-scale, world-size, grad-norm, num-zeros, params-norm, each also "<tag> vs samples"; the four
# mem-* scalars (--log-memory-to-tensorboard); iteration-time and throughput
# (--log-timers-to-tensorboard; throughput with --log-throughput). Timers.write: "<timer>-time"
# for every timer of timers_to_log with a time > 0 on some rank. evaluate_and_print_results:
# "lm loss validation" (+ " vs samples", " ppl", " ppl vs samples").
TRAIN_TAGS="batch-size;batch-size vs samples;grad-norm;grad-norm vs samples;learning-rate;learning-rate vs samples
lm loss;lm loss vs samples;loss-scale;loss-scale vs samples;num-zeros;num-zeros vs samples;params-norm
params-norm vs samples;world-size;world-size vs samples;mem-allocated-bytes;mem-allocated-count
mem-max-allocated-bytes;mem-reserved-bytes;throughput;lm loss validation;lm loss validation vs samples
lm loss validation ppl;lm loss validation ppl vs samples"
LEVEL1_TIMERS="forward-backward-time;optimizer-time"
LEVEL2_TIMERS="batch-generator-time;forward-compute-time;backward-compute-time"

check_tags() {  # check_tags NAME TIMER_TAGS
  local name=$1 timers=$2 f
  f=$(ls "$LOGDIR/$name.tb"/events.out.tfevents.* 2>/dev/null) || fail "$name: no TensorBoard event file"
  [ "$(echo "$f" | wc -l)" = 1 ] || fail "$name: more than one event file (written by more than one rank?)"
  [ "$HAVE_TB_READER" = 1 ] || return 0
  $PY "$SRC/tests/reference/tensorboard/read_events.py" "$f" --tags >"$LOGDIR/$name.tags" || fail "$name: event file unreadable"
  sed -n '/^TAGS:$/,$p' "$LOGDIR/$name.tags" | sed '1d;$d' >"$LOGDIR/$name.tagrows"
  cut -f1 "$LOGDIR/$name.tagrows" | sort >"$LOGDIR/$name.got"
  { echo "$TRAIN_TAGS" | tr '\n' ';'; echo "iteration-time;$timers"; } | tr ';' '\n' | sed '/^$/d' | sort >"$LOGDIR/$name.want"
  diff "$LOGDIR/$name.want" "$LOGDIR/$name.got" >"$LOGDIR/$name.tagdiff" \
    || { cat "$LOGDIR/$name.tagdiff" >&2; fail "$name: TensorBoard tags differ from Megatron's ('<' missing, '>' extra)"; }
  steps() { awk -F'\t' -v t="$1" '$1 == t {print $3}' "$LOGDIR/$name.tagrows"; }
  [ "$(steps 'lm loss')" = "1,2,3,4" ] || fail "$name: lm loss at steps $(steps 'lm loss') (want 1,2,3,4)"
  [ "$(steps 'params-norm vs samples')" = "8,16,24,32" ] || fail "$name: params-norm vs samples at $(steps 'params-norm vs samples')"
  # Not on the first iteration (Megatron: `not is_first_iteration`).
  [ "$(steps 'iteration-time')" = "2,3,4" ] || fail "$name: iteration-time at steps $(steps 'iteration-time') (want 2,3,4)"
  # Periodic evaluation at 3, then the final validation AND test evaluations at 4.
  [ "$(steps 'lm loss validation')" = "3,4,4" ] || fail "$name: lm loss validation at $(steps 'lm loss validation') (want 3,4,4: test set included)"
  [ "$(steps 'forward-backward-time')" = "1,2,3,4" ] || fail "$name: forward-backward-time at $(steps 'forward-backward-time')"
}

check_log() {  # check_log NAME WORLD TIMERS_PER_BLOCK
  local name=$1 world=$2 ntimers=$3 log="$LOGDIR/$1.log"
  local n; n=$(grep -c '\] iteration ' "$log")
  [ "$n" = 4 ] || fail "$name: $n training log lines (want 4; --exit-duration-in-mins 0 must be off; printed by one rank)"
  for field in 'params norm: ' 'num zeros: ' 'throughput per GPU (TFLOP/s/GPU): ' 'grad norm: '; do
    [ "$(grep '\] iteration ' "$log" | grep -c "$field")" = 4 ] || fail "$name: '$field' missing from a training line"
  done
  # One "(min, max) time across ranks" block per logged iteration, with the measured timers.
  [ "$(grep -c '^    forward-backward \.*: (' "$log")" = 4 ] || fail "$name: forward-backward timer lines"
  [ "$(grep -cE '^    (forward-backward|optimizer|batch-generator|forward-compute|backward-compute) \.*: \(' "$log")" = $((4 * ntimers)) ] \
    || fail "$name: expected $ntimers timers per block"
  grep -q ' validation loss at iteration 3 | lm loss value' "$log" || fail "$name: no periodic validation at 3"
  grep -q ' validation loss at iteration 4 on validation set |' "$log" || fail "$name: no final validation"
  grep -q ' validation loss at iteration 4 on test set |' "$log" || fail "$name: no test-set evaluation"
  [ "$(grep -c 'saving checkpoint at iteration' "$log")" = 2 ] || fail "$name: expected saves at 2 and 4"
  grep -q 'internal error' "$log" && fail "$name: internal error"
  # progress.txt (Megatron's append_to_progress_log / compute_throughputs_and_append_to_progress_log).
  local p="$LOGDIR/$name.ckpt/progress.txt"
  [ -f "$p" ] || fail "$name: --log-progress wrote no $p"
  local ts='[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}'
  [ "$(wc -l <"$p")" = 3 ] || { cat "$p" >&2; fail "$name: progress.txt should have 3 lines"; }
  head -1 "$p" | grep -qP "^$ts\tJob ID: [^\t]*\t# GPUs: $world\tStarting job$" \
    || { cat "$p" >&2; fail "$name: bad 'Starting job' line"; }
  for it in 2 4; do
    grep -qP "^$ts\tJob ID: [^\t]*\t# GPUs: $world\tSaved checkpoint\tIteration: $it\tJob throughput: [0-9]+\.[0-9] TFLOP/s/GPU\tCumulative throughput: [0-9]+\.[0-9] TFLOP/s/GPU\tFloating-point operations: [0-9]\.[0-9]{2}e\+[0-9]{2}\tTokens \(in billions\): [0-9]+\.[0-9]{2}$" "$p" \
      || { cat "$p" >&2; fail "$name: bad 'Saved checkpoint' line for iteration $it"; }
  done
  # Tokens = consumed samples x seq length (iteration 4: 32 x 32 = 1024 -> 0.00 billion);
  # FLOPs grow linearly with the iterations: iteration 4's is twice iteration 2's (printed with 3 digits: 1%).
  awk -F'\t' '/Saved checkpoint/ {split($8, a, ": "); f[NR] = a[2]} END {if (f[3] / f[2] < 1.99 || f[3] / f[2] > 2.01) exit 1}' "$p" \
    || { cat "$p" >&2; fail "$name: floating-point operations at iteration 4 are not twice those at 2"; }
}

layout() {  # layout NAME NPROC TIMER_TAGS NTIMERS FLAGS...
  local name=$1 np=$2 timers=$3 ntimers=$4; shift 4
  local launch=(env)
  [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np")
  run "$name" 180 "${launch[@]}" -- "${ALL[@]}" --tensorboard-dir "$LOGDIR/$name.tb" --save "$LOGDIR/$name.ckpt" "$@"
  check_log "$name" "$np" "$ntimers"
  check_tags "$name" "$timers"
  echo "$name: finished; log lines, timers, evaluations, progress.txt and TensorBoard tags as Megatron's"
}

layout single 1 "$LEVEL1_TIMERS;$LEVEL2_TIMERS" 5
layout tp2 2 "$LEVEL1_TIMERS;$LEVEL2_TIMERS" 5 --tensor-model-parallel-size 2
# The pipeline schedule runs its micro-batches itself: only the level-1 timers are measured there.
layout pp2 2 "$LEVEL1_TIMERS" 2 --pipeline-model-parallel-size 2
layout dp2_distopt 2 "$LEVEL1_TIMERS;$LEVEL2_TIMERS" 5 --use-distributed-optimizer
[ "$HAVE_TB_READER" = 1 ] || echo "NOTE: TensorBoard tag check not run (protoc / python3-protobuf missing)"

# --exit-interval under DP2 with --exit-duration-in-mins far away and the signal handler on: saves
# at the exit iteration, says so, and skips the final evaluation (Megatron's sys.exit).
run exit_dp2 180 "${MPIRUN[@]}" -np 2 -- --train-iters 6 --log-interval 1 --eval-interval 2 --eval-iters 1 \
  --tensorboard-dir "$LOGDIR/exit.tb" --log-params-norm --save "$LOGDIR/exit.ckpt" --save-interval 100 \
  --exit-interval 3 --exit-duration-in-mins 10000 --exit-signal-handler --log-progress
grep -q 'exiting program at iteration 3' "$LOGDIR/exit_dp2.log" || fail "exit_dp2: no 'exiting program at iteration 3'"
[ "$(cat "$LOGDIR/exit.ckpt/latest_checkpointed_iteration.txt")" = 3 ] || fail "exit_dp2: no checkpoint at the exit iteration"
grep -q 'on test set' "$LOGDIR/exit_dp2.log" && fail "exit_dp2: evaluated after an exit condition"
grep -qP '\tSaved checkpoint\tIteration: 3\t' "$LOGDIR/exit.ckpt/progress.txt" || fail "exit_dp2: progress.txt lacks the exit save"
echo "exit_dp2: --exit-interval 3 saved, exited, no final evaluation"

# --ckpt-format torch: the save line says what is written (megatron.cpp's layout), not "torch".
# Noted flags print their line (the registry test checks every noted flag records its note).
run fmt_torch 120 env -- --train-iters 1 --eval-iters 0 --save "$LOGDIR/fmt.ckpt" --save-interval 1 --ckpt-format torch \
  --num-dataset-builder-threads 2 --vocab-extra-ids 3
for f in --num-dataset-builder-threads --vocab-extra-ids; do
  grep -q "^note: $f is accepted: " "$LOGDIR/fmt_torch.log" || fail "fmt_torch: no note for $f"
done
grep -q "in megatron.cpp's distributed (per-rank safetensors + metadata, not torch) format" "$LOGDIR/fmt_torch.log" \
  || { grep 'saving checkpoint' "$LOGDIR/fmt_torch.log" >&2; fail "fmt_torch: the save line does not say what is written"; }
grep -q ' in torch format' "$LOGDIR/fmt_torch.log" && fail "fmt_torch: claims torch format"
echo "--ckpt-format torch: the save line names the layout written"

# A diverging run (huge --lr, no clipping): Megatron's message, exit status 1, no internal error.
nan_run() {  # nan_run NAME LAUNCHER... -- FLAGS...
  local name=$1; shift
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  local rc=0
  timeout 120 "${launch[@]}" "$BIN/pretrain_gpt" "${BASE[@]}" --train-iters 6 --eval-iters 0 --lr 1e12 --clip-grad 0 \
    "$@" >"$LOGDIR/$name.log" 2>&1 || rc=$?
  [ "$rc" = 124 ] && fail "$name: HANG after a NaN loss"
  [ "$rc" = 1 ] || { tail -20 "$LOGDIR/$name.log" >&2; fail "$name: exit status $rc (want 1: a user error)"; }
  grep -qE "^(\[rank [0-9]+\] )?error: Rank [0-9]+, node [^,]+, device [^,]+, iteration [0-9]+: Unexpected result (nan|inf|-inf) \(message='found (NaN|Inf) in local forward loss calculation'\)" "$LOGDIR/$name.log" \
    || { tail -20 "$LOGDIR/$name.log" >&2; fail "$name: no Megatron NaN message"; }
  grep -q 'internal error' "$LOGDIR/$name.log" && fail "$name: reported as an internal error"
  echo "$name: NaN loss -> Megatron's message, exit 1"
}
nan_run nan_fp32 env --
nan_run nan_bf16 env -- --bf16
nan_run nan_dp2 "${MPIRUN[@]}" -np 2 --
echo "train_logging_all_options: all passed"
