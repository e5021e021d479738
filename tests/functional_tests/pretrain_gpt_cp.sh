#!/usr/bin/env bash
# pretrain_gpt with --context-parallel-size under mpirun: the tiny GPT and a tiny LLaMA (RoPE,
# RMSNorm, SwiGLU, GQA 4 heads / 2 groups, untied output) on mock data, 4 iterations of global
# batch 8, as one rank and as CP2, CP2 x TP2 (+ --sequence-parallel, + PP2), CP2 x PP2, CP2 x DP2
# (+ distributed optimizer) and CP4 (mpirun: MPI backend; megatron_launch: TCP backend).
# Every printed per-iteration lm loss and the validation/test losses must equal the single-rank
# run within 1e-5 relative (CP changes only fp32 summation order, ~1e-7; the log prints 7
# significant digits), the grad norm within one printed unit (1e-3). Also: --eod-mask-loss (loss
# masks that differ between CP ranks: the loss is normalised by the whole sequence's tokens),
# --calculate-per-token-loss, and --reset-attention-mask/--reset-position-ids (the attention mask
# sliced along its query dim and used block by block in the ring, learned positions sliced),
# --cp-comm-type a2a, and a checkpoint written by CP2 resumed on one rank.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/train_log.inc"  # log_summary, summaries_equal
BASE=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --log-interval 1 --eval-interval 2 --eval-iters 1)
LLAMA=(--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention --num-query-groups 2
  --untie-embeddings-and-output-weights --disable-bias-linear)

run() {  # run NAME NP -- EXTRA ARGS   (NP 1 = no mpirun; NP "L4" = megatron_launch with 4 processes)
  local name=$1 np=$2; shift 3
  local launch=()
  case $np in
    L*) launch=("$BIN/megatron_launch" --nproc-per-node "${np#L}" --master-port "$(free_port)") ;;
    1) ;;
    *) launch=("${MPIRUN[@]}" -np "$np") ;;
  esac
  timeout 300 "${launch[@]}" "$BIN/pretrain_gpt" "${BASE[@]}" "$@" >"$LOGDIR/$name.log" 2>&1 \
    || { tail -30 "$LOGDIR/$name.log" >&2; fail "$name exited with status $?"; }
  log_summary "$LOGDIR/$name.log" >"$LOGDIR/$name.sum"
}

compare() {  # compare NAME REF
  summaries_equal "$LOGDIR/$2.sum" "$LOGDIR/$1.sum" "$1" || { cat "$LOGDIR/$2.sum" "$LOGDIR/$1.sum" >&2; fail "$1 differs from $2"; }
  echo "$1: per-iteration lm loss, grad norm, consumed samples and validation/test losses equal $2"
}

run gpt 1 --
run gpt_cp2 2 -- --context-parallel-size 2
compare gpt_cp2 gpt
grep -q 'context-parallel size: 2' "$LOGDIR/gpt_cp2.log" || fail "gpt_cp2: no 'context-parallel size: 2' line"
run gpt_cp2tp2 4 -- --context-parallel-size 2 --tensor-model-parallel-size 2
compare gpt_cp2tp2 gpt
run gpt_cp2pp2 4 -- --context-parallel-size 2 --pipeline-model-parallel-size 2
compare gpt_cp2pp2 gpt
run gpt_cp4_launch L4 -- --context-parallel-size 4
compare gpt_cp4_launch gpt

run llama 1 -- "${LLAMA[@]}"
run llama_cp2 2 -- "${LLAMA[@]}" --context-parallel-size 2 --cp-comm-type p2p
compare llama_cp2 llama
run llama_cp2tp2 4 -- "${LLAMA[@]}" --context-parallel-size 2 --tensor-model-parallel-size 2
compare llama_cp2tp2 llama
run llama_cp4 4 -- "${LLAMA[@]}" --context-parallel-size 4
compare llama_cp4 llama
run llama_cp2dp2 4 -- "${LLAMA[@]}" --context-parallel-size 2 --use-distributed-optimizer
compare llama_cp2dp2 llama
run llama_cp2pp2 4 -- "${LLAMA[@]}" --context-parallel-size 2 --pipeline-model-parallel-size 2 --overlap-grad-reduce
compare llama_cp2pp2 llama
run llama_cp2tp2sp 4 -- "${LLAMA[@]}" --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel
compare llama_cp2tp2sp llama
run llama_cp2tp2sppp2 8 -- "${LLAMA[@]}" --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
  --pipeline-model-parallel-size 2
