#!/usr/bin/env bash
# GPU check of the Session 9 "optoverlap" change (issue 21): the optimizer step overlapped with
# the next forward (megatron/core/optimizer/step_overlap.h; docs/performance.md "Session 9:
# optimizer overlap"). MEGATRON_OPTIM_OVERLAP=1 (opt-in until this check has passed) runs Adam per forward stage on a
# low-priority side stream (the compute stream becomes a high-priority stream), each stage's
# forward waits for its update, and the grad buffers are zeroed on the side stream;
# MEGATRON_OPTIM_OVERLAP=0 is the serial step. Same kernels, same per-element arithmetic: results
# must be bit-identical.
#   tests/gpu/optoverlap_check.sh BIN_DIR [LOGDIR]     (BIN_DIR holds pretrain_gpt, CUDA build)
# Logs (small text files only) in LOGDIR (default ${OUT:-/tmp/out}/optoverlap); checkpoints and
# parameter dumps go to /tmp/optoverlap_* and are deleted. Budget < 150 s on one H200.
#  0. gpu_ops_test --only adam: adam_step_multi with AdamParams::table_workspace bit-identical to
#     without (the launches of the side stream allocate nothing).
#  1. Speed, default (non-deterministic) kernels, 0 vs 1 in this call: LLaMA-3-8B-shaped 4 layers
#     seq 8192 (gpucheck_lib.sh fp8_llama_args' LL) at gbs 1 (15 iterations) and gbs 8 (5), GPT-2
#     124M mbs 64 (gpt2perf_check.sh's flags, 20 iterations): RESULT ms/iter (mean of iterations
#     3..), the saving and the speed-up. Iteration 1's loss must be bit-identical (its forward
#     uses only deterministic kernels); later losses differ run to run in this mode (atomics in the
#     norm/embedding/attention backward), so they are INFO.
#  2. Bitwise, --deterministic-mode (every reduction in a fixed order): GPT-2 124M (8 iterations,
#     final parameters dumped with MEGATRON_DUMP_PARAMS and compared by sha256) and, at the end if
#     the time budget allows (or OPTOVERLAP_FULL=1), the LLaMA shape gbs 1 (4 iterations): every
#     logged loss and grad norm identical between 0 and 1.
#  3. The full-wait paths (checkpoint save, evaluation, --log-params-norm): a tiny GPT with
#     --save/--save-interval 5, --eval-interval 4, --log-params-norm, deterministic, 0 vs 1:
#     training/validation losses, grad norms, params norms identical; the saved checkpoint
#     directories compared file by file (INFO: a file may hold a time stamp).
#  4. No race visible to serialization: the tiny GPT with overlap on, CUDA_LAUNCH_BLOCKING=1
#     (every launch synchronous) vs normal: identical logged values.
#  5. MEGATRON_OPTIM_OVERLAP=2 is refused with a line naming the variable; each run's start-up
#     line says whether the step is overlapped (and with 1 it must be).
#  6. If time is left: the LLaMA deterministic pair (2.), and the overlapped LLaMA gbs 1 run with
#     MEGATRON_OPTIM_OVERLAP_PRIORITY=0 (legacy compute stream: what the priority buys).
# Every line that matters starts with RESULT/PASS/FAIL/INFO; exit status 1 iff a FAIL.
set -u
BIN="$(cd "${1:?usage: optoverlap_check.sh BIN_DIR [LOGDIR]}" && pwd)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOGDIR="${2:-${OUT:-/tmp/out}/optoverlap}"
mkdir -p "$LOGDIR" && LOGDIR="$(cd "$LOGDIR" && pwd)"
# pass/fail/info, ms_of, ratio, lm_losses, fp8_llama_args, TINY_GPT; gc_check_init: $O, the CUDA
# libraries, T0, status, the summary and gpu.txt.
. "$HERE/gpucheck_lib.sh"
OUT="$(dirname "$LOGDIR")" gc_check_init "$(basename "$LOGDIR")"
gc_find_libs optoverlap
TMP=/tmp/optoverlap_tmp
rm -rf "$TMP" && mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
result() { echo "RESULT $*" | tee -a "$O/summary.txt"; }

fp8_llama_args  # LL (the LLaMA-3-8B-shaped 4-layer model, bf16, clip 1.0, mock data)
for i in "${!LL[@]}"; do [ "${LL[$i]}" = "$O/cache" ] && LL[$i]="$TMP/cache"; done  # the mock-data cache outside the logs
GPT2=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
      --vocab-size 50257 --log-interval 1 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5
      --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 64 --global-batch-size 64
      --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0
      --data-cache-path "$TMP/cache")
