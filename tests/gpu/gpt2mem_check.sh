#!/usr/bin/env bash
# GPU check of Session 11 "gpt2mem" (issue 21: GPT-2 124M's memory-bound kernels), one H200, < 90 s:
#   A. LayerNorm/RMSNorm register kernels with a cp.async row pipeline (norm_fwd_pipe_kernel,
#      norm_bwd_pipe_kernel; MEGATRON_NORM_PIPELINE=0 = the Session 4 register kernels),
#   B. the fused cross entropy with the row fetched by bulk copies (ce_fused_kernel<L, false, true>;
#      MEGATRON_CE_FUSED_BULK=0 = the Session 9 stash kernel).
# Both must reproduce the old kernels' bits. Predictions: docs/performance.md "Session 11: GPT-2
# memory-bound kernels".
#   tests/gpu/gpt2mem_check.sh BIN_DIR LOGDIR
# BIN_DIR: gpu_ops_test, pretrain_gpt and dev/dev_cuda_{norm_fwd,norm_bwd,ce_fused} of a CUDA build
# (ninja gpu_ops_test pretrain_gpt dev_cuda_norm_fwd dev_cuda_norm_bwd dev_cuda_ce_fused).
# Steps, every line that matters starts with PASS/FAIL/RESULT/INFO; exit status 1 iff a FAIL:
#   1. gpu_ops_test --only norms,ce_fused: the new kernels against float64 references, and bitwise
#      against the old ones (test_norm_pipe_bits; "bulk copy == stash bitwise").
#   2. the dev/cuda drivers norm_fwd, norm_bwd, ce_fused on GPT-2's shapes: new / old / fallback
#      against the CPU, new vs old bitwise, CUDA-event medians -> RESULT us per call and GB/s.
#   3. GPT-2 124M mbs 64 (bf16, mock data), 15 iterations, new (defaults) and old (both switches
#      0): RESULT ms/iter (mean of iterations 4-15) each, and the saving; the default mode's losses
#      are not reproducible run to run, so they are only counted (INFO).
#   4. the pair again with --deterministic-mode (the only mode that is reproducible run to run:
#      the default one has cuDNN's and the embedding backward's atomics), at mbs 8 (8192 rows per
#      norm call and cross entropy, 5 rows per backward warp) and 10 iterations, because its
#      generic attention backward takes ~5.4 s per mbs-64 step (device call 18, where two identical
#      deterministic GPT-2 runs were bitwise equal): PASS iff every logged lm loss and grad norm and
#      every trained parameter (MEGATRON_DUMP_PARAMS, compared then deleted) is bitwise equal;
#      then, time allowing, a second new run as the control that deterministic mode reproduces.
set -u
BIN=$(cd "${1:?usage: tests/gpu/gpt2mem_check.sh BIN_DIR LOGDIR}" && pwd)
O=${2:?usage: tests/gpu/gpt2mem_check.sh BIN_DIR LOGDIR}
mkdir -p "$O" && O=$(cd "$O" && pwd)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. "$HERE/gpucheck_lib.sh"  # gc_find_libs, gc_steptime, lm_losses
gc_find_libs gpt2mem
status=0
fail() { echo "FAIL $*"; status=1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | sed 's/^/INFO gpu: /'
OLD="MEGATRON_NORM_PIPELINE=0 MEGATRON_CE_FUSED_BULK=0"

echo "== 1. gpu_ops_test --only norms,ce_fused"
timeout 40 "$BIN/gpu_ops_test" --only norms,ce_fused > "$O/gpu_ops_test.log" 2>&1
rc=$?
grep -E "^FAIL|passed" "$O/gpu_ops_test.log"
echo "INFO gpu_ops_test: $(grep -c "bitwise.*" "$O/gpu_ops_test.log") bitwise lines, $(grep -E "^PASS" "$O/gpu_ops_test.log" | grep -c bitwise) PASS"
grep -E "^PASS .*(h=768 bf16 gamma bfloat16 residual pipelined == unpipelined bitwise: dx|V=50304 bf16 bulk copy)" "$O/gpu_ops_test.log"
[ $rc = 0 ] || fail "gpu_ops_test exit $rc ($O/gpu_ops_test.log)"

echo "== 2. dev/cuda drivers (GPT-2 shapes)"
# result NAME DRIVER LABEL: RESULT lines (us per call, GB/s) from the driver's TIME line LABEL.
result() {
  local line; line=$(grep -F "TIME $3 " "$O/dev_$2.log" | head -1)
  [ -n "$line" ] || { echo "INFO no TIME line '$3' in $O/dev_$2.log"; return; }
  echo "$line" | awk -v n="$1" '{printf "RESULT %s_us %.1f us\nRESULT %s_GBps %s GB/s\n", n, $(NF-3) * 1000, n, $(NF-1)}'
}
for d in norm_fwd norm_bwd ce_fused; do
  if [ ! -x "$BIN/dev/dev_cuda_$d" ]; then fail "dev driver $BIN/dev/dev_cuda_$d not built"; continue; fi
  timeout 40 "$BIN/dev/dev_cuda_$d" --reps 20 > "$O/dev_$d.log" 2>&1
  rc=$?
  grep -E "^(PASS|FAIL) " "$O/dev_$d.log" | sed "s/^\(PASS\|FAIL\) /\1 [dev $d] /"
  grep -E "^TIME " "$O/dev_$d.log" | sed "s/^TIME /INFO [dev $d] /"
  [ $rc = 0 ] || fail "dev driver $d exit $rc ($O/dev_$d.log)"
done
result norm_fwd_ln_new norm_fwd "layernorm_forward gamma bfloat16 shipped (pipelined)"
result norm_fwd_ln_old norm_fwd "layernorm_forward gamma bfloat16 no pipe (forced)"
result norm_bwd_ln_res_new norm_bwd "layernorm_backward_residual shipped (pipelined)"
result norm_bwd_ln_res_old norm_bwd "layernorm_backward_residual no pipe (forced)"
result norm_bwd_ln_new norm_bwd "layernorm_backward shipped (pipelined)"
result norm_bwd_ln_old norm_bwd "layernorm_backward no pipe (forced)"
result ce_fused_16384_new ce_fused "cross_entropy_fused_ gpt2 shipped (bulk copy) 16384 rows"
result ce_fused_16384_old ce_fused "cross_entropy_fused_ gpt2 no bulk: stash (forced) 16384 rows"

COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/gpt2mem_cache"
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --bf16 --lr 6e-4 --lr-warmup-iters 0 --clip-grad 1.0 --log-interval 1"
MBS64="--micro-batch-size 64 --global-batch-size 64 --train-iters 15"
DET="--deterministic-mode --micro-batch-size 8 --global-batch-size 8 --train-iters 10"
# gpt2 LABEL EXTRA_FLAGS ENV...: one run -> $O/gpt2_LABEL.log, T_LABEL = ms/iter (mean of
# iterations 4..), $O/gpt2_LABEL.loss (lm loss and grad norm of every iteration); with
# --deterministic-mode also the trained parameters in /tmp/gpt2mem_params_LABEL.
gpt2() {
  local lab=$1 extra=$2 rc; shift 2
  local dump=""; [ "$extra" = "$DET" ] && dump="MEGATRON_DUMP_PARAMS=/tmp/gpt2mem_params_$lab" && rm -rf "/tmp/gpt2mem_params_$lab" && mkdir -p "/tmp/gpt2mem_params_$lab"
  env "$@" $dump timeout 40 "$BIN/pretrain_gpt" $GPT2 $extra $COMMON > "$O/gpt2_$lab.log" 2>&1
  rc=$?
  grep -o "lm loss: [0-9.E+-]*\|grad norm: [0-9.E+-]*" "$O/gpt2_$lab.log" | paste - - > "$O/gpt2_$lab.loss"
  eval "T_$lab=$(gc_steptime "$O/gpt2_$lab.log" 4)"
  [ $rc = 0 ] || { fail "GPT-2 [$lab] exit $rc ($O/gpt2_$lab.log)"; tail -n 4 "$O/gpt2_$lab.log" | sed 's/^/  /'; }
}
echo "== 3. GPT-2 124M mbs 64, new vs old ($OLD)"
gpt2 new "$MBS64"
gpt2 old "$MBS64" $OLD
echo "RESULT gpt2_ms_per_iter_new $T_new ms"
echo "RESULT gpt2_ms_per_iter_old $T_old ms"
awk -v a="$T_new" -v b="$T_old" 'BEGIN{ if (a != "nan" && b != "nan") printf "RESULT gpt2_ms_saved %.2f ms\nINFO GPT-2 step new/old = %.4f\n", b - a, a / b }'
echo "INFO default-mode losses (not reproducible run to run: atomics), new vs old: $(paste "$O/gpt2_new.loss" "$O/gpt2_old.loss" | awk -F'\t' '{if ($1 != $3) d++} END {printf "%d of %d lm losses differ", d, NR}')"

echo "== 4. GPT-2 --deterministic-mode mbs 8, new vs old, bitwise"
same_run() {  # same_run A B: PASS/FAIL line for losses, grad norms and parameters of runs A, B
  local a=$1 b=$2 n p
  n=$(wc -l < "$O/gpt2_$a.loss")
  if [ "$n" -lt 10 ]; then fail "deterministic $a: $n of 10 loss lines"; return; fi
  p="parameters not dumped"
  if ls /tmp/gpt2mem_params_$a/*.bin > /dev/null 2>&1; then
    if cmp -s /tmp/gpt2mem_params_$a/params_pp0.bin /tmp/gpt2mem_params_$b/params_pp0.bin; then p="parameters equal"; else p="parameters DIFFER"; fi
  fi
  if cmp -s "$O/gpt2_$a.loss" "$O/gpt2_$b.loss" && [ "$p" = "parameters equal" ]; then
    echo "PASS GPT-2 --deterministic-mode mbs 8 $a vs $b: all $n lm losses and grad norms bitwise equal, $p ($(head -1 "$O/gpt2_$a.loss" | cut -f1) -> $(tail -1 "$O/gpt2_$a.loss" | cut -f1))"
  else
    fail "GPT-2 --deterministic-mode mbs 8 $a vs $b: $(paste "$O/gpt2_$a.loss" "$O/gpt2_$b.loss" | awk -F'\t' '$1 != $3 || $2 != $4 {d++} END {print d + 0}') of $n iterations differ, $p (first: $(paste -d'|' "$O/gpt2_$a.loss" "$O/gpt2_$b.loss" | awk -F'|' '$1 != $2 {print NR": "$1" vs "$2; exit}'))"
  fi
}
gpt2 detnew "$DET"
gpt2 detold "$DET" $OLD
same_run detnew detold
echo "INFO deterministic mode mbs 8 ms/iter: new $T_detnew, old $T_detold"
if [ $SECONDS -lt 70 ]; then
  gpt2 detnew2 "$DET"
  same_run detnew detnew2
else
  echo "INFO skipped the deterministic control run (time budget: ${SECONDS}s used)"
fi
rm -rf /tmp/gpt2mem_params_*
echo "INFO total ${SECONDS}s"
[ $status = 0 ] && echo "PASS gpt2mem_check" || echo "FAIL gpt2mem_check"
exit $status
