#!/usr/bin/env bash
# GPU check of the optimizer step overlapped with the next forward (MEGATRON_OPTIM_OVERLAP=1,
# default 0; megatron/core/optimizer/step_overlap.h; docs/performance.md "Session 9: optimizer
# overlap"): Adam per forward stage on a low-priority side stream (the compute stream becomes a
# high-priority stream), each stage's forward waits for its update, the grad buffers are zeroed
# on the side stream. Same kernels, same per-element arithmetic: with --deterministic-mode every
# logged value and the trained parameters must be bit-identical to the serial step.
#   tests/gpu/optoverlap_check.sh BIN_DIR [LOGDIR]     (BIN_DIR holds pretrain_gpt, CUDA build)
# Logs (small text files only) in LOGDIR (default ${OUT:-/tmp/out}/optoverlap); parameter dumps go
# to /tmp/optoverlap_tmp (hashed, then deleted). Budget < 120 s on one H200 (session 10 measured
# ~5 s per run of the models below).
#  0. gpu_ops_test --only adam: adam_step_multi with AdamParams::table_workspace bit-identical to
#     without (the side stream's launches allocate nothing).
#  1. Speed, default kernels: LLaMA-3-8B-shaped 4 layers seq 8192 (gpucheck_lib.sh fp8_llama_args'
#     LL) at gbs 1, 15 iterations, 0 vs 1: RESULT ms/iter (mean of iterations 3-9), saving, speed-up;
#     iteration 1's loss must be identical (its forward runs before any step). Iterations 10-13
#     under the kernel profiler: RESULT ..._adam_kernels (Adam kernel time per step),
#     ..._adam_alone (Adam time with no GEMM/attention kernel beside it: what stays on the
#     critical path; the overlap works where overlap1's is well below overlap0's) and
#     ..._gemm_kernels (GEMM time, which grows if Adam steals SMs from the GEMMs).
#  2. Bitwise, --deterministic-mode, GPT-2 124M mbs 64 (tied embeddings; 8 iterations; lr warmup 5,
#     so step 1 runs at lr 0 and iteration 3 is the first forward that sees an update):
#       gpt2_det_0   serial step                         gpt2_det_0b  serial step again
#       gpt2_det_1   overlapped                          gpt2_det_1s  overlapped, CUDA_LAUNCH_BLOCKING=1
#       gpt2_det_1w  overlapped, MEGATRON_OPTIM_OVERLAP_FULL_WAIT=1 (each forward stage waits for the
#                    whole step)
#       gpt2_det2_0 / gpt2_det2_1  serial / overlapped, 2 iterations (parameters after step 2)
#     (1s, 1w and det2 run only when 1 differs from 0.)
#     Every logged lm loss and grad norm and the final parameters (MEGATRON_DUMP_PARAMS, sha256)
#     are compared. What the pattern means (printed as a VERDICT line):
#       0 vs 0b differ                 --deterministic-mode is not bitwise at this shape: the
#                                      overlap cannot be judged bitwise (the differences printed)
#       0 = 0b, 1 = 0                  PASS: the overlap is bit-identical
#       0 = 0b, 1 != 0, 1s = 0         timing-dependent: a race in the overlap (serialized
#                                      launches hide it); det2 equal -> the step computes the
#                                      right values and something reads them too early, det2
#                                      differ -> the step's inputs race; 1w = 0 -> a forward
#                                      stage reads before its own wait
#       0 = 0b, 1 != 0, 1s != 0        a deterministic difference of the overlapped path (not a
#                                      race: chunked launches, the compute stream, the zeroing)
#  3. The same for LLaMA-4L gbs 1 (untied), 4 iterations (lr warmup 2): ll_det_0, ll_det_0b,
#     ll_det_1 (no parameter dump: 7.6 GB).
#  4. MEGATRON_OPTIM_OVERLAP=2 is refused with a line naming the variable; each run's start-up line
#     says whether the step is overlapped.
# Every line that matters starts with RESULT/PASS/FAIL/INFO/VERDICT; exit status 1 iff a FAIL.
set -u
BIN="$(cd "${1:?usage: optoverlap_check.sh BIN_DIR [LOGDIR]}" && pwd)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOGDIR="${2:-${OUT:-/tmp/out}/optoverlap}"
mkdir -p "$LOGDIR" && LOGDIR="$(cd "$LOGDIR" && pwd)"
# pass/fail/info, ms_of, ratio, lm_losses, cmp_losses, fp8_llama_args; gc_check_init: $O, the CUDA
# libraries, T0, status, the summary and gpu.txt.
. "$HERE/gpucheck_lib.sh"
OUT="$(dirname "$LOGDIR")" gc_check_init "$(basename "$LOGDIR")"
gc_find_libs optoverlap
TMP=/tmp/optoverlap_tmp
rm -rf "$TMP" && mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
result() { echo "RESULT $*" | tee -a "$O/summary.txt"; }
verdict() { echo "VERDICT $*" | tee -a "$O/summary.txt"; }

