#!/usr/bin/env bash
# The blockwise FP8 recipe on one H200 as it ships after session 10 (docs/fp8.md "Blockwise recipe",
# docs/performance.md "Session 9: blockwise" and its outcome): the tiled quantize kernel is the
# only one (MEGATRON_FP8_BLOCK_QUANT and the legacy kernel are gone) and the fused RMSNorm / SwiGLU /
# SwiGLU-backward producers are on by default (MEGATRON_FP8_BLOCK_FUSED unset = 1). Budget < 120 s
# (about 60 s: fp8_gpu_test ≈ 35 s, each LLaMA run 2-5 s, each small run ≈ 1 s).
#   tests/gpu/blockq_check.sh BIN_DIR LOGDIR    (BIN_DIR holds pretrain_gpt and fp8_gpu_test)
# Logs go to LOGDIR/blockq/. Both switches are unset first, so every run without an explicit
# setting runs the shipped default. Steps:
#  1. fp8_gpu_test --no-timing --groups blockwise (PASS iff it exits 0, i.e. every case "ok"): the
#     quantize kernel bit-exact (bytes and every scale_inv bit) vs the CPU reference (rows, columns,
#     both, 128 x 128; partial and whole tiles; bf16 and fp32 in); the fused producers vs producer +
#     fp8_block_quantize, bit-exact, fp32 activations included (the rmsnorm_rstd case that threw
#     before 97b5b52); fp8::linear's blockwise transport with the producers fused -- which FAILs if
#     the default were not fused, so the PASS also checks the new default; the block-scaled GEMMs and
#     every cuBLASLt algorithm the heuristic offers vs float64. RESULT lines: the kernel's GB/s per
#     variant, each GEMM's best algorithm and algorithm 0 in TFLOP/s.
#  2. Speed, LLaMA-3-8B-shaped 4 layers, seq 8192: bf16, fp8 hybrid delayed (history 1024, max) and
#     blockwise at global batch 1 (6 iterations) and 8 (8 micro-batches, 4 iterations); mean ms/iter
#     over iterations 3..; RESULT ms/iter, x vs bf16 (bf16 ms / ms), blockwise vs delayed (delayed ms /
#     blockwise ms); at gbs 8 also blockwise with MEGATRON_FP8_BLOCK_FUSED=0 (RESULT fused vs
#     unfused: what the new default buys). Reported, not asserted.
#  3. Numerics, fp8_llama_args' small LLaMA (dimensions multiples of 128), 30 steps blockwise with
#     --deterministic-mode, the default (fused) vs MEGATRON_FP8_BLOCK_FUSED=0: PASS iff every logged
#     loss (30 training + validation, >= 33) is identical -- the fused producers write the unfused
#     path's FP8 bytes and scales, so the whole step (backward included) must be bitwise the same.
# RESULT <name> <value> <unit> per figure; PASS/FAIL per check; exit status non-zero iff a FAIL.
set -u
unset MEGATRON_FP8_BLOCK_QUANT MEGATRON_FP8_BLOCK_FUSED
BIN="${1:?usage: blockq_check.sh BIN_DIR LOGDIR}"
OUT="${2:?usage: blockq_check.sh BIN_DIR LOGDIR}"
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"
gc_check_init blockq name,driver_version
result() { echo "RESULT $1 $2 $3" | tee -a "$O/summary.txt"; }

# ---- 1. kernels -------------------------------------------------------------------------------
L="$O/fp8_gpu_test.log"
timeout 75 "$BIN/fp8_gpu_test" --no-timing --groups blockwise > "$L" 2>&1
rc=$?
grep -E "^(FAIL|time|best)" "$L" | sed "s/^/  /"
if [ $rc = 0 ]; then pass "fp8_gpu_test blockwise ($(tail -1 "$L"))"
else fail "fp8_gpu_test blockwise rc $rc ($(grep -m2 -E 'FAIL|exception' "$L" | tr '\n' ' '))"; fi
# "time fp8_block_quantize x rows  8192x4096  0.038 ms 2627 GB/s" -> RESULT quantize_x_rows_8192x4096
grep "^time fp8_block_quantize" "$L" | awk '{
  w = ""; for (i = 3; i < NF - 4; ++i) w = w (w == "" ? "" : "_") $i; gsub(/[+]/, "", w);
  printf "RESULT quantize_%s_%s %s GB/s\n", w, $(NF - 4), $(NF - 1) }' | tee -a "$O/summary.txt"
