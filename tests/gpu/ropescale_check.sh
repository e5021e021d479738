#!/usr/bin/env bash
# GPU check of --use-rope-scaling (Llama-3.1 RoPE frequency scaling) and
# --rotary-seq-len-interpolation-factor: the CUDA RoPE kernels (megatron/core/ops/cuda/rope.cu) call
# the same rope_inv_freq / rope_angle (megatron/core/ops/rope_freq.h) as the CPU reference, which
# tests/unit_tests/ops/rope_scaling_test.cpp checks against a float64 Llama-3.1 reference.
#   tests/gpu/ropescale_check.sh BIN_DIR     (BIN_DIR: gpu_ops_test, pretrain_gpt of a CUDA build)
# Results in ${OUT:-/tmp/out}/ropescale/ (summary.txt, logs). About 40-60 s on one H200. Steps:
#  1. gpu_ops_test --only rope,model_ops: qkv_split_rope (vectorized kernel) "half+pos llama3-scaled
#     interp4" (base 500000, factor 8, positions / 4) against a float64 host rotation with the
#     shared fp32 frequencies, and rope_forward/backward (pairs kernel) "half llama3-scaled f32
#     interp3" against cpu::rope_forward, fp32 and bf16; plus every older RoPE case (scaling off
#     must be unchanged).
#  2. tests/gpu/sweep_check.sh BIN '^rope': tiny LLaMA 6 steps GPU --bf16 vs CPU fp32 for
#     rope_scaling, rope_scaling_f32, rope_interp, rope_scaling_interp (and the older rope_* configs):
#     every loss within the sweep's bf16 tolerance.
# Exit status 1 iff a check FAILed.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="$(cd "${1:?usage: ropescale_check.sh BIN_DIR}" && pwd)"
BASE="${OUT:-/tmp/out}/ropescale"
mkdir -p "$BASE" && BASE="$(cd "$BASE" && pwd)"
O="$BASE"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
. "$HERE/gpucheck_lib.sh"  # pass/fail/info, gc_find_libs
gc_find_libs ropescale
status=0
: > "$O/summary.txt"

log="$O/gpu_ops_rope.log"
timeout 60 "$BIN/gpu_ops_test" --seed 7 --only rope,model_ops > "$log" 2>&1
rc=$?
grep -E "^FAIL" "$log" | head -20 | sed 's/^/  /'
n_scaled=$(grep -c "llama3-scaled" "$log")
grep "llama3-scaled" "$log" | head -12 | while read -r l; do info "$l"; done
if [ $rc = 0 ] && [ "$n_scaled" -ge 8 ]; then pass "gpu_ops_test rope,model_ops: $(tail -1 "$log") ($n_scaled scaled-RoPE checks)"
else fail "gpu_ops_test rope,model_ops rc $rc, $n_scaled scaled-RoPE checks: $(tail -1 "$log") ($log)"; fi

OUT="$O" SWEEP_JOBS=${SWEEP_JOBS:-8} timeout 300 bash "$HERE/sweep_check.sh" "$BIN" '^rope' > "$O/sweep.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL|UNSUP)" "$O/sweep.log" | sed 's/^/  /'
for c in rope_scaling rope_scaling_f32 rope_interp rope_scaling_interp; do
  grep -qE "^PASS $c \(" "$O/sweep.log" || fail "sweep config $c did not PASS (see $O/sweep.log, $O/sweep/)"
done
if [ $rc = 0 ]; then pass "sweep_check '^rope': $(tail -1 "$O/sweep.log")"
else fail "sweep_check '^rope' rc $rc: $(tail -1 "$O/sweep.log")"; fi
exit $status