fp8_llama_args  # LL (the LLaMA-3-8B-shaped 4-layer model, bf16, clip 1.0, mock data)
for i in "${!LL[@]}"; do [ "${LL[$i]}" = "$O/cache" ] && LL[$i]="$TMP/cache"; done  # the mock-data cache outside the logs
GPT2=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
      --vocab-size 50257 --log-interval 1 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5
      --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 64 --global-batch-size 64
      --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0
      --data-cache-path "$TMP/cache")

# run NAME OVERLAP TIMEOUT ARGS... -> $O/NAME.log (env: MEGATRON_OPTIM_OVERLAP=OVERLAP, EXTRA_ENV);
# checks the start-up line: "overlapped" with 1, "not overlapped (MEGATRON_OPTIM_OVERLAP=0)" with 0.
run() {
  local name=$1 ov=$2 to=$3 rc; shift 3
  env MEGATRON_OPTIM_OVERLAP=$ov ${EXTRA_ENV:-} timeout "$to" "$BIN/pretrain_gpt" "$@" > "$O/$name.log" 2>&1
  rc=$?
  [ $rc = 0 ] || fail "$name: rc $rc ($O/$name.log: $(grep -m1 -iE 'error|what\(\)|terminate' "$O/$name.log"))"
  if [ "$ov" = 1 ]; then
    grep -q "optimizer step overlapped with the next forward" "$O/$name.log" || fail "$name: no 'optimizer step overlapped' start-up line"
  else
    grep -q "optimizer step not overlapped with the next forward (MEGATRON_OPTIM_OVERLAP=0)" "$O/$name.log" ||
      fail "$name: no 'not overlapped (MEGATRON_OPTIM_OVERLAP=0)' start-up line"
  fi
  return $rc
}
# dumped_run NAME OVERLAP TIMEOUT ARGS...: run with MEGATRON_DUMP_PARAMS into a fresh folder; the
# dump's sha256 -> $O/NAME.params_sha256 (empty if missing), the dump deleted.
dumped_run() {
  local name=$1 d="$TMP/dump_$1"; shift
  mkdir -p "$d"
  EXTRA_ENV="${EXTRA_ENV:-} MEGATRON_DUMP_PARAMS=$d" run "$name" "$@"
  sha256sum "$d/params_pp0.bin" 2>/dev/null | cut -d' ' -f1 > "$O/$name.params_sha256"
  rm -rf "$d"
}
# values LOG: every logged lm loss and grad norm, one a line.
values() { grep -oE "(lm loss|grad norm): [0-9.E+-]+" "$1"; }
# same A B: 0 if the two runs' logged values (at least one) and parameter hashes (where both
# dumped) are identical. Writes $O/A.values, $O/B.values.
same() {
  values "$O/$1.log" > "$O/$1.values"; values "$O/$2.log" > "$O/$2.values"
  [ -s "$O/$1.values" ] && cmp -s "$O/$1.values" "$O/$2.values" || return 1
  if [ -f "$O/$1.params_sha256" ] && [ -f "$O/$2.params_sha256" ]; then
    [ -s "$O/$1.params_sha256" ] && cmp -s "$O/$1.params_sha256" "$O/$2.params_sha256" || return 1
  fi
  return 0
}
# describe A B: one line: how many values, the first differing line pair, the max relative loss
# difference, whether the parameter hashes agree.
describe() {
  local n d p=""
  n=$(wc -l < "$O/$1.values")
  d=$(diff "$O/$1.values" "$O/$2.values" | grep -E '^[<>]' | head -2 | tr '\n' ' ')
  lm_losses "$O/$1.log" > "$O/$1.losses"; lm_losses "$O/$2.log" > "$O/$2.losses"
  if [ -f "$O/$1.params_sha256" ] && [ -f "$O/$2.params_sha256" ]; then
    if [ -s "$O/$1.params_sha256" ] && cmp -s "$O/$1.params_sha256" "$O/$2.params_sha256"; then p="; parameters identical"
    else p="; parameters differ or missing ($(head -c 12 "$O/$1.params_sha256") vs $(head -c 12 "$O/$2.params_sha256"))"; fi
  fi
  echo "$1 vs $2: $n values, max rel loss difference $(cmp_losses "$O/$1.losses" "$O/$2.losses")${d:+, first: $d}$p"
}
# check A B WHAT: PASS/FAIL line for "A and B identical"; returns same()'s status.
check() {
  if same "$1" "$2"; then pass "$3: $(describe "$1" "$2")"; return 0; fi
  fail "$3: $(describe "$1" "$2")"; return 1
}
# judge PREFIX: the VERDICT of the PREFIX_0 / _0b / _1 [/ _1s, PREFIX2_0 / PREFIX2_1] runs (see above).
judge() {
  local p=$1 r01 rep r1s r2
  same "${p}_0" "${p}_0b"; rep=$?
  same "${p}_0" "${p}_1"; r01=$?
  if [ $rep != 0 ]; then
    verdict "$p: --deterministic-mode does not repeat bitwise at this shape ($(describe "${p}_0" "${p}_0b")); overlap: $(describe "${p}_0" "${p}_1")"
  elif [ $r01 = 0 ]; then
    verdict "$p: the overlapped step is bit-identical to the serial step (and the serial run repeats bitwise)"
  elif [ -f "$O/${p}_1s.log" ]; then
    same "${p}_0" "${p}_1s"; r1s=$?
    if [ $r1s = 0 ]; then
      if [ -f "$O/${p}2_1.log" ] && same "${p}2_0" "${p}2_1"; then r2="the parameters after step 2 are identical (the step computes the right values: something reads them before they are ready)"
      elif [ -f "$O/${p}2_1.log" ]; then r2="the parameters after step 2 already differ (the step itself reads racing inputs: grads, Adam state)"
      else r2="no 2-iteration pair"; fi
      if [ -f "$O/${p}_1w.log" ] && same "${p}_0" "${p}_1w"; then r2="$r2; FULL_WAIT (every stage waits for the whole step) identical: a forward stage reads before its own wait"
      elif [ -f "$O/${p}_1w.log" ]; then r2="$r2; FULL_WAIT differs too: the race is outside the forward's per-stage waits (zeroing, staging, the step's inputs)"; fi
      verdict "$p: timing-dependent (serialized launches are identical): a race in the overlap; $r2"
    else
      verdict "$p: the overlapped path differs deterministically (also with CUDA_LAUNCH_BLOCKING=1: not a race): $(describe "${p}_0" "${p}_1s")"
    fi
  else
    verdict "$p: the overlapped step differs from a serial run that repeats bitwise (no serialized-launch run to tell a race from a deterministic difference)"
  fi
}