# "best block-scaled fc1 wgrad  algo 2   1070 TFLOP/s"; algo 0's rate from its "time" line.
grep "^best block-scaled" "$L" | awk '{ printf "RESULT gemm_best_%s_%s_algo%s %s TFLOP/s\n", $3, $4, $6, $(NF - 1) }' |
  tee -a "$O/summary.txt"
grep "^time block-scaled .* algo 0 " "$L" | awk '{ for (i = 1; i <= NF; ++i) if ($i == "TFLOP/s") { v = $(i - 1); break }
  printf "RESULT gemm_algo0_%s_%s %s TFLOP/s\n", $3, $4, v }' | tee -a "$O/summary.txt"

# ---- 2. speed ---------------------------------------------------------------------------------
fp8_llama_args  # LL, FP8, SM
declare -A MS
run_speed() {  # name gbs iters [env...] -- flags...
  local name=$1 gbs=$2 it=$3; shift 3
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  env "${envs[@]}" timeout 60 "$BIN/pretrain_gpt" "${LL[@]}" --global-batch-size "$gbs" --train-iters "$it" "$@" \
    > "$O/$name.log" 2>&1
  local rc=$?
  MS[$name]=$(ms_of "$O/$name.log")
  if [ $rc != 0 ] || [ "${MS[$name]}" = NA ]; then
    fail "$name: rc $rc ($O/$name.log: $(grep -m1 -iE 'error|what' "$O/$name.log"))"; MS[$name]=NA
  fi
  result "ll4_${name}_ms_per_iter" "${MS[$name]}" ms
  [ "${name%%_*}" != bf16 ] && result "ll4_${name}_vs_bf16" "$(ratio "${MS[bf16_gbs$gbs]}" "${MS[$name]}")" x
  info "$name ${envs[*]}: iteration 3 $(grep -m1 -oE 'iteration +3/.*lm loss: [0-9.E+-]+' "$O/$name.log" | grep -oE 'lm loss: [0-9.E+-]+')"
}
for gbs in 1 8; do
  it=$([ $gbs = 1 ] && echo 6 || echo 4)
  run_speed bf16_gbs$gbs $gbs $it --
  run_speed delayed_gbs$gbs $gbs $it -- "${FP8[@]}"
  run_speed blockwise_gbs$gbs $gbs $it -- "${FP8[@]}" --fp8-recipe blockwise
  result "ll4_blockwise_gbs${gbs}_vs_delayed" "$(ratio "${MS[delayed_gbs$gbs]}" "${MS[blockwise_gbs$gbs]}")" x
done
run_speed blockwise-unfused_gbs8 8 4 MEGATRON_FP8_BLOCK_FUSED=0 -- "${FP8[@]}" --fp8-recipe blockwise
result "ll4_blockwise_fused_vs_unfused_gbs8" "$(ratio "${MS[blockwise-unfused_gbs8]}" "${MS[blockwise_gbs8]}")" x

# ---- 3. numerics: fused (default) == unfused, bitwise, in deterministic mode -------------------
SM+=(--fp8-recipe blockwise --deterministic-mode)  # every GEMM dimension a multiple of 128
small_fp8_run detdefault MEGATRON_FP8_BLOCK_FUSED=   # empty = unset: the default (fused)
small_fp8_run detunfused MEGATRON_FP8_BLOCK_FUSED=0
N=$(wc -l < "$O/small_detunfused.loss")
if [ "$N" -lt 33 ] || [ "$(wc -l < "$O/small_detdefault.loss")" != "$N" ]; then
  fail "small blockwise deterministic runs: expected >= 33 losses each, got $(wc -l < "$O/small_detdefault.loss") / $N ($O/small_det*.log)"
elif cmp -s "$O/small_detdefault.loss" "$O/small_detunfused.loss"; then
  pass "small LLaMA blockwise --deterministic-mode, MEGATRON_FP8_BLOCK_FUSED default (1) vs 0: all $N logged losses identical ($(head -1 "$O/small_detdefault.loss") -> $(tail -1 "$O/small_detdefault.loss"))"
else
  fail "small LLaMA blockwise --deterministic-mode, fused (default) vs unfused: max rel diff $(cmp_losses "$O/small_detdefault.loss" "$O/small_detunfused.loss") over $N losses (must be identical)"
fi
info "total $(( $(date +%s) - T0 )) s; logs in $O"
echo "blockq_check: status $status" | tee -a "$O/summary.txt"
exit $status
