#!/usr/bin/env bash
# GPU check of the Session 11 optimizer-bandwidth kernels (docs/performance.md "Session 11:
# optimizer bandwidth"): the multi-tensor Adam kernels of ops/cuda/adam_multi.cu (u2:
# coalesced 16-byte accesses, 4 float4 streams x 2 in flight, persistent grid, evict-first;
# v1 = the kernel before, still the default: u2 measured slower on the H200, device call 20) and the grad-norm stage 1 with two loads in flight
# (MEGATRON_REDUCE_V1=1 = one). All variants compute the same bits.
#   tests/gpu/adamperf_check.sh BIN_DIR [LOGDIR]
# BIN_DIR holds pretrain_gpt, gpu_ops_test and dev/dev_cuda_adam_multi (ninja dev_cuda_adam_multi).
# Logs in LOGDIR (default ${OUT:-/tmp/out}/adamperf). About 75 s on one H200. Steps:
#  1. dev/cuda/adam_multi: every Adam kernel (v1, u2, u4, u2plain, u2chunk, u4chunk, per-tensor)
#     bit-identical to v1 on GPT-2 124M's 148 tensors + odd sizes + a misaligned one (v1 against
#     the CPU reference), the two grad-norm stage-1 loops the same double; then timed on GPT-2's
#     list and on the LLaMA-3-8B-shaped 4-layer list (1.92e9 params): RESULT ms and TB/s each.
#  2. gpu_ops_test --only adam,grad_norm (the float64 formula; every kernel bit-identical).
#  3. LLaMA-3-8B-shaped 4 layers, seq 8192, gbs 1, bf16, clip 1.0 (gpucheck_lib.sh fp8_llama_args),
#     10 iterations, old (MEGATRON_ADAM_KERNEL=v1 MEGATRON_REDUCE_V1=1) vs new (MEGATRON_ADAM_KERNEL=u2): RESULT
#     ms/iter over iterations 3..8 (9-10 are CUPTI-profiled: the adam / reduce kernel lines are
#     printed), and the logged lm loss / grad norm of every iteration equal old vs new. The
#     default (non-deterministic) run is not reproducible bit for bit (cuDNN attention backward,
#     atomics: docs/cuda.md "Deterministic mode"), so a difference there is INFO; the bitwise
#     verdict is step 4.
#  4. A tiny LLaMA (fp8_llama_args' SM without FP8: 30 steps of 4 micro-batches, evaluation every
#     10) with --deterministic-mode, old vs new: all 33 logged losses and grad norms identical.
# Exit status 1 iff a FAIL.
set -u
BIN="$(cd "${1:?usage: adamperf_check.sh BIN_DIR [LOGDIR]}" && pwd)"
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # pass/fail/info, ms_of, fp8_llama_args, gc_*
if [ -n "${2:-}" ]; then mkdir -p "$2" && OUT="$(cd "$2" && pwd)" && gc_check_init . && O="$OUT"
else gc_check_init adamperf; fi
gc_find_libs adamperf
gc_find_cupti
OLD=(MEGATRON_ADAM_KERNEL=v1 MEGATRON_REDUCE_V1=1)

# ---- 1. the dev/cuda driver -----------------------------------------------------------------
D="$BIN/dev/dev_cuda_adam_multi"
if [ -x "$D" ]; then
  timeout 60 "$D" --reps 10 > "$O/dev_adam_multi.log" 2>&1
  rc=$?
  grep -E "^(PASS|FAIL) " "$O/dev_adam_multi.log" | sed 's/^\(PASS\|FAIL\) /\1 [dev adam_multi] /' | tee -a "$O/summary.txt"
  [ $rc = 0 ] || fail "dev_cuda_adam_multi exit $rc ($O/dev_adam_multi.log)"
  grep -E "^TIME adam GPT-2" "$O/dev_adam_multi.log" | awk '{printf "RESULT adam_gpt2_%s %s ms\n", $4, $5}' | tee -a "$O/summary.txt"
  # "BW adam LLaMA <kernel> <ms> ms <TB/s> TB/s", "BW copy ...", "BW grad norm LLaMA <v> <ms> ms <TB/s> TB/s"
  awk '/^BW adam LLaMA/ {printf "RESULT adam_llama_%s %s ms\nRESULT adam_llama_%s_bw %s TB/s\n", $4, $5, $4, $7}
       /^BW copy/ {printf "RESULT copy_bw %s TB/s\n", $(NF-1)}
       /^BW grad norm LLaMA/ {printf "RESULT grad_norm_llama_%s %s ms\nRESULT grad_norm_llama_%s_bw %s TB/s\n", $5, $6, $5, $8}' \
    "$O/dev_adam_multi.log" | tee -a "$O/summary.txt"
  grep -E "^INFO" "$O/dev_adam_multi.log" | tee -a "$O/summary.txt"
else
  fail "$D not built (ninja dev_cuda_adam_multi in the CUDA build dir)"
fi

# ---- 2. gpu_ops_test --------------------------------------------------------------------------
timeout 60 "$BIN/gpu_ops_test" --only adam,grad_norm > "$O/gpu_ops_test.log" 2>&1
rc=$?
grep -E "^FAIL" "$O/gpu_ops_test.log" | head -20
nk=$(grep -cE "^PASS +adam_step_multi kernel " "$O/gpu_ops_test.log")
if [ $rc = 0 ] && [ "$nk" -gt 0 ]; then pass "gpu_ops_test --only adam,grad_norm ($nk per-kernel bitwise checks; $(tail -1 "$O/gpu_ops_test.log"))"
else fail "gpu_ops_test --only adam,grad_norm rc $rc, $nk per-kernel checks ($O/gpu_ops_test.log)"; fi

