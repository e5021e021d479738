#!/bin/bash
# Stand-in for pretrain_gpt (PRETRAIN_GPT=) under examples/llama/train_llama3_8b_h100_fp8.sh that
# turns the production run into a short benchmark and execs $REAL_PRETRAIN_GPT with:
#   --train-samples N        -> --train-iters $BENCH_ITERS (default 6), warm-up $BENCH_WARMUP
#                               iterations (default BENCH_ITERS-1: the LR stays small, so a
#                               short run from random weights does not spike)
#   --lr-decay-samples/--lr-warmup-samples (dropped; sample-based schedule needs --train-samples)
#   --global-batch-size 128  -> $BENCH_GBS (default 8)
#   --eval-iters N           -> $BENCH_EVAL_ITERS (default 0: no evaluation)
#   --save/--load DIR        dropped (a benchmark does not need the 112 GB checkpoint writes),
#                            kept with BENCH_CKPT=1 (then a final save at the last iteration);
#                            BENCH_CKPT=load keeps only --load (resume without a final save)
#                            (resume with the same BENCH_ITERS/BENCH_GBS as the save: the LR schedule
#                            is derived from them, and a changed schedule is refused as in Megatron;
#                            save with EXTRA_ARGS="--exit-interval K", then resume)
#   with BENCH_TP=N: --tensor-model-parallel-size N (the script's --sequence-parallel stays;
#   BENCH_NO_SP=1 drops it)
# Every other flag of the script passes unchanged.
set -u
out=()
while [ $# -gt 0 ]; do
  case $1 in
    --train-samples) it=${BENCH_ITERS:-6}; out+=(--train-iters "$it" --lr-warmup-iters "${BENCH_WARMUP:-$(( it > 1 ? it - 1 : 1 ))}"); shift 2 ;;
    --lr-decay-samples|--lr-warmup-samples) shift 2 ;;
    --save) [ "${BENCH_CKPT:-}" = 1 ] && out+=("$1" "$2"); shift 2 ;;
    --load) [ -n "${BENCH_CKPT:-}" ] && out+=("$1" "$2"); shift 2 ;;
    --global-batch-size) out+=(--global-batch-size "${BENCH_GBS:-8}"); shift 2 ;;
    --eval-iters) out+=(--eval-iters "${BENCH_EVAL_ITERS:-0}"); shift 2 ;;
    --tensor-model-parallel-size) out+=("$1" "${BENCH_TP:-$2}"); shift 2 ;;
    --sequence-parallel) [ -n "${BENCH_NO_SP:-}" ] || out+=("$1"); shift ;;
    *) out+=("$1"); shift ;;
  esac
done
exec "${REAL_PRETRAIN_GPT:?set REAL_PRETRAIN_GPT to the pretrain_gpt binary}" "${out[@]}"
