#!/usr/bin/env bash
# Full activation recomputation on one H200 (issue #7 deliverable 2), < 60 s (~75 s worst case).
#   tests/gpu/recompute_check.sh BIN_DIR      (BIN_DIR holds a CUDA build's pretrain_gpt)
# Results and logs go to ${OUT:-/tmp/out}/recompute/. Prints PASS/FAIL lines; exit 1 on FAIL.
#
# 1. Tiny LLaMA (4 layers, hidden 64, ffn 176, 4 heads / 2 groups, RoPE, RMSNorm, SwiGLU, seq 64,
#    dropout 0.1, bf16, 2 micro-batches x 5 iterations) three times: without recomputation twice
#    (ref, ref2: does the GPU run repeat itself bitwise?) and with --recompute-granularity full
#    --recompute-method uniform --recompute-num-layers 1. Recomputation replays the same kernels
#    on the same inputs with the same dropout offsets, so with deterministic kernels every printed
#    lm loss / grad norm and the trained parameters (MEGATRON_DUMP_PARAMS) are bitwise equal (as
#    on the CPU: tests/functional_tests/pretrain_gpt_recompute.sh). Our CUDA backward is NOT
#    deterministic (atomics in the norm/embedding/attention dK,dV reductions, cuDNN SDPA backward;
#    docs/training.md --deterministic-mode: ~1e-6 relative run to run), so:
#    PASS if the lm losses agree within 1e-6 relative, or within max(1e-5, 4 x the ref/ref2
#    difference) when ref and ref2 themselves differ (the line says which), and every grad norm
#    within one printed unit (0.001, the log's resolution). The parameter dumps are compared with
#    cmp and reported (bitwise or not). Same for --fp8-format hybrid (the replay records no amax).
# 2. LLaMA-3-8B-shaped 4-layer model (hidden 4096, ffn 14336, 32 heads / 8 groups, seq 8192,
#    vocab 128256, bf16, mbs 1, gbs 2, 3 iterations) with full uniform 1 recomputation and without:
#    prints our "[Rank 0] (after N iterations) memory (MB) | allocated | max allocated | ..."
#    lines and the tokens/s of the last iteration (2 x 8192 tokens / elapsed). The TFLOP/s in the
#    log are Megatron's model FLOPs (recomputation not counted), so they drop with recompute.
#    Expected drop of "max allocated" (after 2 iterations): per layer the activations kept
#    without recomputation are 17 h bf16 values per token (x, RMSNorm outputs 2h, QKV 1.5h,
#    attention out h, x1 h, fc1 out 7h, SwiGLU out 3.5h) plus fp32 rstd x2 and lse x32, and h with
#    recomputation; uniform 1 keeps 4 inputs and replays one layer, saving 3 x (A - I) =
#    3 x 16 x 4096 x 8192 x 2 B + 3 MiB = 3075 MiB (the log's "MB" are MiB). The CPU unit test
#    RecomputeMemory.LlamaShapedFourLayersSaveThreeLayersOfActivations measures exactly 3.000 x
#    (A - I) on the same proportions. PASS if the drop is >= 2300 MB (75%; more is fine: the GPU
#    attention may keep extra layouts, which recomputation also drops).
#    Set RECOMPUTE_SKIP_BASELINE=1 to skip the run without recomputation (then no memory PASS).
set -u
BIN=${1:?usage: tests/gpu/recompute_check.sh BIN_DIR}
BIN=$(cd "$BIN" && pwd)
OUTD=${OUT:-/tmp/out}/recompute
mkdir -p "$OUTD"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
source "$(dirname "$0")/cuda_libs.sh"
T0=$(date +%s)
status=0
pass() { echo "PASS recompute: $*"; }
fail() { echo "FAIL recompute: $*"; status=1; }
UNIFORM1=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)

# ---- 1. tiny LLaMA: with vs without recomputation ------------------------------------------
TINY=(--num-layers 4 --hidden-size 64 --ffn-hidden-size 176 --num-attention-heads 4 --group-query-attention
  --num-query-groups 2 --seq-length 64 --max-position-embeddings 64 --position-embedding-type rope --swiglu
  --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --bf16
  --attention-dropout 0.1 --hidden-dropout 0.1 --micro-batch-size 2 --global-batch-size 4 --train-iters 5
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 1 --clip-grad 1.0 --seed 1234 --mock-data
  --tokenizer-type NullTokenizer --vocab-size 128 --make-vocab-size-divisible-by 64 --log-interval 1
  --eval-iters 0 --data-cache-path "$OUTD/cache")
