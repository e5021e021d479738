#!/usr/bin/env bash
# GPU check of the "dups" clean-up (code written twice merged into one place, no intended change):
# cudnn_attention.cpp (one builder for the forward/backward graphs' common part, one runner per
# direction for the plain and packed-QKV calls), attention.cu (the flash kernels' shared steps as
# inlined device helpers, one launch path per head dim), fp8_gpu_test.cpp (helpers) and
# tests/gpu/gpucheck_lib.sh (the helpers of the GPU check scripts, used here for step 4).
#   tests/gpu/dups_check.sh BIN_DIR     (BIN_DIR: gpu_ops_test, fp8_gpu_test, pretrain_gpt of a CUDA build)
# Results in ${OUT:-/tmp/out}/dups/ (summary.txt). About 70-90 s on one H200. Steps:
#  1. gpu_ops_test --only attention,qkvpacked: cuDNN SDPA (bf16, fp16, GQA, causal, packed QKV,
#     cuDNN forward + our backward) and our flash kernels (pipelined 8 and 4 warps, simple v1,
#     explicit masks) against float64 host references.
#  2. The same with MEGATRON_DETERMINISTIC=1 (cuDNN's deterministic engine selection and
#     CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC; our backward falls back to the generic kernels).
#  3. fp8_gpu_test --no-timing: every FP8 group (casts, quantize, fused kernels, weight cache,
#     scale update, residual GEMM, param gather); bandwidth lines printed as INFO.
#  4. A tiny GPT (LayerNorm, one head of 64) trained 30 steps on the GPU in bf16 vs the CPU in fp32,
#     with the default attention (cuDNN) and with MEGATRON_ATTENTION_BACKEND=flash (our kernels):
#     every iteration's lm loss within 2e-2 relative (as gpt2perf_check.sh / hostgap_check.sh).
# Exit status 1 iff a check FAILed.
set -u
BIN="$(cd "${1:?usage: dups_check.sh BIN_DIR}" && pwd)"
BASE="${OUT:-/tmp/out}/dups"
mkdir -p "$BASE" && BASE="$(cd "$BASE" && pwd)"
O="$BASE"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # pass/fail/info, gc_find_libs, tiny_gpt_gpu_vs_cpu
gc_find_libs dups
status=0
: > "$O/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$O/gpu.txt" 2>&1; info "gpu: $(cat "$O/gpu.txt")"

# ---- 1-2. attention ops ---------------------------------------------------------------------------
for det in 0 1; do
  log="$O/gpu_ops_attention_det$det.log"
  MEGATRON_DETERMINISTIC=$det timeout 60 "$BIN/gpu_ops_test" --only attention,qkvpacked > "$log" 2>&1
  rc=$?
  grep -E "^FAIL" "$log" | head -20 | sed 's/^/  /'
  if [ $rc = 0 ]; then pass "gpu_ops_test attention,qkvpacked MEGATRON_DETERMINISTIC=$det: $(tail -1 "$log")"
  else fail "gpu_ops_test attention,qkvpacked MEGATRON_DETERMINISTIC=$det rc $rc: $(tail -1 "$log") ($log)"; fi
done

# ---- 3. fp8 ---------------------------------------------------------------------------------------
timeout 90 "$BIN/fp8_gpu_test" --no-timing > "$O/fp8_gpu_test.log" 2>&1
rc=$?
grep -E "^FAIL" "$O/fp8_gpu_test.log" | head -20 | sed 's/^/  /'
grep -E "^bandwidth" "$O/fp8_gpu_test.log" | while read -r l; do info "$l"; done
if [ $rc = 0 ]; then pass "fp8_gpu_test --no-timing: $(tail -1 "$O/fp8_gpu_test.log")"
else fail "fp8_gpu_test --no-timing rc $rc: $(tail -1 "$O/fp8_gpu_test.log") ($O/fp8_gpu_test.log)"; fi

# ---- 4. tiny GPT training, GPU vs CPU, cuDNN and flash attention ----------------------------------
for be in auto flash; do
  O="$BASE/tiny_$be"; mkdir -p "$O"
  echo "== tiny GPT 30 steps, MEGATRON_ATTENTION_BACKEND=$be: GPU bf16 vs CPU fp32"
  MEGATRON_ATTENTION_BACKEND=$be tiny_gpt_gpu_vs_cpu "--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path $BASE/cache" > "$O/result.txt"
  sed "s/ tiny GPT / tiny GPT [attention $be] /" "$O/result.txt" | tee -a "$BASE/summary.txt"
  O="$BASE"
done
info "total ${SECONDS} s; logs in $BASE"
echo "dups_check: $([ $status = 0 ] && echo ALL PASS || echo SOME FAILED)" | tee -a "$BASE/summary.txt"
exit $status
