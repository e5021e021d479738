#!/usr/bin/env bash
# pretrain_gpt checkpoint resharding matrix under mpirun (issue 8 items 2, 4, 6): a tiny fp32 GPT
# (4 layers)
# on mock data with dropout 0 is trained for 5 iterations under layout A, saving at iteration 2
# (and 4, 5). Layout B loads iteration 2 (--ckpt-step 2) and trains on. The reference is layout A's
# own uninterrupted run.
#  * Cross-layout: the lm loss of iteration 3 (depends on the weights) and of iteration 4 (depends
#    on the resharded fp32 main params and Adam m/v too) must equal layout A's within 1e-6
#    relative (iteration 4, the resumed run's second line, prints the mean of 3 and 4 as Megatron:
#    it is compared with the mean of layout A's two, the print rounding of the three values added
#    to the bound, tests/functional_tests/support/resumed_log.py; with iteration 3 checked on its
#    own, this bounds iteration 4's own loss to ~3e-6 relative). Why 1e-6: the layouts differ only
#    in fp32 summation order (~1e-7 relative) and the log prints 7 significant digits (one printed unit at a loss of ~4.5 is 2.2e-7 relative);
#    a wrongly placed shard or a lost optimizer state moves the loss by >= 1e-3 (the
#    --no-load-optim run below is the control: its iteration-4 loss must differ by > 1e-3).
#  * Same layout (TP2, DP2 with the distributed optimizer, PP2xDP2 with it, PP2 with two virtual
#    stages, and TP2xDP2 with dropout 0.1 so the per-rank RNG state matters): iterations 3..5 (consumed samples,
#    learning rate, lm loss, grad norm) and the final validation loss must be bitwise identical
#    as printed (iteration 4's lm loss: the mean of 3 and 4, within print rounding).
#  * --async-save under DP2: same losses as the synchronous run, and its checkpoint resumes exactly.
#  * --finetune loads the weights only and restarts at iteration 1 / sample 0; --no-load-rng loads.
# Args: bin dir, source dir.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
ARGS=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 8 --train-iters 5 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --log-interval 1 --eval-interval 1000 --eval-iters 1 --distributed-backend nccl)

source "$SRC/tests/functional_tests/ckpt_common.inc"  # launch, save_run (5 iterations, saves at 2, 4, 5), load_run
loss() {  # loss LOG IT
  grep -E "\] iteration +$2/ +5 \|" "$1" | head -1 | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p'
}
fields() {  # fields LOG IT: consumed samples, lr, lm loss, grad norm as printed
  grep -E "\] iteration +$2/ +5 \|" "$1" |
    sed 's/.*\(consumed samples: *[0-9]*\).*\(learning rate: [^|]*\).*\(lm loss: [^|]*\).*\(grad norm: [^|]*\).*/\1 \2 \3 \4/'
}
# A resumed run's second line (iteration 4) prints the mean of its first two iterations (Megatron's
# first logged iteration does not reset the interval): tests/functional_tests/support/resumed_log.py
# compares it with the mean of the uninterrupted run's two values (exact: within print rounding).
RESUMED=(python3 "$SRC/tests/functional_tests/support/resumed_log.py")
cross() {  # cross NAME REF: iterations 3 and 4 of NAME vs REF within 1e-6 relative
  "${RESUMED[@]}" compare "$LOGDIR/$2.log" "$LOGDIR/$1.log" --iterations 3-4 --fields 'lm loss' \
    --tol 'lm loss=rel:1e-6' --name "$1" || fail "$1: lm loss differs from the uninterrupted $2 run (> 1e-6 relative)"
}
exact() {  # exact NAME REF [FIRST]: iterations 3..5 and final validation identical as printed; NAME
  local a b  # printed iterations FIRST..5 (default 3: resumed from 2; 1: a run from the start)
  "${RESUMED[@]}" compare "$LOGDIR/$2.log" "$LOGDIR/$1.log" --iterations "${3:-3}-5" --only 3-5 \
    --fields 'consumed samples,learning rate,lm loss,grad norm' --name "$1" || fail "$1 differs from the uninterrupted $2 run"
  a=$(grep 'validation loss at iteration 5 on validation set' "$LOGDIR/$2.log")
  b=$(grep 'validation loss at iteration 5 on validation set' "$LOGDIR/$1.log")
  [ -n "$a" ] && [ "$a" == "$b" ] || fail "$1: final validation '$b' vs '$a'"
  echo "OK $1: final validation identical to the uninterrupted $2 run"
}
TP2=(--tensor-model-parallel-size 2)
DO=(--use-distributed-optimizer)
ONE=(--exit-interval 4)  # cross-layout runs stop after iteration 4 (no --save: nothing written)