tiny() {  # tiny NAME EXTRA...
  local name=$1; shift
  rm -rf "$OUTD/$name.params"; mkdir -p "$OUTD/$name.params"
  MEGATRON_DUMP_PARAMS="$OUTD/$name.params" timeout 30 "$BIN/pretrain_gpt" "${TINY[@]}" "$@" >"$OUTD/$name.log" 2>&1 ||
    { fail "$name exited with status $? (see $OUTD/$name.log)"; tail -5 "$OUTD/$name.log"; return 1; }
}
vals() {  # "loss gradnorm" per iteration
  sed -nE 's/.*\] iteration .*lm loss: ([0-9.E+-]+) .*grad norm: ([0-9.E+-]+) .*/\1 \2/p' "$OUTD/$1.log"
}
maxrel() {  # max relative difference of the lm losses ("1" if missing/NaN), "gn" appended if a grad norm differs > 0.001
  python3 - "$1" "$2" <<'EOF'
import sys, math
a = [l.split() for l in open(sys.argv[1])]; b = [l.split() for l in open(sys.argv[2])]
if len(a) != len(b) or not a: print(1.0); sys.exit()
m, gn = 0.0, ""
for x, y in zip(a, b):
    u, v = float(x[0]), float(y[0])
    if not (math.isfinite(u) and math.isfinite(v)): m = 1.0; continue
    m = max(m, abs(u - v) / max(abs(u), 1e-30))
    if abs(float(x[1]) - float(y[1])) > 0.0011: gn = "gn"
print(f"{m:.3g}{gn}")
EOF
}
compare_pair() {  # compare_pair LABEL REF REF2 RECOMPUTE
  local label=$1 r=$2 r2=$3 rc=$4
  vals "$r" >"$OUTD/$r.vals"; vals "$r2" >"$OUTD/$r2.vals"; vals "$rc" >"$OUTD/$rc.vals"
  local n; n=$(wc -l <"$OUTD/$r.vals")
  [ "$n" -ge 5 ] || { fail "$label: $n training log lines in $r (expected 5)"; return; }
  local noise dev bits=""
  noise=$(maxrel "$OUTD/$r.vals" "$OUTD/$r2.vals"); dev=$(maxrel "$OUTD/$r.vals" "$OUTD/$rc.vals")
  local f same=1 rsame=1
  for f in "$OUTD/$r.params"/*.bin; do cmp -s "$f" "$OUTD/$rc.params/$(basename "$f")" || same=0; done
  for f in "$OUTD/$r.params"/*.bin; do cmp -s "$f" "$OUTD/$r2.params/$(basename "$f")" || rsame=0; done
  [ $same = 1 ] && bits="parameters bitwise equal to ref" || bits="parameters not bitwise equal to ref"
  [ $rsame = 1 ] && bits="$bits; ref2 bitwise equal to ref (deterministic run)" ||
    bits="$bits; ref2 differs from ref (non-deterministic GPU backward, loss rel diff ${noise%gn})"
  echo "  $label last iteration (loss, grad norm): ref $(tail -1 "$OUTD/$r.vals") | recompute $(tail -1 "$OUTD/$rc.vals")"
  case "$dev" in *gn) fail "$label: a grad norm differs by more than one printed unit with recomputation; $bits"; return;; esac
  if awk -v d="$dev" 'BEGIN {exit !(d <= 1e-6)}'; then
    pass "$label: 5 iterations' lm loss with uniform-1 recomputation vs without: max rel diff $dev (<= 1e-6), grad norms within 0.001; $bits"
  elif awk -v d="$dev" -v n="${noise%gn}" 'BEGIN {b = 4 * n; if (b < 1e-5) b = 1e-5; exit !(n > 0 && d <= b)}'; then
    pass "$label: lm loss max rel diff $dev with recomputation, within max(1e-5, 4 x run-to-run ${noise%gn}) (GPU backward not deterministic), grad norms within 0.001; $bits"
  else
    fail "$label: lm loss max rel diff $dev with recomputation vs run-to-run ${noise%gn} (if run-to-run is 0 the GPU run was deterministic here and the difference comes from recomputation -- or from rare non-determinism: rerun once); $bits"
  fi
}
tiny ref && tiny ref2 && tiny uniform1 "${UNIFORM1[@]}" && compare_pair "tiny LLaMA bf16" ref ref2 uniform1
tiny fp8_ref --fp8-format hybrid && tiny fp8_ref2 --fp8-format hybrid &&
  tiny fp8_uniform1 --fp8-format hybrid "${UNIFORM1[@]}" && compare_pair "tiny LLaMA bf16 + FP8 hybrid" fp8_ref fp8_ref2 fp8_uniform1
# MoE (dense / MoE layers, 4 experts top-2, aux + z loss, jitter, expert bias): the same bounds, and
# the printed load_balancing_loss / z_loss of the recomputed run within 1e-3 relative of ref's (a
# double count in the replay would print twice the value; docs/moe.md "Activation recomputation").
MOE=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-layer-freq '([0]+[1])*2'
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-input-jitter-eps 0.1
  --moe-router-score-function sigmoid --moe-router-enable-expert-bias)
moe_metrics() { sed -nE 's/.*load_balancing_loss: ([0-9.E+-]+) \| z_loss: ([0-9.E+-]+) .*/\1 \2/p' "$OUTD/$1.log"; }
if tiny moe_ref "${MOE[@]}" && tiny moe_ref2 "${MOE[@]}" && tiny moe_uniform1 "${MOE[@]}" "${UNIFORM1[@]}"; then
  compare_pair "tiny LLaMA bf16 MoE" moe_ref moe_ref2 moe_uniform1
  moe_metrics moe_ref >"$OUTD/moe_ref.moe"; moe_metrics moe_uniform1 >"$OUTD/moe_uniform1.moe"
  if python3 - "$OUTD/moe_ref.moe" "$OUTD/moe_uniform1.moe" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1])]; b = [l.split() for l in open(sys.argv[2])]