# ---- 3. LLaMA-3-8B-shaped 4 layers, old vs new ------------------------------------------------
fp8_llama_args  # LL, SM
fields() { grep -oE "lm loss: [0-9.E+-]+|grad norm: [0-9.E+-]+" "$1" | awk '{print $NF}'; }
run_ll() {  # name env... -> $O/name.log
  local name=$1; shift
  mkdir -p "$O/prof_$name"
  env "$@" MEGATRON_KERNEL_PROFILE=9:10 MEGATRON_KERNEL_PROFILE_OUT="$O/prof_$name" \
    timeout 60 "$BIN/pretrain_gpt" "${LL[@]}" --global-batch-size 1 --train-iters 10 > "$O/$name.log" 2>&1 ||
    fail "LLaMA $name: rc $? ($O/$name.log: $(grep -m1 -iE 'error|what' "$O/$name.log"))"
}
run_ll ll_old "${OLD[@]}"
run_ll ll_new MEGATRON_ADAM_KERNEL=u2
ms_old=$(ms_of "$O/ll_old.log" 3 8); ms_new=$(ms_of "$O/ll_new.log" 3 8)
echo "RESULT llama4l_old_ms_per_iter $ms_old ms" | tee -a "$O/summary.txt"
echo "RESULT llama4l_new_ms_per_iter $ms_new ms" | tee -a "$O/summary.txt"
echo "RESULT llama4l_saved_ms_per_iter $(awk -v a="$ms_old" -v b="$ms_new" 'BEGIN { if (a == "NA" || b == "NA") print "NA"; else printf "%.1f", a - b }') ms" | tee -a "$O/summary.txt"
for n in ll_old ll_new; do
  grep -E "kernel profile \|.*(adam_multi|reduce_stage1|iterations|optimizer )" "$O/$n.log" | sed "s/\[Rank 0\] kernel profile | /INFO $n profile: /" | head -6 | tee -a "$O/summary.txt"
done
seen() { cat "$O/$1.log" "$O/prof_$1"/*.json 2>/dev/null | grep -q "$2"; }
if seen ll_new adam_multi_v2_kernel && ! seen ll_old adam_multi_v2_kernel && seen ll_old adam_multi_kernel; then
  pass "the new Adam kernel (adam_multi_v2_kernel) ran in the new run only, adam_multi_kernel in the old (MEGATRON_ADAM_KERNEL=v1)"
else
  fail "Adam kernels not seen where expected in the profiles ($O/prof_ll_{old,new}/, logs)"
fi
fields "$O/ll_old.log" > "$O/ll_old.fields"; fields "$O/ll_new.log" > "$O/ll_new.fields"
nf=$(wc -l < "$O/ll_new.fields")
if [ "$nf" -lt 20 ] || [ "$(wc -l < "$O/ll_old.fields")" != "$nf" ]; then
  fail "LLaMA old/new: expected 10 lm loss + 10 grad norm values each, got $(wc -l < "$O/ll_old.fields") / $nf"
elif cmp -s "$O/ll_old.fields" "$O/ll_new.fields"; then
  pass "LLaMA 4 layers 10 iterations: lm loss and grad norm of every iteration identical old vs new ($(sed -n 1p "$O/ll_new.fields") ... $(grep -oE 'lm loss: [0-9.E+-]+' "$O/ll_new.log" | tail -1))"
else
  info "LLaMA 4 layers old vs new logged values differ (max rel $(cmp_losses "$O/ll_old.fields" "$O/ll_new.fields")); the default path is not run-to-run reproducible (cuDNN attention backward, atomics): step 4 decides"
fi

# ---- 4. tiny LLaMA, --deterministic-mode, old vs new: bitwise ---------------------------------
SMB=(); skip=0
for a in "${SM[@]}"; do  # SM without its --fp8-* flags (each takes one value)
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in --fp8-*) skip=1; continue ;; esac
  SMB+=("$a")
done
run_tiny() {  # name env... -> $O/tiny_name.log, .fields
  local name=$1; shift
  env "$@" timeout 40 "$BIN/pretrain_gpt" "${SMB[@]}" --deterministic-mode > "$O/tiny_$name.log" 2>&1 ||
    fail "tiny $name: rc $? ($O/tiny_$name.log: $(grep -m1 -iE 'error|what' "$O/tiny_$name.log"))"
  grep -oE "lm loss( value)?: [0-9.E+-]+|grad norm: [0-9.E+-]+" "$O/tiny_$name.log" | awk '{print $NF}' > "$O/tiny_$name.fields"
}
run_tiny old "${OLD[@]}"
run_tiny new MEGATRON_ADAM_KERNEL=u2
nf=$(wc -l < "$O/tiny_new.fields")
if [ "$nf" -lt 63 ]; then
  fail "tiny LLaMA: expected 30 lm loss + 30 grad norm + 3 validation values, got $nf ($O/tiny_new.log)"
elif cmp -s "$O/tiny_old.fields" "$O/tiny_new.fields"; then
  pass "tiny LLaMA --deterministic-mode 30 steps: all $nf logged losses and grad norms identical old vs new ($(head -1 "$O/tiny_new.fields") -> $(grep -oE 'iteration +30/.*lm loss: [0-9.E+-]+' "$O/tiny_new.log" | grep -oE '[0-9.E+-]+$'))"
else
  fail "tiny LLaMA --deterministic-mode old vs new differ: first at line $(cmp "$O/tiny_old.fields" "$O/tiny_new.fields" | grep -oE 'line [0-9]+') of $O/tiny_{old,new}.fields"
fi
rm -rf "$O/cache"
info "total $(( $(date +%s) - T0 )) s; logs in $O"
echo "adamperf_check: $([ $status = 0 ] && echo PASS || echo FAIL)" | tee -a "$O/summary.txt"
exit $status