# ---- 0. the Adam kernel with the table workspace the side stream uses ---------------------------
if [ -x "$BIN/gpu_ops_test" ]; then
  timeout 40 "$BIN/gpu_ops_test" --only adam > "$O/gpu_ops_test_adam.log" 2>&1
  rc=$?
  nws=$(grep -c "^PASS adam_step_multi table workspace" "$O/gpu_ops_test_adam.log")
  if [ $rc = 0 ] && [ "$nws" -ge 10 ]; then pass "gpu_ops_test --only adam ($nws table-workspace checks bit-identical; $(tail -1 "$O/gpu_ops_test_adam.log"))"
  else fail "gpu_ops_test --only adam: rc $rc, $nws table-workspace PASS lines ($O/gpu_ops_test_adam.log)"; fi
else
  info "no $BIN/gpu_ops_test: skipped the adam op group"
fi

# ---- 1. speed -------------------------------------------------------------------------------------
# Iterations 3-9 timed, 10-13 under the kernel profiler (CUPTI; the per-category table in the log):
# how long the Adam kernels ran, and how much of that with no GEMM/attention kernel beside them.
gc_find_cupti
for ov in 0 1; do
  EXTRA_ENV="MEGATRON_KERNEL_PROFILE=10:13 MEGATRON_KERNEL_PROFILE_OUT=$TMP/prof_$ov" \
    run ll_gbs1_$ov $ov 90 "${LL[@]}" --global-batch-size 1 --train-iters 15