ok = len(a) >= 5 and len(a) == len(b) and all(
    abs(float(p) - float(q)) <= 1e-3 * abs(float(p)) for x, y in zip(a, b) for p, q in zip(x, y))
print('  MoE metrics (last iteration) ref', a[-1] if a else None, 'recompute', b[-1] if b else None)
sys.exit(not ok)
EOF
  then pass "tiny MoE: load_balancing_loss / z_loss with recomputation within 1e-3 relative of ref (counted once)"
  else fail "tiny MoE: load_balancing_loss / z_loss differ with recomputation (see $OUTD/moe_*.log)"; fi
fi
echo "  (tiny runs: $(( $(date +%s) - T0 )) s)"

# ---- 2. LLaMA-3-8B-shaped 4 layers ----------------------------------------------------------
BIG=(--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention
  --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope
  --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
  --vocab-size 128256 --make-vocab-size-divisible-by 128 --micro-batch-size 1 --global-batch-size 2 --bf16
  --train-iters 3 --log-interval 1 --log-throughput --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
  --lr-warmup-iters 1 --clip-grad 1.0 --mock-data --tokenizer-type NullTokenizer --attention-dropout 0
  --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path "$OUTD/cache")
big() {  # big NAME EXTRA...: prints memory lines and tokens/s
  local name=$1; shift
  local t1; t1=$(date +%s)
  timeout 45 "$BIN/pretrain_gpt" "${BIG[@]}" "$@" >"$OUTD/$name.log" 2>&1; local rc=$?
  echo "== $name: rc=$rc, $(( $(date +%s) - t1 )) s"
  grep -E "memory \(MB\)" "$OUTD/$name.log"
  local ms; ms=$(grep -E "\] iteration +3/" "$OUTD/$name.log" | sed -nE 's/.*elapsed time per iteration \(ms\): ([0-9.]+).*/\1/p')
  local tf; tf=$(grep -E "\] iteration +3/" "$OUTD/$name.log" | sed -nE 's/.*\(TFLOP\/s\/GPU\): ([0-9.]+).*/\1/p')
  [ -n "$ms" ] && echo "  $name: iteration 3: $ms ms, $(awk -v m="$ms" 'BEGIN{printf "%.0f", 2 * 8192 / (m / 1000)}') tokens/s, ${tf:-?} model TFLOP/s"
  grep -E "^error|internal error|out of memory|FAIL" "$OUTD/$name.log" | head -3
  return $rc
}
max_alloc() { sed -nE 's/.*\(after 2 iterations\) memory \(MB\).*\| max allocated: ([0-9.]+).*/\1/p' "$1" | head -1; }
big big_uniform1 "${UNIFORM1[@]}"; rcu=$?
if [ $rcu = 0 ] && grep -qE "\] iteration +3/" "$OUTD/big_uniform1.log" && ! grep -q "nan iterations: *[1-9]" "$OUTD/big_uniform1.log"; then
  pass "LLaMA-8B-shaped 4 layers, seq 8192, full uniform 1: 3 iterations, no NaN"
else
  fail "LLaMA-8B-shaped 4 layers with recomputation (rc $rcu; see $OUTD/big_uniform1.log)"
fi
if [ "${RECOMPUTE_SKIP_BASELINE:-0}" != 1 ]; then
  big big_none; rcn=$?
  au=$(max_alloc "$OUTD/big_uniform1.log"); an=$(max_alloc "$OUTD/big_none.log")
  if [ $rcn = 0 ] && [ -n "$au" ] && [ -n "$an" ]; then
    drop=$(awk -v a="$an" -v b="$au" 'BEGIN{printf "%.0f", a - b}')
    if awk -v d="$drop" 'BEGIN{exit !(d >= 2300)}'; then
      pass "max allocated after 2 iterations: $au MB with recompute vs $an MB without: drop $drop MB (expected ~3075, want >= 2300)"
    else
      fail "max allocated after 2 iterations: $au MB with recompute vs $an MB without: drop $drop MB (expected ~3075, want >= 2300)"
    fi
  else
    fail "no max-allocated comparison (rc $rcn, '$au' / '$an' MB; logs in $OUTD)"
  fi
fi
echo "recompute_check: $(( $(date +%s) - T0 )) s, commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null), $(date -u +%FT%TZ)"
exit $status