compare llama_cp2tp2sppp2 llama

# --cp-comm-type a2a (all-to-all of heads): the tiny GPT (4 heads) as CP2 and CP2 x TP2.
run gpt_a2a_cp2 2 -- --context-parallel-size 2 --cp-comm-type a2a
compare gpt_a2a_cp2 gpt
run gpt_a2a_cp2tp2 4 -- --context-parallel-size 2 --tensor-model-parallel-size 2 --cp-comm-type a2a
compare gpt_a2a_cp2tp2 gpt

# Checkpoint from CP2 x distributed optimizer (CP ranks are replicas of the model, the optimizer
# state is sharded over dp-cp), resumed as one rank: iterations 3 and 4 equal the uninterrupted run.
run ckpt_cp2 2 -- "${LLAMA[@]}" --context-parallel-size 2 --use-distributed-optimizer --save "$LOGDIR/ckpt" \
  --save-interval 2 --exit-interval 2
run ckpt_resume 1 -- "${LLAMA[@]}" --load "$LOGDIR/ckpt"
# (iteration 4, the resumed run's second line, prints the mean of 3 and 4 as Megatron: compared with
# the uninterrupted run's mean, tests/functional_tests/support/resumed_log.py)
python3 "$SRC/tests/functional_tests/support/resumed_log.py" compare "$LOGDIR/llama.log" "$LOGDIR/ckpt_resume.log" --iterations 3-4 \
  --fields 'lm loss' --tol 'lm loss=rel:1e-5' --name ckpt_resume || fail "resume after a CP2 checkpoint differs"
echo "CP2 checkpoint (distributed optimizer) resumed on one rank: iterations 3-4 equal the uninterrupted run"

# Loss masks that differ between CP ranks, per-token loss, document masks and reset positions.
run eod 1 -- --eod-mask-loss
run eod_cp2 2 -- --eod-mask-loss --context-parallel-size 2
compare eod_cp2 eod
run ptl 1 -- "${LLAMA[@]}" --calculate-per-token-loss
run ptl_cp2dp2 4 -- "${LLAMA[@]}" --calculate-per-token-loss --context-parallel-size 2
compare ptl_cp2dp2 ptl
run reset 1 -- --reset-attention-mask --reset-position-ids --eod-mask-loss
run reset_cp2 2 -- --reset-attention-mask --reset-position-ids --eod-mask-loss --context-parallel-size 2
compare reset_cp2 reset

# Unsupported: allgather, a2a with heads not divisible by CP, and a sequence that does not split into
# 2*CP chunks.
if timeout 60 "${MPIRUN[@]}" -np 2 "$BIN/pretrain_gpt" "${BASE[@]}" --context-parallel-size 2 --cp-comm-type allgather \
    >"$LOGDIR/bad.log" 2>&1; then fail "--cp-comm-type allgather was accepted"; fi
grep -q "^error: --cp-comm-type allgather" "$LOGDIR/bad.log" || { cat "$LOGDIR/bad.log" >&2; fail "allgather: no error naming --cp-comm-type"; }
if timeout 60 "${MPIRUN[@]}" -np 4 "$BIN/pretrain_gpt" "${BASE[@]}" "${LLAMA[@]}" --context-parallel-size 2 \
    --tensor-model-parallel-size 2 --cp-comm-type a2a >"$LOGDIR/bad.log" 2>&1; then fail "a2a with 1 group per rank was accepted"; fi
grep -q "^error: --cp-comm-type a2a" "$LOGDIR/bad.log" || { cat "$LOGDIR/bad.log" >&2; fail "a2a groups: no error naming --cp-comm-type"; }
if timeout 60 "${MPIRUN[@]}" -np 2 "$BIN/pretrain_gpt" "${BASE[@]/32/30}" --context-parallel-size 2 \
    >"$LOGDIR/bad.log" 2>&1; then fail "--seq-length 30 with CP2 was accepted"; fi
grep -q "^error: --seq-length" "$LOGDIR/bad.log" || { cat "$LOGDIR/bad.log" >&2; fail "seq 30: no error naming --seq-length"; }
echo "--cp-comm-type allgather, a2a with too few heads, --seq-length not divisible by 2*CP: rejected naming the flag"