done
a=$(ms_of "$O/ll_gbs1_0.log" 3 9); b=$(ms_of "$O/ll_gbs1_1.log" 3 9)
result "ll4_gbs1_overlap0 $a ms/iter"
result "ll4_gbs1_overlap1 $b ms/iter"
result "ll4_gbs1_saving $(awk -v a="$a" -v b="$b" 'BEGIN { if (a == "NA" || b == "NA") print "NA"; else printf "%.1f", a - b }') ms/iter"
result "ll4_gbs1_speedup $(ratio "$a" "$b") x"
l0=$(lm_losses "$O/ll_gbs1_0.log" | head -1); l1=$(lm_losses "$O/ll_gbs1_1.log" | head -1)
if [ -n "$l0" ] && [ "$l0" = "$l1" ]; then pass "ll4 gbs1: iteration-1 loss identical ($l0)"; else fail "ll4 gbs1: iteration-1 loss $l0 vs $l1"; fi
# profile_row LOG CATEGORY -> "exclusive total" ms/step (kernel_profile.cpp format_summary), or "NA NA".
profile_row() { awk -v c="$2" '$5 == "|" && $6 == c && $3 == "kernel" { print $7, $9; f = 1; exit } END { if (!f) print "NA NA" }' "$1"; }
for ov in 0 1; do
  read -r ax at < <(profile_row "$O/ll_gbs1_$ov.log" optimizer)
  read -r gx gt < <(profile_row "$O/ll_gbs1_$ov.log" gemm)
  result "ll4_gbs1_overlap${ov}_adam_kernels $at ms/step"
  result "ll4_gbs1_overlap${ov}_adam_alone $ax ms/step"
  result "ll4_gbs1_overlap${ov}_gemm_kernels $gt ms/step"
  info "ll4 gbs1 overlap $ov profile (iterations 10-13): $(grep -m1 -o 'wall [0-9.]* ms/step | GPU busy [0-9.]* ms/step' "$O/ll_gbs1_$ov.log"); adam_alone = Adam time with no GEMM/attention kernel running (the Adam time left on the critical path)"
done
info "after the speed pair: $(( $(date +%s) - T0 )) s"