TINY=($TINY_GPT --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234
      --data-cache-path "$TMP/cache" --bf16 --deterministic-mode)

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
# values LOG: every logged lm loss (training and validation), grad norm and params norm, one a line.
values() { grep -oE "(lm loss( value)?|grad norm|params norm): [0-9.E+-]+" "$1"; }
# same_values A B WHAT MIN: PASS if the two logs' values are identical and at least MIN, else FAIL.
same_values() {
  local a=$1 b=$2 what=$3 min=$4 n
  values "$O/$a.log" > "$O/$a.values"; values "$O/$b.log" > "$O/$b.values"
  n=$(wc -l < "$O/$a.values")
  if [ "$n" -ge "$min" ] && cmp -s "$O/$a.values" "$O/$b.values"; then
    pass "$what: $n logged values (losses, grad norms) identical, $a vs $b"
  else
    fail "$what: $a vs $b differ or too few values ($n, want >= $min): $(diff "$O/$a.values" "$O/$b.values" | head -4 | tr '\n' ' ')"
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

# ---- 1. speed ---------------------------------------------------------------------------------
speed() {  # label ms0 ms1 -> RESULT <label>_overlap0|_overlap1|_saving|_speedup <value> <unit>
  local l=${1// /_}
  result "${l}_overlap0 $2 ms/iter"
  result "${l}_overlap1 $3 ms/iter"
  result "${l}_saving $(awk -v a="$2" -v b="$3" 'BEGIN { if (a == "NA" || b == "NA") print "NA"; else printf "%.1f", a - b }') ms/iter"
  result "${l}_speedup $(ratio "$2" "$3") x"
}
first_loss_same() {  # A B label
  local a b
  a=$(lm_losses "$O/$1.log" | head -1); b=$(lm_losses "$O/$2.log" | head -1)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$3: iteration-1 loss identical ($a)"; else fail "$3: iteration-1 loss $a vs $b"; fi
  paste <(lm_losses "$O/$1.log") <(lm_losses "$O/$2.log") > "$O/$3.loss_pairs"
  info "$3: max rel loss difference 0 vs 1 over all iterations $(cmp_losses <(cut -f1 "$O/$3.loss_pairs") <(cut -f2 "$O/$3.loss_pairs")) (non-deterministic kernels: run-to-run noise)"
}
for ov in 0 1; do run ll_gbs1_$ov $ov 90 "${LL[@]}" --global-batch-size 1 --train-iters 15; done
speed "ll4 gbs1" "$(ms_of "$O/ll_gbs1_0.log")" "$(ms_of "$O/ll_gbs1_1.log")"
first_loss_same ll_gbs1_0 ll_gbs1_1 "ll4 gbs1"
for ov in 0 1; do run ll_gbs8_$ov $ov 90 "${LL[@]}" --global-batch-size 8 --train-iters 5; done
speed "ll4 gbs8" "$(ms_of "$O/ll_gbs8_0.log")" "$(ms_of "$O/ll_gbs8_1.log")"
first_loss_same ll_gbs8_0 ll_gbs8_1 "ll4 gbs8"
for ov in 0 1; do run gpt2_$ov $ov 60 "${GPT2[@]}" --train-iters 20; done
speed "gpt2 mbs64" "$(ms_of "$O/gpt2_0.log")" "$(ms_of "$O/gpt2_1.log")"
first_loss_same gpt2_0 gpt2_1 "gpt2 mbs64"
info "after the speed runs: $(( $(date +%s) - T0 )) s"

# ---- 2. bitwise, deterministic mode -------------------------------------------------------------
for ov in 0 1; do
  EXTRA_ENV="MEGATRON_DUMP_PARAMS=$TMP/dump_$ov" run gpt2_det_$ov $ov 60 "${GPT2[@]}" --train-iters 8 --deterministic-mode
  sha256sum "$TMP/dump_$ov"/params_pp0.bin 2>/dev/null | cut -d' ' -f1 > "$O/gpt2_det_$ov.params_sha256"
done
same_values gpt2_det_0 gpt2_det_1 "gpt2 mbs64 --deterministic-mode" 16
s0=$(cat "$O/gpt2_det_0.params_sha256"); s1=$(cat "$O/gpt2_det_1.params_sha256")
if [ -n "$s0" ] && [ "$s0" = "$s1" ]; then pass "gpt2 --deterministic-mode: final parameters identical (sha256 ${s0:0:16}...)"
else fail "gpt2 --deterministic-mode: final parameter dumps differ or missing ('${s0:0:16}' vs '${s1:0:16}')"; fi
rm -rf "$TMP"/dump_*
info "after the bitwise runs: $(( $(date +%s) - T0 )) s"

# ---- 3. full-wait paths: save, evaluation, params norm -----------------------------------------
for ov in 0 1; do
  rm -rf "$TMP/ckpt"
  run tiny_paths_$ov $ov 40 "${TINY[@]}" --save "$TMP/ckpt" --save-interval 5 --eval-interval 4 --eval-iters 2 --log-params-norm
  mv "$TMP/ckpt" "$TMP/ckpt_$ov" 2>/dev/null
done
same_values tiny_paths_0 tiny_paths_1 "tiny GPT with --save, --eval-interval 4, --log-params-norm" 90
grep -q "validation loss at" "$O/tiny_paths_1.log" || fail "tiny_paths_1: no validation line"
grep -q "saved checkpoint\|saving checkpoint" "$O/tiny_paths_1.log" || fail "tiny_paths_1: no checkpoint-save line"
if diff -rq "$TMP/ckpt_0" "$TMP/ckpt_1" > "$O/ckpt_diff.txt" 2>&1; then
  info "tiny GPT checkpoints (6 saves): every file byte-identical between 0 and 1"
else
  info "tiny GPT checkpoints: $(wc -l < "$O/ckpt_diff.txt") files differ ($O/ckpt_diff.txt; time stamps or real differences: compare the tensors if any model/optimizer file is listed)"
fi
rm -rf "$TMP"/ckpt*

# ---- 4. serialized launches vs normal, overlap on ------------------------------------------------
run tiny_normal 1 40 "${TINY[@]}" --eval-interval 10 --eval-iters 2
EXTRA_ENV="CUDA_LAUNCH_BLOCKING=1" run tiny_blocking 1 60 "${TINY[@]}" --eval-interval 10 --eval-iters 2
same_values tiny_normal tiny_blocking "tiny GPT overlap on, CUDA_LAUNCH_BLOCKING=1 vs normal" 60

# ---- 5. the switch ---------------------------------------------------------------------------------
MEGATRON_OPTIM_OVERLAP=2 timeout 40 "$BIN/pretrain_gpt" "${TINY[@]}" --train-iters 2 > "$O/bad_value.log" 2>&1
rc=$?
if [ $rc != 0 ] && grep -q "MEGATRON_OPTIM_OVERLAP=2: expected 0 (off) or 1 (on)" "$O/bad_value.log"; then
  pass "MEGATRON_OPTIM_OVERLAP=2 refused (rc $rc): $(grep -m1 -o 'MEGATRON_OPTIM_OVERLAP=2.*' "$O/bad_value.log")"
else fail "MEGATRON_OPTIM_OVERLAP=2: rc $rc, no clear error ($O/bad_value.log)"; fi

# ---- optional, if time is left (OPTOVERLAP_FULL=1: always) ----------------------------------------
# The LLaMA shape's deterministic pair (two more ~20 s start-ups).
if [ -n "${OPTOVERLAP_FULL:-}" ] || [ $(( $(date +%s) - T0 )) -lt 95 ]; then
  for ov in 0 1; do run ll_det_$ov $ov 90 "${LL[@]}" --global-batch-size 1 --train-iters 4 --deterministic-mode; done
  same_values ll_det_0 ll_det_1 "ll4 gbs1 --deterministic-mode" 8
  info "ll4 gbs1 --deterministic-mode ms/iter: 0 $(ms_of "$O/ll_det_0.log"), 1 $(ms_of "$O/ll_det_1.log")"
else
  info "skipped the LLaMA-shape --deterministic-mode pair (time budget: $(( $(date +%s) - T0 )) s used; OPTOVERLAP_FULL=1 runs it)"
fi
# The compute stream's priority: overlap on with the legacy compute stream.
if [ -n "${OPTOVERLAP_FULL:-}" ] || [ $(( $(date +%s) - T0 )) -lt 120 ]; then
  EXTRA_ENV="MEGATRON_OPTIM_OVERLAP_PRIORITY=0" run ll_gbs1_1_noprio 1 60 "${LL[@]}" --global-batch-size 1 --train-iters 15
  result "ll4_gbs1_overlap1_legacy_compute_stream $(ms_of "$O/ll_gbs1_1_noprio.log") ms/iter"
else
  info "skipped the MEGATRON_OPTIM_OVERLAP_PRIORITY=0 run (time budget: $(( $(date +%s) - T0 )) s used)"
fi
info "total $(( $(date +%s) - T0 )) s; logs in $O"
echo "optoverlap_check: status $status" | tee -a "$O/summary.txt"
exit $status
