#!/usr/bin/env bash
# GPU correctness checks of the CUDA backend on one GPU (H200), issue #7 deliverable 3, < 6 min.
#   tests/gpu/run_gpu_tests.sh [BIN_DIR] [OUT_DIR] [what]
# BIN_DIR: a CUDA build's bin dir (pretrain_gpt, gpu_ops_test, fp8_gpu_test; gpu_bench for bench);
# default build/bin. Logs go to OUT_DIR (default ${OUT:-/tmp/out}/gpucheck). what = test (default:
# checks 1-5 below) | bench (gpu_bench + bench/gpu/torch_peers.py) | all (both).
# GPUCHECK_STEPS=ops,train,fp16,det,sanitizer,recompute (default all six) selects checks;
# GPUCHECK_BUDGET (s, default 345) caps the whole test run: every step runs under `timeout`, capped
# by the time left, and a step that no longer fits prints "INFO ... skipped (time budget)".
# Prints PASS/FAIL/INFO lines with numbers; writes OUT_DIR/summary.md (a block to paste into
# docs/gpu-test-log.md) and OUT_DIR/results.tsv. Exit status 1 iff a check FAILed.
#
# Three lanes run side by side (the GPU has room, the host 16 cores):
#  A (foreground, GPU) 1. gpu_ops_test: every CUDA op vs float64 host references on fresh random
#       inputs (fp32 <= 1e-5, bf16 <= 1e-2 relative norm error); fp8_gpu_test --no-timing: FP8
#       casts/quantize bit-exact vs the CPU emulation, FP8 GEMM/linear vs the emulation.
#     2. pretrain_gpt, 50 steps, mock data, dropout 0, --log-interval 1, on the GPU:
#       GPT (LayerNorm, GeLU, learned absolute positions, biases, tied embeddings; 4 layers,
#       hidden 256, 8 heads, seq 256, vocab 4096, mbs 4, gbs 8) and LLaMA (RMSNorm, SwiGLU, RoPE,
#       GQA 4 heads / 2 groups, untied, no biases; same sizes, ffn 704), each fp32, --bf16 and
#       --bf16 --fp8-format hybrid. Every step's lm loss and grad norm vs the CPU run (tolerances
#       below); the final loss and the mean of the last 10 steps; no NaN.
#     3. --fp16 with dynamic loss scaling (GPT: --initial-loss-scale 2^32 --loss-scale-window 8
#       --hysteresis 2 --min-loss-scale 1: nine skipped halvings, then growth; LLaMA: from 2^16,
#       window 5, hysteresis 1, min 2^14) and a static --loss-scale 4096 (GPT), GPU vs the same
#       flags on the CPU: the loss scale of every step and the skipped iterations must be equal,
#       losses/grad norms within the fp16 tolerance.
#     5. tests/gpu/recompute_check.sh (activation recomputation on the GPU; its own PASS/FAIL).
#     6. --deterministic-mode: GPT and LLaMA --bf16 (and LLaMA with MEGATRON_ATTENTION_BACKEND=generic,
#       to tell cuDNN's SDPA backward from our kernels), 50 steps, twice each: every lm loss and grad
#       norm and every trained parameter (MEGATRON_DUMP_PARAMS) bitwise equal between the two runs,
#       and within the bf16 tolerance of the CPU fp32 run; gpu_ops_test's norm, embedding, generic
#       attention and attn_det groups with MEGATRON_DETERMINISTIC=1 (the deterministic kernels).
#  B (background, GPU) 4. compute-sanitizer memcheck, racecheck, initcheck, synccheck on
#       gpu_ops_test --small and on fp8_gpu_test --groups quantize,gemm,linear,weight_cache; memcheck
#       on 2 steps of pretrain_gpt (2-layer GPT bf16, LLaMA bf16 + fp8, GPT fp16). Each tool's error
#       count (tests/gpu/sanitizer_summary.py): racecheck hazards inside cuDNN's own SDPA kernels are
#       known false positives (docs/cuda.md) and reported, not failed. Without compute-sanitizer:
#       an INFO line.
#  C (background, CPU) the CPU references (MEGATRON_DEVICE=cpu) of step 2/3's runs: the fp32 GPT and
#       LLaMA and any run without a fixture (GPUCHECK_LIVE_CPU=all: every reference; =0: none),
#       two at a time, GPUCHECK_CPU_THREADS threads each.
#       A live run that completes its 50 steps in time is the reference; otherwise the CPU log
#       committed in tests/gpu/fixtures/gpucheck/ (made on the CPU build machine with the same
#       flags; the CPU backend is deterministic) is, and the live run's finished steps are compared
#       with it (fp32 vs fp32, <= 1e-4).
#
# Tolerances (relative; "gn" = grad norm, which the log prints with 3 decimals, so +0.0011 absolute):
#  fp32 GPU vs CPU fp32: lm loss <= 1e-4 every step (both sum in fp32 in different orders: ~1e-7
#    per op; cuBLASLt runs fp32 GEMMs without TF32), last-10 mean / final <= 1e-4, gn <= 1e-4.
#  bf16 GPU vs CPU fp32: bf16 keeps 8 significant bits: spacing 2^-8 = 3.9e-3, rounding error <=
#    2^-9 = 2e-3 per rounding; the loss (fp32 log-sum-exp of bf16 logits) moves by a few of those
#    per step and the trajectories drift apart over 50 Adam steps: lm loss <= 2e-2 (5 spacings)
#    every step, last-10 mean and final <= 1e-2, gn <= 5e-2.
#  fp8 hybrid GPU vs the CPU emulation (same quantization, same scales): differences start as bf16
#    rounding differences that flip an e4m3/e5m2 rounding now and then (1 e4m3 step = 2^-3; one FP8
#    linear on the GPU is within 7e-4 of the emulation, fp8_gpu_test): lm loss <= 1e-2, last-10
#    mean / final <= 5e-3, gn <= 1e-1; and the LLaMA GPU fp8 losses must be closer to the emulation
#    than to the GPU bf16 run (FP8 really applied: the CPU fp8 emulation ends 1.2% above fp32 on
#    LLaMA; on the GPT only 0.1%, so there this is reported, not judged).
#  fp16 GPU vs CPU fp16: 11 significant bits, spacing 2^-10 = 9.8e-4: lm loss <= 5e-3 (5 spacings),
#    last-10 mean / final <= 2.5e-3, gn <= 2e-2; loss scale and skip decisions identical.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${1:-$ROOT/build/bin}"
BIN="$(cd "$BIN" 2>/dev/null && pwd || echo "$BIN")"
OUTD="${2:-${OUT:-/tmp/out}/gpucheck}"
WHAT="${3:-test}"
STEPS=",${GPUCHECK_STEPS:-ops,train,fp16,det,sanitizer,recompute},"
BUDGET=${GPUCHECK_BUDGET:-345}
LIVE_CPU=${GPUCHECK_LIVE_CPU:-fp32}
ITERS=${GPUCHECK_ITERS:-50}  # training steps per run (50; fewer only for dry runs: the fixtures have 50)
NCORES=$(nproc 2>/dev/null || echo 8)
CPU_THREADS=${GPUCHECK_CPU_THREADS:-$(( NCORES > 10 ? (NCORES - 6) / 2 : 2 ))}  # 2 runs; cores left for lanes A, B
FIX="$HERE/fixtures/gpucheck"
mkdir -p "$OUTD"
OUTD="$(cd "$OUTD" && pwd)"
# scratch (data caches, parameter dumps) outside OUT_DIR, which keeps only logs
W=$(mktemp -d "${TMPDIR:-/tmp}/gpucheck.XXXXXX")
trap 'rm -rf "$W"' EXIT
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# CUDA libraries: the toolkit's, and those of the PyTorch wheel (cuBLASLt, cuDNN) if present.
. "$HERE/cuda_libs.sh"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
want() { case "$STEPS" in *",$1,"*) return 0;; esac; return 1; }