# Layout A runs (reference and checkpoint).
save_run tp2 2 "${TP2[@]}"
save_run tp1 1
save_run dp2do 2 "${DO[@]}"
save_run tp2dp2do 4 "${TP2[@]}" "${DO[@]}"

# Cross-layout loads.
load_run tp2_to_tp1 tp2 1 "${ONE[@]}";                          cross tp2_to_tp1 tp2
load_run tp1_to_tp2 tp1 2 "${TP2[@]}" "${ONE[@]}";              cross tp1_to_tp2 tp1
load_run dp2do_to_tp2 dp2do 2 "${TP2[@]}" "${ONE[@]}";          cross dp2do_to_tp2 dp2do
load_run tp2dp2do_to_dp1 tp2dp2do 1 "${ONE[@]}";                cross tp2dp2do_to_dp1 tp2dp2do
load_run tp2dp2do_to_dp2 tp2dp2do 2 "${ONE[@]}";                cross tp2dp2do_to_dp2 tp2dp2do
load_run tp1_to_dp2do tp1 2 "${DO[@]}" "${ONE[@]}";             cross tp1_to_dp2do tp1

# Pipeline parallelism (4 layers: 2 per stage at PP2, 1 at PP4; the tied output layer of the last
# stage is a load-only replica of the word embedding).
PP2=(--pipeline-model-parallel-size 2)
save_run tp2pp2 4 "${TP2[@]}" "${PP2[@]}"
save_run pp2 2 "${PP2[@]}"
save_run pp2dp2do 4 "${PP2[@]}" "${DO[@]}"
save_run pp2vp2 2 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2
load_run tp2pp2_to_tp1 tp2pp2 1 "${ONE[@]}";                    cross tp2pp2_to_tp1 tp2pp2
load_run pp2_to_pp4 pp2 4 --pipeline-model-parallel-size 4 "${ONE[@]}"; cross pp2_to_pp4 pp2
load_run pp2_to_dp2do pp2 2 "${DO[@]}" "${ONE[@]}";             cross pp2_to_dp2do pp2
load_run pp2dp2do_to_tp2pp2 pp2dp2do 4 "${TP2[@]}" "${PP2[@]}" "${ONE[@]}"; cross pp2dp2do_to_tp2pp2 pp2dp2do
load_run pp2vp2_to_tp2 pp2vp2 2 "${TP2[@]}" "${ONE[@]}";        cross pp2vp2_to_tp2 pp2vp2
load_run tp1_to_pp2vp2 tp1 2 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 "${ONE[@]}"; cross tp1_to_pp2vp2 tp1

# Context parallelism (CP ranks hold copies of the model: replicas like DP; the distributed
# optimizer slices over DP x CP) and sequence parallelism.
save_run cp2do 2 --context-parallel-size 2 "${DO[@]}"
load_run cp2do_to_tp2sp cp2do 2 "${TP2[@]}" --sequence-parallel "${ONE[@]}"; cross cp2do_to_tp2sp cp2do
load_run tp2_to_cp2 tp2 2 --context-parallel-size 2 "${ONE[@]}"; cross tp2_to_cp2 tp2

# Same layout, multi-process exact resume.
load_run dp2do_resume dp2do 2 "${DO[@]}";                       exact dp2do_resume dp2do
load_run tp2_resume tp2 2 "${TP2[@]}";                          exact tp2_resume tp2
load_run tp2_norng tp2 2 "${TP2[@]}" --no-load-rng;             exact tp2_norng tp2
load_run pp2dp2do_resume pp2dp2do 4 "${PP2[@]}" "${DO[@]}";     exact pp2dp2do_resume pp2dp2do
load_run pp2vp2_resume pp2vp2 2 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2; exact pp2vp2_resume pp2vp2
DROP=(--attention-dropout 0.1 --hidden-dropout 0.1)
save_run tp2dp2_drop 4 "${TP2[@]}" "${DROP[@]}"
load_run tp2dp2_drop_resume tp2dp2_drop 4 "${TP2[@]}" "${DROP[@]}"; exact tp2dp2_drop_resume tp2dp2_drop

