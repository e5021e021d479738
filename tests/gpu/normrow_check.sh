#!/usr/bin/env bash
# GPU check of Session 12 "normrow": the row-block LayerNorm/RMSNorm backward
# (norm.cu norm_bwd_rowblk_kernel, the default for 1024 < h <= 8192 bf16 rows; MEGATRON_NORM_BWD_ROW=0
# or variants.h norm_bwd_no_row = the old norm_bwd_kernel). One H200, < 120 s. Prediction:
# docs/performance.md "Session 12: large-h norm backward".
#   tests/gpu/normrow_check.sh BIN_DIR LOGDIR
# BIN_DIR: gpu_ops_test and dev/dev_cuda_norm_{bwd,fwd} of a CUDA build (ninja gpu_ops_test dev_cuda_norm_bwd
# dev_cuda_norm_fwd);
# pretrain_gpt too for step 3 (skipped with an INFO line when absent).
# Every line that matters starts with PASS/FAIL/RESULT/INFO; exit status 1 iff a FAIL:
#   1. gpu_ops_test --only norms: every norm kernel against float64, including test_norm_rowblk
#      (h = 2048/4096/5120/8192/1032, LN and RMS, both gamma dtypes, +-dres, rows 3..1000: new vs
#      float64, new vs old within tolerance, new twice bitwise).
#   2. dev_cuda_norm_bwd: GPT-2's shape (unchanged kernels) and 8192 x 4096 bf16 (row-block vs old,
#      both vs the CPU, new vs old within tolerance, new twice bitwise) -> RESULT us per call, GB/s.
#   2b. dev_cuda_norm_fwd (if built): the 8192 x 4096 forward, shipped warp-per-row kernel vs the
#      block-per-row kernel forced (timing only: RESULT speedup; the forward is not changed).
#   3. LLaMA-3-8B-shaped 4 layers, seq 8192, 10 iterations, new and MEGATRON_NORM_BWD_ROW=0:
#      RESULT ms/iter (mean of iterations 4-10) and the saving.
set -u
BIN=$(cd "${1:?usage: tests/gpu/normrow_check.sh BIN_DIR LOGDIR}" && pwd)
O=${2:?usage: tests/gpu/normrow_check.sh BIN_DIR LOGDIR}
mkdir -p "$O" && O=$(cd "$O" && pwd)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
. "$HERE/gpucheck_lib.sh"  # gc_find_libs, gc_steptime
T0=$(date +%s)
status=0
fail() { echo "FAIL $*"; status=1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | sed 's/^/INFO gpu: /'
[ -x "$BIN/pretrain_gpt" ] && gc_find_libs normrow || . "$HERE/cuda_libs.sh"

echo "== 1. gpu_ops_test --only norms"
timeout 75 "$BIN/gpu_ops_test" --only norms > "$O/gpu_ops_test.log" 2>&1
rc=$?
grep -E "^FAIL|passed" "$O/gpu_ops_test.log"
echo "INFO gpu_ops_test: $(grep -c '^PASS rowblk' "$O/gpu_ops_test.log") row-block PASS lines," \
  "$(grep -c '^FAIL rowblk' "$O/gpu_ops_test.log") FAIL; $(grep -E '^PASS rowblk.*twice bitwise' "$O/gpu_ops_test.log" | wc -l) twice-bitwise PASS"
grep -E "^PASS rowblk rmsnorm h=4096 rows=1000 gamma bfloat16 \+dres (dx|dx new vs old|twice)" "$O/gpu_ops_test.log"
[ "$(grep -c '^PASS rowblk' "$O/gpu_ops_test.log")" -gt 0 ] || fail "gpu_ops_test ran no row-block case"
[ $rc = 0 ] || fail "gpu_ops_test exit $rc ($O/gpu_ops_test.log)"
echo "INFO elapsed $(( $(date +%s) - T0 )) s"

echo "== 2. dev_cuda_norm_bwd (GPT-2 and 8192 x 4096)"
D="$BIN/dev/dev_cuda_norm_bwd"
if [ -x "$D" ]; then
  timeout 90 "$D" --reps 20 > "$O/dev_norm_bwd.log" 2>&1
  rc=$?
  grep -E "^(PASS|FAIL) " "$O/dev_norm_bwd.log" | sed "s/^\(PASS\|FAIL\) /\1 [dev norm_bwd] /"
  grep -E "^(TIME|SPEEDUP) " "$O/dev_norm_bwd.log" | sed "s/^/INFO [dev norm_bwd] /"
  [ $rc = 0 ] || fail "dev_cuda_norm_bwd exit $rc ($O/dev_norm_bwd.log)"
  # RESULT lines from the TIME line with that label: us per call and GB/s.
  result() {
    local line; line=$(grep -F "TIME $2 " "$O/dev_norm_bwd.log" | head -1)
    [ -n "$line" ] || { echo "INFO no TIME line '$2'"; return; }
    echo "$line" | awk -v n="$1" '{printf "RESULT %s_us %.1f us\nRESULT %s_GBps %s GB/s\n", n, $(NF-3) * 1000, n, $(NF-1)}'
  }
  for ln in rmsnorm layernorm; do
    for r in "_residual" ""; do
      k=${ln}_bwd${r}_8192x4096
      result "${k}_new" "${ln}_backward${r} 8192x4096 row-block (shipped)"
      result "${k}_old" "${ln}_backward${r} 8192x4096 old (forced)"
    done
  done
  grep -E "^SPEEDUP " "$O/dev_norm_bwd.log" | awk '{printf "RESULT speedup_%s %s\n", $2, $4}'
else
  fail "dev driver $D not built"
fi
echo "INFO elapsed $(( $(date +%s) - T0 )) s"

echo "== 2b. dev_cuda_norm_fwd at 8192 x 4096: is the block-per-row forward (forced) >= 20 % faster? (timing only)"
D="$BIN/dev/dev_cuda_norm_fwd"
if [ -x "$D" ]; then
  timeout 60 "$D" --reps 20 > "$O/dev_norm_fwd.log" 2>&1
  rc=$?
  grep -E "^(PASS|FAIL) .*8192x4096" "$O/dev_norm_fwd.log" | sed "s/^\(PASS\|FAIL\) /\1 [dev norm_fwd] /"
  grep -E "^FAIL " "$O/dev_norm_fwd.log" | grep -v 8192x4096 | sed "s/^/FAIL [dev norm_fwd] /"
  grep -E "^(TIME|SPEEDUP) .*8192x4096" "$O/dev_norm_fwd.log" | sed "s/^/INFO [dev norm_fwd] /"
  grep -E "^SPEEDUP " "$O/dev_norm_fwd.log" | awk '{printf "RESULT fwd_block_per_row_speedup_%s %s\n", $2, $4}'
  [ $rc = 0 ] || fail "dev_cuda_norm_fwd exit $rc ($O/dev_norm_fwd.log)"
else
  echo "INFO no $D: step 2b skipped"
fi
echo "INFO elapsed $(( $(date +%s) - T0 )) s"

echo "== 3. LLaMA-3-8B-shaped 4 layers, seq 8192: new vs MEGATRON_NORM_BWD_ROW=0"
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --train-iters 10 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/normrow_cache"
if [ ! -x "$BIN/pretrain_gpt" ]; then
  echo "INFO no $BIN/pretrain_gpt: step 3 skipped"
elif [ $(( $(date +%s) - T0 )) -gt 80 ]; then
  echo "INFO $(( $(date +%s) - T0 )) s used: step 3 skipped (budget)"
else
  declare -A T
  for v in new old; do
    if [ $v = old ]; then e="MEGATRON_NORM_BWD_ROW=0"; else e="MEGATRON_NORM_BWD_ROW=1"; fi
    env $e timeout 30 "$BIN/pretrain_gpt" $LL > "$O/llama4l_$v.log" 2>&1
    rc=$?
    T[$v]=$(gc_steptime "$O/llama4l_$v.log" 4)
    grep -qiE "lm loss: *(nan|inf)" "$O/llama4l_$v.log" && fail "NaN/inf loss in $O/llama4l_$v.log"
    [ $rc = 0 ] && [ "${T[$v]}" != nan ] || fail "LLaMA 4L $v exit $rc ($O/llama4l_$v.log)"
    echo "RESULT llama4l_${v}_ms_per_iter ${T[$v]}"
  done
  awk -v a="${T[old]}" -v b="${T[new]}" 'BEGIN { if (a != "nan" && b != "nan") printf "RESULT llama4l_saved_ms %.2f\n", a - b }'
  paste <(lm_losses "$O/llama4l_new.log") <(lm_losses "$O/llama4l_old.log") | awk '
    {d=$1-$2; if(d<0)d=-d; r=d/($2>0?$2:1); if(r>m)m=r; n++}
    END {printf "INFO LLaMA 4L lm loss new vs old: %d iterations, max rel diff %.2e (not bitwise: other sum order)\n", n, m}'
fi

echo "INFO total $(( $(date +%s) - T0 )) s"
[ $status = 0 ] && echo "PASS normrow_check" || echo "FAIL normrow_check"
exit $status