# result LANE STATUS STEP SECONDS MESSAGE: prints "STATUS STEP: MESSAGE" and appends to results.LANE.tsv
result() {
  local lane=$1 st=$2 step=$3 sec=$4; shift 4
  echo "$st $step: $*"
  printf '%s\t%s\t%s\t%s\n' "$st" "$step" "$sec" "$*" >> "$OUTD/results.$lane.tsv"
}
# from_py LANE STEP SECONDS CMD...: runs a python checker, records each PASS/FAIL/INFO line it prints
from_py() {
  local lane=$1 step=$2 sec=$3; shift 3
  local line out verdicts=0
  out=$(python3 "$@" 2>&1)
  while IFS= read -r line; do
    case "$line" in
      PASS\ *|FAIL\ *|INFO\ *) result "$lane" "${line%% *}" "$step" "$sec" "${line#* }"; verdicts=1;;
      *) echo "  $line";;
    esac
  done <<< "$out"
  [ $verdicts = 1 ] || result "$lane" FAIL "$step" "$sec" "checker $(basename "$2") printed no verdict: $(echo "$out" | tail -1)"
}
# timed TIMEOUT LOG CMD...: runs CMD under timeout (capped by the budget), output to LOG;
# sets RC and SEC. RC 125 = not started (no time left).
timed() {
  local to=$1 log=$2; shift 2
  local l; l=$(left)
  [ "$to" -gt "$l" ] && to=$l
  if [ "$to" -lt 10 ]; then RC=125; SEC=0; echo "(skipped: time budget)" > "$log"; return; fi
  local t1; t1=$(date +%s)
  timeout -k 5 "$to" "$@" > "$log" 2>&1; RC=$?
  SEC=$(( $(date +%s) - t1 ))
}

