#!/usr/bin/env bash
# GPU check of Session 13's GEMM autotuning at the power limit (MEGATRON_GEMM_AUTOTUNE=1,
# ops/cuda/gemm.cu tune_candidates; issue 21), one H200, < 330 s. Prediction and outcome:
# docs/performance.md "Session 13: GEMM autotuning at the power limit".
#   tests/gpu/gemmtune_check.sh BIN_DIR LOGDIR
# BIN_DIR: pretrain_gpt of a CUDA build (lib.tar.xz beside it where the machine lacks the non-CUDA
# libraries). Every line that matters starts with PASS/FAIL/RESULT/INFO; exit 1 iff a FAIL:
#   1. LLaMA-3-8B-shaped 4 layers, seq 8192, gbs 1 (12 iterations) and gbs 8 (5), and GPT-2 124M
#      mbs 64 (12): autotune off, on, on, off (ABBA); RESULT ms/iter (mean from iteration 3) of
#      each setting and the speedup.
#   2. The tuner's stderr lines: how many plans it tuned, how many picked another candidate, and
#      the best and worst ratio to the heuristic's time (RESULT/INFO).
#   3. Iteration-1 lm loss with and without tuning within 1e-3 relative (PASS/FAIL: another
#      candidate only changes fp32 summation order; a wrong result would show here), and the
#      last losses as INFO.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # gc_args_init, gc_steptime, lm_losses, pass/fail
gc_args_init gemmtune tests/gpu/gemmtune_check.sh "$@"
COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache_gt --log-interval 1 --clip-grad 1.0 --bf16 --log-throughput"
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2"
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --micro-batch-size 64 --global-batch-size 64"
# run NAME TUNE ITERS ARGS...
run() {
  local n=$1 t=$2 it=$3; shift 3
  MEGATRON_GEMM_AUTOTUNE=$t timeout 150 "$BIN/pretrain_gpt" "$@" $COMMON --train-iters "$it" > "$O/$n.log" 2>&1 ||
    fail "$n exit $? ($O/$n.log)"
  echo "RESULT $n $(gc_steptime "$O/$n.log" 3) ms/iter"
}
pair() {  # pair NAME ITERS ARGS...: ABBA, then the summary lines
  local n=$1 it=$2; shift 2
  run "${n}_off_a" 0 "$it" "$@"; run "${n}_on_a" 1 "$it" "$@"; run "${n}_on_b" 1 "$it" "$@"; run "${n}_off_b" 0 "$it" "$@"
  local off on
  off=$(awk -v a="$(gc_steptime "$O/${n}_off_a.log" 3)" -v b="$(gc_steptime "$O/${n}_off_b.log" 3)" 'BEGIN { printf "%.2f", (a + b) / 2 }')
  on=$(awk -v a="$(gc_steptime "$O/${n}_on_a.log" 3)" -v b="$(gc_steptime "$O/${n}_on_b.log" 3)" 'BEGIN { printf "%.2f", (a + b) / 2 }')
  echo "RESULT ${n}_off $off ms/iter"
  echo "RESULT ${n}_on $on ms/iter"
  echo "RESULT ${n}_speedup $(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.3f", a / b }') x"
  local tuned other
  tuned=$(grep -c '^cuBLASLt autotune' "$O/${n}_on_a.log"); other=$(grep '^cuBLASLt autotune' "$O/${n}_on_a.log" | grep -vc 'candidate 0 of')
  echo "RESULT ${n}_plans_tuned $tuned (another candidate than the heuristic's: $other)"
  grep '^cuBLASLt autotune' "$O/${n}_on_a.log" | sed 's/.*, \([0-9.]*\)x the.*/\1/' | sort -n |
    awk -v n="$n" 'NR == 1 { lo = $1 } { hi = $1 } END { if (NR) printf "INFO %s tuned ratios (tuned / heuristic time): best %s, worst %s\n", n, lo, hi }'
  [ "$tuned" -gt 0 ] || fail "$n: MEGATRON_GEMM_AUTOTUNE=1 tuned no plan"
  [ "$(grep -c '^cuBLASLt autotune' "$O/${n}_off_a.log")" = 0 ] || fail "$n: tuning lines without MEGATRON_GEMM_AUTOTUNE"
  local l0 l1
  l0=$(lm_losses "$O/${n}_off_a.log" | head -1); l1=$(lm_losses "$O/${n}_on_a.log" | head -1)
  if awk -v a="$l0" -v b="$l1" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-3 * (a < 0 ? -a : a)) }'; then
    echo "PASS $n iteration-1 loss with tuning $l1 within 1e-3 relative of $l0"
  else
    fail "$n iteration-1 loss with tuning '$l1' vs '$l0'"
  fi
  echo "INFO $n last losses: off $(lm_losses "$O/${n}_off_a.log" | tail -1) / $(lm_losses "$O/${n}_off_b.log" | tail -1), on $(lm_losses "$O/${n}_on_a.log" | tail -1) / $(lm_losses "$O/${n}_on_b.log" | tail -1)"
  echo "INFO elapsed $(( $(date +%s) - T0 )) s"
}
pair ll4_gbs1 12 $LL --global-batch-size 1
grep -m3 '^cuBLASLt autotune' "$O/ll4_gbs1_on_a.log" | sed 's/^/INFO /'
pair ll4_gbs8 5 $LL --global-batch-size 8
pair gpt2_mbs64 12 $GPT2
grep '^cuBLASLt autotune' "$O/gpt2_mbs64_on_a.log" | grep -v 'candidate 0 of' | head -8 | sed 's/^/INFO /'
[ $status = 0 ] && echo "PASS gemmtune_check" || echo "FAIL gemmtune_check"
exit $status