# --async-save (snapshot, background write, published at a later iteration): training is not
# perturbed, every save is published (tracker 5), and its iteration-2 checkpoint resumes exactly.
save_run dp2do_async 2 "${DO[@]}" --async-save;                 exact dp2do_async dp2do 1
[ "$(cat "$LOGDIR/dp2do_async/latest_checkpointed_iteration.txt")" = 5 ] || fail "--async-save: tracker is not 5"
load_run dp2do_async_resume dp2do_async 2 "${DO[@]}";           exact dp2do_async_resume dp2do

# Control: without the optimizer state iteration 4 must move (the comparison above sees it).
load_run tp2_nooptim tp2 1 --no-load-optim "${ONE[@]}"
a=$("${RESUMED[@]}" expected "$LOGDIR/tp2.log" --iterations 3-4 --field 'lm loss' --at 4); b=$(loss "$LOGDIR/tp2_nooptim.log" 4)
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) > 1e-3*abs(a) else 1)" "$a" "$b" \
  || fail "--no-load-optim: iteration 4 loss $b is not different from $a: the optimizer state is not what the test checks"
grep -qE '\] iteration +3/ +5 \| consumed samples: +24 ' "$LOGDIR/tp2_nooptim.log" || fail "--no-load-optim did not resume at sample 24"
# --finetune: weights only, iteration and samples from 0.
launch 2 "$LOGDIR/finetune.log" "${DO[@]}" --load "$LOGDIR/tp2dp2do" --finetune --exit-interval 1
grep -qE '\] iteration +1/ +5 \| consumed samples: +8 ' "$LOGDIR/finetune.log" || fail "--finetune did not start at iteration 1"
grep -q 'successfully loaded checkpoint from .* at iteration 0' "$LOGDIR/finetune.log" || fail "--finetune: no load line"
echo "OK --no-load-optim (iteration 4: $b vs $a), --finetune, --no-load-rng"

# SIGTERM delivered to one rank only (--exit-signal-handler): the ranks agree (all-reduce of the
# flag, as Megatron's DistributedSignalHandler), all save the same iteration and exit with 0.
timeout 180 "${MPIRUN[@]}" -np 2 "$BIN/pretrain_gpt" "${ARGS[@]}" "${DO[@]}" --train-iters 20000 \
  --save "$LOGDIR/sig" --save-interval 20000 --exit-signal-handler >"$LOGDIR/sig.log" 2>&1 &
mp=$!
for _ in $(seq 1200); do grep -q ' iteration        2/' "$LOGDIR/sig.log" && break; sleep 0.1; done
mpid=$(pgrep -P "$mp" -x mpirun || true)  # $mp is timeout; its child is mpirun, whose children are the ranks
ranks=($( [ -n "$mpid" ] && pgrep -P "$mpid" -x pretrain_gpt || true))
if [ "${#ranks[@]}" != 2 ]; then
  kill -KILL ${ranks[@]+"${ranks[@]}"} $mpid "$mp" 2>/dev/null; wait "$mp"
  fail "SIGTERM: expected 2 pretrain_gpt children of mpirun, got '${ranks[*]}'"
fi
kill -TERM "${ranks[1]}"
wait "$mp" || { tail -20 "$LOGDIR/sig.log" >&2; fail "SIGTERM to one rank: exit status non-zero"; }
grep -q 'exiting program after receiving SIGTERM' "$LOGDIR/sig.log" || fail "SIGTERM: no exit line"
it=$(cat "$LOGDIR/sig/latest_checkpointed_iteration.txt")
launch 1 "$LOGDIR/sig_load.log" --load "$LOGDIR/sig" --train-iters 20000 --exit-interval $((it + 1))
grep -q "successfully loaded checkpoint from .* at iteration $it\$" "$LOGDIR/sig_load.log" || fail "SIGTERM checkpoint does not load"
echo "OK SIGTERM to one rank: both ranks saved iteration $it, which loads"