rm -f "$OUTD"/results.*.tsv "$OUTD/summary.md"
GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUTD/gpu.txt" 2>&1
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "run_gpu_tests: $GPU_NAME, commit $COMMIT, bin $BIN, logs $OUTD, budget ${BUDGET} s, $NCORES cores"

# ---- the training runs (flags shared with the fixtures' generator) ---------------------------------
CACHE_ROOT="$W"
. "$HERE/gpucheck_config.sh"
iters_in() { local n; n=$(grep -cE "\] iteration +[0-9]+/" "$1" 2>/dev/null); echo "${n:-0}"; }

# ---- lane C: live CPU references -----------------------------------------------------------------
CPU_RUNS=()
case $LIVE_CPU in
  0|none) ;;
  all) CPU_RUNS=(gpt_fp32 llama_fp32 gpt_fp8 llama_fp8 gpt_fp16dyn gpt_fp16static llama_fp16dyn);;
  *) CPU_RUNS=(gpt_fp32 llama_fp32)  # and every run without a committed fixture
     for n in gpt_fp8 llama_fp8 gpt_fp16dyn gpt_fp16static llama_fp16dyn; do
       case $n in *fp16*) want fp16 || continue;; *) want train || continue;; esac
       [ -f "$FIX/${n}_cpu.log" ] || CPU_RUNS+=("$n")
     done;;