# ---- 2. GPT-2, deterministic ------------------------------------------------------------------------
dumped_run gpt2_det_0 0 60 "${GPT2[@]}" --train-iters 8 --deterministic-mode
dumped_run gpt2_det_0b 0 60 "${GPT2[@]}" --train-iters 8 --deterministic-mode
dumped_run gpt2_det_1 1 60 "${GPT2[@]}" --train-iters 8 --deterministic-mode
check gpt2_det_0 gpt2_det_0b "gpt2 --deterministic-mode, serial run repeats bitwise"
if ! check gpt2_det_0 gpt2_det_1 "gpt2 --deterministic-mode, overlapped = serial"; then
  EXTRA_ENV="CUDA_LAUNCH_BLOCKING=1" dumped_run gpt2_det_1s 1 90 "${GPT2[@]}" --train-iters 8 --deterministic-mode
  same gpt2_det_0 gpt2_det_1s; info "gpt2 overlapped with CUDA_LAUNCH_BLOCKING=1: $(describe gpt2_det_0 gpt2_det_1s)"
  EXTRA_ENV="MEGATRON_OPTIM_OVERLAP_FULL_WAIT=1" dumped_run gpt2_det_1w 1 60 "${GPT2[@]}" --train-iters 8 --deterministic-mode
  same gpt2_det_0 gpt2_det_1w; info "gpt2 overlapped, every forward stage waiting for the whole step (MEGATRON_OPTIM_OVERLAP_FULL_WAIT=1): $(describe gpt2_det_0 gpt2_det_1w)"
  dumped_run gpt2_det2_0 0 60 "${GPT2[@]}" --train-iters 2 --deterministic-mode
  dumped_run gpt2_det2_1 1 60 "${GPT2[@]}" --train-iters 2 --deterministic-mode
  same gpt2_det2_0 gpt2_det2_1; info "gpt2 after 2 iterations: $(describe gpt2_det2_0 gpt2_det2_1)"
fi
judge gpt2_det
info "after the GPT-2 runs: $(( $(date +%s) - T0 )) s"

# ---- 3. LLaMA-4L, deterministic ---------------------------------------------------------------------
for r in 0:0 0b:0 1:1; do
  run ll_det_${r%%:*} ${r#*:} 90 "${LL[@]}" --global-batch-size 1 --train-iters 4 --deterministic-mode
done
check ll_det_0 ll_det_0b "ll4 gbs1 --deterministic-mode, serial run repeats bitwise"
if ! check ll_det_0 ll_det_1 "ll4 gbs1 --deterministic-mode, overlapped = serial" && [ $(( $(date +%s) - T0 )) -lt 95 ]; then
  EXTRA_ENV="CUDA_LAUNCH_BLOCKING=1" run ll_det_1s 1 60 "${LL[@]}" --global-batch-size 1 --train-iters 4 --deterministic-mode
  same ll_det_0 ll_det_1s; info "ll4 overlapped with CUDA_LAUNCH_BLOCKING=1: $(describe ll_det_0 ll_det_1s)"
fi
judge ll_det

# ---- 4. the switch ----------------------------------------------------------------------------------
MEGATRON_OPTIM_OVERLAP=2 timeout 40 "$BIN/pretrain_gpt" "${GPT2[@]}" --train-iters 2 > "$O/bad_value.log" 2>&1
rc=$?
if [ $rc != 0 ] && grep -q "MEGATRON_OPTIM_OVERLAP=2: expected 0 (off) or 1 (on)" "$O/bad_value.log"; then
  pass "MEGATRON_OPTIM_OVERLAP=2 refused (rc $rc): $(grep -m1 -o 'MEGATRON_OPTIM_OVERLAP=2.*' "$O/bad_value.log")"
else fail "MEGATRON_OPTIM_OVERLAP=2: rc $rc, no clear error ($O/bad_value.log)"; fi

info "total $(( $(date +%s) - T0 )) s; logs in $O"
echo "optoverlap_check: status $status" | tee -a "$O/summary.txt"
exit $status