esac
want train || want fp16 || CPU_RUNS=()
lane_c() {
  local n
  for n in "${CPU_RUNS[@]}"; do
    (
      run_args "$n" cpu
      timed $(( BUDGET - 25 )) "$OUTD/${n}_cpu.log" env MEGATRON_DEVICE=cpu OMP_NUM_THREADS=$CPU_THREADS \
        OPENBLAS_NUM_THREADS=$CPU_THREADS "$BIN/pretrain_gpt" "${RUN_ARGS[@]}"
      echo "$n rc=$RC ${SEC}s iterations=$(iters_in "$OUTD/${n}_cpu.log")" >> "$OUTD/lane_c.txt"
    ) &
    # two at a time (each CPU_THREADS threads)
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 1; done
  done
  wait
}
: > "$OUTD/lane_c.txt"
if [ ${#CPU_RUNS[@]} -gt 0 ] && [ -x "$BIN/pretrain_gpt" ]; then
  lane_c > "$OUTD/lane_c.out" 2>&1 &
  LANE_C=$!
  echo "lane C: live CPU references (${CPU_RUNS[*]}), $CPU_THREADS threads each, pid $LANE_C"
else
  LANE_C=""
fi

# ---- lane B: compute-sanitizer -------------------------------------------------------------------
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
sanitize() {  # sanitize STEP TOOL TIMEOUT ENV... -- CMD...
  local step=$1 tool=$2 to=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local log="$OUTD/san_${step}_${tool}.log"
  # initcheck/synccheck report thousands of records inside cuDNN's kernels: print them all, one
  # short record each (no host backtrace), so that every error is attributed.
  local lim=(--print-limit 100)
  case $tool in initcheck|synccheck) lim=(--print-limit 1000000 --show-backtrace no);; esac
  timed "$to" "$log" env "${envs[@]}" "$SAN" --tool "$tool" --error-exitcode 3 "${lim[@]}" "$@"
  if [ $RC = 125 ]; then result B INFO "sanitizer $step" 0 "$tool skipped (time budget)"; return; fi
  from_py B "sanitizer $step" "$SEC" "$HERE/sanitizer_summary.py" "$SEC s" "$tool" "$log" "$RC"
}
lane_b() {
  if [ ! -x "$SAN" ]; then result B INFO sanitizer 0 "compute-sanitizer not found (PATH, /usr/local/cuda/bin): step 4 not run"; return; fi
  "$SAN" --version 2>&1 | tail -1
  local T=(--num-layers 2 --train-iters 2 --lr-warmup-iters 1)
  run_args gpt_bf16 san; local gpt_bf16=("${RUN_ARGS[@]}" "${T[@]}")
  run_args llama_bf16 san; local llama_bf16=("${RUN_ARGS[@]}" "${T[@]}")
  run_args llama_fp8 san; local llama_fp8=("${RUN_ARGS[@]}" "${T[@]}")
  run_args gpt_fp16dyn san; local gpt_fp16=("${RUN_ARGS[@]}" "${T[@]}")
  local OPS=("$BIN/gpu_ops_test" --small --seed 1) FP8T=("$BIN/fp8_gpu_test" --no-timing --groups quantize,gemm,linear,weight_cache)
  # most informative first: whatever does not fit in the budget is reported as skipped
  sanitize ops_small memcheck 120 X=1 -- "${OPS[@]}"
  sanitize gpt_bf16_2steps memcheck 100 MEGATRON_DEVICE=cuda -- "$BIN/pretrain_gpt" "${gpt_bf16[@]}"
  sanitize llama_fp8_2steps memcheck 100 MEGATRON_DEVICE=cuda -- "$BIN/pretrain_gpt" "${llama_fp8[@]}"
  sanitize ops_small racecheck 120 X=1 -- "${OPS[@]}"
  sanitize ops_small initcheck 120 X=1 -- "${OPS[@]}"
  sanitize ops_small synccheck 100 X=1 -- "${OPS[@]}"
  sanitize fp8 memcheck 60 X=1 -- "${FP8T[@]}"
  sanitize fp8 racecheck 60 X=1 -- "${FP8T[@]}"
  sanitize fp8 initcheck 60 X=1 -- "${FP8T[@]}"
  sanitize fp8 synccheck 60 X=1 -- "${FP8T[@]}"
  sanitize llama_bf16_2steps memcheck 100 MEGATRON_DEVICE=cuda -- "$BIN/pretrain_gpt" "${llama_bf16[@]}"
  sanitize gpt_fp16_2steps memcheck 100 MEGATRON_DEVICE=cuda -- "$BIN/pretrain_gpt" "${gpt_fp16[@]}"
}
if [ "$WHAT" != bench ] && want sanitizer; then
  # GPUCHECK_SANITIZER_GPU=N runs this lane on another GPU (machines with two), off lane A's GPU.
  CUDA_VISIBLE_DEVICES=${GPUCHECK_SANITIZER_GPU:-$CUDA_VISIBLE_DEVICES} lane_b > "$OUTD/lane_b.out" 2>&1 &
  LANE_B=$!
  echo "lane B: compute-sanitizer ($SAN) in the background, pid $LANE_B"
else
  LANE_B=""
fi

# ---- lane A: kernels, GPU training runs, recompute --------------------------------------------
if [ "$WHAT" != bench ]; then
  if want ops; then
    echo "== 1. gpu_ops_test (every CUDA op vs float64 host references, fresh random inputs)"
    timed 150 "$OUTD/gpu_ops_test.log" "$BIN/gpu_ops_test"
    grep "^FAIL" "$OUTD/gpu_ops_test.log" | head -20
    summ=$(grep -E "^gpu_ops_test: [0-9]+ of [0-9]+ checks passed" "$OUTD/gpu_ops_test.log" | tail -1)
    seed=$(grep -oE "^gpu_ops_test seed [0-9]+" "$OUTD/gpu_ops_test.log" | head -1)
    worst=$(awk '/^PASS/ { for (i = 1; i < NF; ++i) if ($i == "rel_err" && $(i + 1) + 0 > m) { m = $(i + 1) + 0; w = $2 } }
                 END { if (m > 0) printf "largest rel_err %.3g (%s)", m, w }' "$OUTD/gpu_ops_test.log")
    if [ $RC = 0 ] && [ -n "$summ" ]; then result A PASS gpu_ops_test "$SEC" "${summ#gpu_ops_test: }, $seed, $worst"
    else result A FAIL gpu_ops_test "$SEC" "exit $RC: ${summ:-no summary line} ($seed; $(grep -c '^FAIL' "$OUTD/gpu_ops_test.log") FAIL lines, log gpu_ops_test.log)"; fi
    timed 90 "$OUTD/fp8_gpu_test.log" "$BIN/fp8_gpu_test" --no-timing
    grep -E "^FAIL" "$OUTD/fp8_gpu_test.log" | head -10
    summ=$(grep -E "^fp8_gpu_test: [0-9]+ of [0-9]+ checks passed" "$OUTD/fp8_gpu_test.log" | tail -1)
    if [ $RC = 0 ] && [ -n "$summ" ]; then result A PASS fp8_gpu_test "$SEC" "${summ#fp8_gpu_test: } (casts/quantize bit-exact vs the CPU emulation, GEMM/linear within its tolerances)"
    else result A FAIL fp8_gpu_test "$SEC" "exit $RC: ${summ:-no summary line} (log fp8_gpu_test.log)"; fi
  fi

  GPU_RUNS=()
  want train && GPU_RUNS+=(gpt_fp32 gpt_bf16 llama_fp32 llama_bf16 gpt_fp8 llama_fp8)
  want fp16 && GPU_RUNS+=(gpt_fp16dyn gpt_fp16static llama_fp16dyn)
  if [ ${#GPU_RUNS[@]} -gt 0 ]; then
    echo "== 2/3. pretrain_gpt on the GPU, $ITERS steps each: ${GPU_RUNS[*]}"
    for n in "${GPU_RUNS[@]}"; do
      run_args "$n" gpu
      timed 75 "$OUTD/${n}_gpu.log" env MEGATRON_DEVICE=cuda "$BIN/pretrain_gpt" "${RUN_ARGS[@]}"
      it=$(iters_in "$OUTD/${n}_gpu.log")
      last=$(grep -E "\] iteration +[0-9]+/" "$OUTD/${n}_gpu.log" | tail -1 | grep -oE "lm loss: [0-9.E+-]+|loss scale: [0-9.]+|grad norm: [0-9.]+" | tr '\n' ' ')
      echo "  $n: exit $RC, $SEC s, $it/$ITERS iterations; last: $last"
      if [ $RC != 0 ]; then
        result A FAIL "train $n" "$SEC" "pretrain_gpt on the GPU exited with $RC after $it iterations: $(grep -iE "error|what\(\)|abort" "$OUTD/${n}_gpu.log" | head -1 | cut -c1-200)"
      fi
    done
  fi

  if want det; then
    echo "== 6. --deterministic-mode: two runs must agree bitwise"
    # llama_generic: the LLaMA pair with MEGATRON_ATTENTION_BACKEND=generic (no cuDNN): tells whether a
    # difference comes from cuDNN's SDPA backward (deterministic.h) or from our kernels
    for m in gpt llama llama_generic; do
      ok=1; mod=${m%%_*}; be=auto; [ "$m" = llama_generic ] && be=generic
      for k in 1 2; do
        run_args ${mod}_bf16 det$k
        rm -rf "$W/det_${m}_$k"; mkdir -p "$W/det_${m}_$k"
        timed 60 "$OUTD/${m}_det$k.log" env MEGATRON_DEVICE=cuda MEGATRON_DUMP_PARAMS="$W/det_${m}_$k" \
          MEGATRON_ATTENTION_BACKEND=$be "$BIN/pretrain_gpt" "${RUN_ARGS[@]}" --deterministic-mode
        [ $RC = 0 ] || { ok=0; result A FAIL "deterministic $m" "$SEC" "run $k exited with $RC (log ${m}_det$k.log)"; }
      done
      [ $ok = 1 ] || continue
      nb=0; nd=0
      for f in "$W/det_${m}_1"/*.bin; do
        [ -f "$f" ] || continue
        nb=$((nb + 1)); cmp -s "$f" "$W/det_${m}_2/$(basename "$f")" || nd=$((nd + 1))
      done
      from_py A "deterministic $m" "$SEC" "$HERE/train_log_compare.py" "${m} bf16 --deterministic-mode, run 2 vs run 1" \
        "$OUTD/${m}_det2.log" "$OUTD/${m}_det1.log" --iters "$ITERS" --loss-tol 0 --mean-tol 0 --gn-tol 0 --gn-abs 0
      if [ $nb -gt 0 ] && [ $nd = 0 ]; then result A PASS "deterministic $m" "$SEC" "trained parameters bitwise equal after $ITERS steps ($nb dump files)"
      else result A FAIL "deterministic $m" "$SEC" "$nd of $nb parameter dump files differ between the two runs"; fi
      # the deterministic kernels train like the default ones: vs the CPU fp32 reference, bf16 tolerances
      r="$FIX/${mod}_fp32_cpu.log"; [ "$(iters_in "$OUTD/${mod}_fp32_cpu.log")" -ge "$ITERS" ] && r="$OUTD/${mod}_fp32_cpu.log"
      from_py A "deterministic $m" 0 "$HERE/train_log_compare.py" "${m} bf16 --deterministic-mode GPU vs ${mod}_fp32 CPU" \
        "$OUTD/${m}_det1.log" "$r" --iters "$ITERS" --loss-tol 2e-2 --mean-tol 1e-2 --gn-tol 5e-2
    done
    # the deterministic-mode kernels (norm and embedding backward without atomics, the two-pass flash
    # attention backward and the generic kernels) against the float64 references
    timed 90 "$OUTD/gpu_ops_test_det.log" env MEGATRON_DETERMINISTIC=1 "$BIN/gpu_ops_test" --only norms,embedding_ce,attn_generic,attn_det
    summ=$(grep -E "^gpu_ops_test: [0-9]+ of [0-9]+ checks passed" "$OUTD/gpu_ops_test_det.log" | tail -1)
    if [ $RC = 0 ] && [ -n "$summ" ]; then result A PASS "deterministic kernels" "$SEC" "MEGATRON_DETERMINISTIC=1 gpu_ops_test --only norms,embedding_ce,attn_generic,attn_det: ${summ#gpu_ops_test: }"
    else result A FAIL "deterministic kernels" "$SEC" "MEGATRON_DETERMINISTIC=1 gpu_ops_test: exit $RC, ${summ:-no summary} (log gpu_ops_test_det.log)"; fi
  fi

  if want recompute; then
    echo "== 5. tests/gpu/recompute_check.sh"
    if [ "$(left)" -lt 90 ]; then
      result A INFO recompute 0 "skipped (time budget: $(left) s left, it needs ~75 s)"
    else
      timed 130 "$OUTD/recompute_check.log" env OUT="$OUTD" bash "$HERE/recompute_check.sh" "$BIN"
      grep -E "^(PASS|FAIL)" "$OUTD/recompute_check.log" | while IFS= read -r line; do
        result A "${line%% *}" recompute "$SEC" "${line#* }"
      done
      grep -qE "^(PASS|FAIL)" "$OUTD/recompute_check.log" || result A FAIL recompute "$SEC" "exit $RC, no PASS/FAIL line (log recompute_check.log)"
      [ $RC = 0 ] || grep -q "^FAIL" "$OUTD/recompute_check.log" || result A FAIL recompute "$SEC" "exit $RC (timed out?) (log recompute_check.log)"
    fi
  fi

  # ---- comparisons (wait for the live CPU references while the budget lasts) ----
  if [ ${#GPU_RUNS[@]} -gt 0 ]; then
    if [ -n "$LANE_C" ]; then
      while kill -0 "$LANE_C" 2>/dev/null && [ "$(left)" -gt 15 ]; do sleep 2; done
      kill -0 "$LANE_C" 2>/dev/null && { kill -- "$LANE_C" 2>/dev/null; pkill -P "$LANE_C" 2>/dev/null; }
      sed 's/^/  lane C: /' "$OUTD/lane_c.txt"
    fi
    # ref NAME -> path of the CPU reference log of run NAME (live if complete, else the fixture)
    ref() {
      local live="$OUTD/$1_cpu.log" fix="$FIX/$1_cpu.log"
      if [ -f "$live" ] && [ "$(iters_in "$live")" -ge "$ITERS" ]; then echo "$live"; else echo "$fix"; fi
    }
    for n in "${CPU_RUNS[@]}"; do  # live CPU vs the committed fixture (same flags, another machine)
      live="$OUTD/${n}_cpu.log"; k=$(iters_in "$live")
      if [ "$k" -ge "$ITERS" ]; then
        result A INFO "cpu ref $n" 0 "the live CPU run completed $k steps: it is the reference"
      elif [ -f "$FIX/${n}_cpu.log" ]; then
        result A INFO "cpu ref $n" 0 "the live CPU run completed $k of $ITERS steps in time: the fixture is the reference"
      else
        result A FAIL "cpu ref $n" 0 "the live CPU run completed $k of $ITERS steps and there is no fixture $FIX/${n}_cpu.log"
      fi
      if [ "$k" -gt 0 ] && [ -f "$FIX/${n}_cpu.log" ]; then
        case $n in *fp32) tl=(1e-4 1e-4 1e-4);; *) tl=(5e-3 2.5e-3 2e-2);; esac
        from_py A "cpu ref $n" 0 "$HERE/train_log_compare.py" "live CPU $n ($k steps) vs the fixture" "$live" "$FIX/${n}_cpu.log" \
          --iters "$k" --loss-tol "${tl[0]}" --mean-tol "${tl[1]}" --gn-tol "${tl[2]}" --info-only $([[ $n == *fp16* ]] && echo --fp16)
      fi
    done
    cmp_run() {  # cmp_run GPU_RUN REF_RUN LOSS MEAN GN [--fp16|--info-only]
      local g=$1 c=$2; shift 2
      local r; r=$(ref "$c")
      local src=fixture; [ "$r" = "$OUTD/${c}_cpu.log" ] && src="live CPU"
      from_py A "train $g" 0 "$HERE/train_log_compare.py" "$g GPU vs ${c} CPU ($src)" "$OUTD/${g}_gpu.log" "$r" \
        --iters "$ITERS" --loss-tol "$1" --mean-tol "$2" --gn-tol "$3" "${@:4}"
    }
    echo "== 2. GPU vs CPU, every step"
    for m in gpt llama; do
      case " ${GPU_RUNS[*]} " in *" ${m}_fp32 "*)
        cmp_run ${m}_fp32 ${m}_fp32 1e-4 1e-4 1e-4
        cmp_run ${m}_bf16 ${m}_fp32 2e-2 1e-2 5e-2
        # closer to the emulation than to GPU bf16: judged on LLaMA, where FP8 moves the loss by ~1%
        # (CPU fixtures); on this GPT it moves it by only ~0.1%, so there it is reported
        if [ $m = llama ]; then cmp_run ${m}_fp8 ${m}_fp8 1e-2 5e-3 1e-1 --closer-than "$OUTD/${m}_bf16_gpu.log"
        else
          cmp_run ${m}_fp8 ${m}_fp8 1e-2 5e-3 1e-1
          cmp_run ${m}_fp8 ${m}_fp8 1e-2 5e-3 1e-1 --closer-than "$OUTD/${m}_bf16_gpu.log" --info-only
        fi
        cmp_run ${m}_fp8 ${m}_fp32 5e-2 3e-2 2e-1 --info-only
        from_py A "train ${m}_fp8" 0 "$HERE/train_log_compare.py" "${m}_fp8 GPU vs ${m}_bf16 GPU" "$OUTD/${m}_fp8_gpu.log" \
          "$OUTD/${m}_bf16_gpu.log" --iters "$ITERS" --loss-tol 5e-2 --mean-tol 3e-2 --gn-tol 2e-1 --info-only;;
      esac
    done
    case " ${GPU_RUNS[*]} " in *" gpt_fp16dyn "*)
      echo "== 3. --fp16 loss scaling: GPU vs CPU with the same flags"
      for n in gpt_fp16dyn gpt_fp16static llama_fp16dyn; do cmp_run $n $n 5e-3 2.5e-3 2e-2 --fp16; done;;
    esac
  fi
fi

# ---- wait for lane B -----------------------------------------------------------------------------
if [ -n "$LANE_B" ]; then
  echo "== 4. compute-sanitizer (lane B)"
  while kill -0 "$LANE_B" 2>/dev/null && [ "$(left)" -gt 0 ]; do sleep 2; done
  kill -0 "$LANE_B" 2>/dev/null && { pkill -P "$LANE_B" 2>/dev/null; kill "$LANE_B" 2>/dev/null; }
  wait "$LANE_B" 2>/dev/null
  grep -vE "^(PASS|FAIL|INFO) " "$OUTD/lane_b.out" | head -3 | sed 's/^/  /'
  grep -E "^(PASS|FAIL|INFO) " "$OUTD/lane_b.out"
fi
[ -n "$LANE_C" ] && kill -0 "$LANE_C" 2>/dev/null && { pkill -P "$LANE_C" 2>/dev/null; kill "$LANE_C" 2>/dev/null; }

if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  echo "== gpu_bench"
  "$BIN/gpu_bench" 2>&1 | tee "$OUTD/gpu_bench.log"
  echo "== torch peers"
  PYTHONUNBUFFERED=1 python3 "$ROOT/bench/gpu/torch_peers.py" 2>&1 | tee "$OUTD/torch_peers.log"
fi

# ---- summary -------------------------------------------------------------------------------------
cat "$OUTD"/results.*.tsv > "$OUTD/results.tsv" 2>/dev/null
npass=$(grep -c "^PASS" "$OUTD/results.tsv"); nfail=$(grep -c "^FAIL" "$OUTD/results.tsv"); ninfo=$(grep -c "^INFO" "$OUTD/results.tsv")
{
  echo "## $(date -u '+%Y-%m-%d %H:%M') UTC — tests/gpu/run_gpu_tests.sh, commit $COMMIT"
  echo "Machine: ${GPU_NAME:-?}, $NCORES host cores. $npass PASS, $nfail FAIL, $ninfo INFO in $(( $(date +%s) - T0 )) s."
  echo "Logs: \`$OUTD\`. CPU references: live runs where complete, else \`tests/gpu/fixtures/gpucheck/\`."
  echo
  echo "| result | step | s | numbers |"
  echo "|---|---|---|---|"
  awk -F'\t' '{ gsub(/\|/, "/", $4); printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }' "$OUTD/results.tsv"
} > "$OUTD/summary.md"
echo
echo "----- summary (paste into docs/gpu-test-log.md) -----"
cat "$OUTD/summary.md"
echo "-----"
status=0; [ "$nfail" -gt 0 ] && status=1
[ "$WHAT" != bench ] && [ "$npass" = 0 ] && status=1
echo "run_gpu_tests: $([ $status = 0 ] && echo "ALL PASSED" || echo "FAILED ($nfail)") in $(( $(date +%s) - T0 )) s, status $status"
exit $status
