#!/usr/bin/env bash
# Attention dropout inside the flash attention kernels on one H200 (docs/cuda.md "Attention",
# docs/performance.md "Session 10: attention dropout"), < 120 s.
#   tests/gpu/flashdrop_check.sh BIN_DIR LOGDIR   (a CUDA build's bin with gpu_ops_test, pretrain_gpt;
#   logs under LOGDIR/flashdrop). RESULT / PASS / FAIL / INFO lines; exit 1 on any FAIL.
#
# 1. gpu_ops_test --only attn_dropout: the flash kernels' dropout masks (forward and backward) equal
#    the SplitMix64 stream element for element (mask probe), their out/lse/dq/dk/dv match a float64
#    reference and the generic kernels (causal, full, explicit mask, GQA, head dims 64/128, s not a
#    multiple of the tile, p 0.1 and 0.5, flash v2 8 / 4 warps and v1), a different stream key differs.
#    Then --only attn_generic (the generic kernels and the dispatch cases, which now send bf16 dropout
#    to the flash kernels). PASS: every check passed.
# 2. GPT-2 124M (bench/gpu/run_bench.sh's GPT2 shape at mbs 8, so that the generic run fits the
#    budget) with Megatron's default dropouts (attention 0.1, hidden 0.1), 8 iterations, under
#    MEGATRON_ATTENTION_BACKEND=generic vs auto (-> flash). RESULT: ms/iter of both, the speed-up.
#    PASS: iteration-1 lm loss equal within 1e-3 relative and every iteration within 1e-2 (the same
#    weights, data and dropout masks; different summation order and bf16 rounding of P and dS in the
#    flash kernels, ~1e-4 relative at iteration 1). At initialization the loss (~ln 50257) hardly
#    depends on the attention output, so this checks the wiring end to end (dispatch, no NaN, the
#    gradients steering 8 Adam steps alike: a wrong dV/dS scaling would drift past 1e-2), not the
#    masks, which section 1 checks exactly. Also PASS only if the auto log names the flash kernels in
#    its dropout note and the generic log the generic kernel.
# 3. Speed, Mixtral-shaped 2-layer pretrain_gpt (tests/gpu/moefp8_check.sh section 2b's config, bf16,
#    seq 4096, GQA 8, head dim 128, mock data, 8 iterations) with --attention-dropout 0.1 (Megatron's
#    default; now the flash kernels with dropout; before: the generic kernel, 1579 ms/iter) vs 0
#    (cuDNN). RESULT: mean ms/iter of iterations 3-8 of both, and their ratio.
set -u
BIN="${1:?usage: tests/gpu/flashdrop_check.sh BIN_DIR LOGDIR}"
OUT="${2:-${OUT:-/tmp/out}}"
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"
gc_check_init flashdrop name,driver_version  # O=$OUT/flashdrop, GPU 0, CUDA libraries, status=0
CACHE=$(mktemp -d)  # mock-data index files: not logs, kept out of LOGDIR
trap 'rm -rf "$CACHE"' EXIT
result() { echo "RESULT $1 $2 $3" | tee -a "$O/summary.txt"; }

# ---- 1. kernel checks
for grp in attn_dropout attn_generic; do
  if timeout 60 "$BIN/gpu_ops_test" --only "$grp" >"$O/gpu_ops_test_$grp.log" 2>&1; then
    pass "gpu_ops_test --only $grp: $(tail -1 "$O/gpu_ops_test_$grp.log")"
  else
    fail "gpu_ops_test --only $grp (see $O/gpu_ops_test_$grp.log): $(tail -1 "$O/gpu_ops_test_$grp.log")"
    grep '^FAIL' "$O/gpu_ops_test_$grp.log" | head -10
  fi
done

run() {  # run NAME TIMEOUT ARGS... (environment from the caller) -> $O/NAME.log
  local name=$1 t=$2; shift 2
  if ! timeout "$t" "$BIN/pretrain_gpt" "$@" >"$O/$name.log" 2>&1; then
    fail "$name exited with an error (see $O/$name.log)"; tail -5 "$O/$name.log"; return 1
  fi
}

# ---- 2. GPT-2 124M, Megatron's default dropouts, generic vs auto (flash)
GPT2=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
  --vocab-size 50257 --log-interval 1 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5
  --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 8 --global-batch-size 8
  --attention-dropout 0.1 --hidden-dropout 0.1 --train-iters 8 --eval-iters 0 --seed 1234 --mock-data
  --tokenizer-type NullTokenizer --data-cache-path "$CACHE")
if MEGATRON_ATTENTION_BACKEND=generic run gpt2_generic 50 "${GPT2[@]}" && MEGATRON_ATTENTION_BACKEND=auto run gpt2_auto 40 "${GPT2[@]}"; then
  g=$(ms_of "$O/gpt2_generic.log"); a=$(ms_of "$O/gpt2_auto.log")
  result flashdrop_gpt2_124m_mbs8_drop_generic_ms_per_iter "$g" ms
  result flashdrop_gpt2_124m_mbs8_drop_auto_ms_per_iter "$a" ms
  result flashdrop_gpt2_124m_mbs8_drop_speedup "$(ratio "$g" "$a")" x
  python3 - "$O/gpt2_auto.log" "$O/gpt2_generic.log" <<'PY' | tee -a "$O/summary.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
import math, re, sys
def losses(path):
    it = {}
    for line in open(path):
        m = re.search(r'\] iteration +(\d+)/.*lm loss: ([0-9.E+-]+|nan|inf)', line)
        if m: it[int(m.group(1))] = float(m.group(2))
    return it
def note(path):
    return ''.join(l for l in open(path) if l.startswith('note: attention dropout'))
la, lg = losses(sys.argv[1]), losses(sys.argv[2])
def rel(i):
    a, g = la.get(i, float('nan')), lg.get(i, float('nan'))
    return abs(a - g) / abs(g) if math.isfinite(a) and math.isfinite(g) and g != 0 else float('inf')
r1 = rel(1)
worst = max([rel(i) for i in lg] or [float('inf')]) if sorted(la) == sorted(lg) and len(lg) == 8 else float('inf')
ok_loss = r1 <= 1e-3 and worst <= 1e-2
print('%s gpt2 dropout 0.1 lm loss flash (auto) vs generic: iteration 1 relative %.2e (bound 1e-3), worst %.2e '
      '(bound 1e-2); losses %s' % ('PASS' if ok_loss else 'FAIL', r1, worst,
      ' '.join('%d:%.5f/%.5f' % (i, la.get(i, float('nan')), lg[i]) for i in sorted(lg))))
na, ng = note(sys.argv[1]), note(sys.argv[2])
ok = 'flash attention kernels' in na and 'generic CUDA attention kernel' not in na and 'generic CUDA attention kernel' in ng
print('%s dropout note: auto -> flash, generic -> generic (auto: %r; generic: %r)' % ('PASS' if ok else 'FAIL', na.strip(), ng.strip()))
sys.exit(0 if ok_loss and ok else 1)
PY
fi
# ---- 3. Mixtral-shaped 2 layers, dropout 0.1 (flash) vs 0 (cuDNN)
MIXTRAL=(--num-layers 2 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention
  --num-query-groups 8 --kv-channels 128 --seq-length 4096 --max-position-embeddings 4096 --position-embedding-type rope
  --rotary-base 1000000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
  --vocab-size 32000 --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 1e-2 --micro-batch-size 1 --global-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5
  --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --eval-iters 0
  --seed 1234 --mock-data --tokenizer-type NullTokenizer --data-cache-path "$CACHE")
if MEGATRON_ATTENTION_BACKEND=auto run mixtral_drop01 45 "${MIXTRAL[@]}" --train-iters 8 --attention-dropout 0.1 &&
  MEGATRON_ATTENTION_BACKEND=auto run mixtral_drop0 45 "${MIXTRAL[@]}" --train-iters 8 --attention-dropout 0.0; then
  d1=$(ms_of "$O/mixtral_drop01.log"); d0=$(ms_of "$O/mixtral_drop0.log")
  result flashdrop_mixtral_2l_drop0.1_ms_per_iter "$d1" ms
  result flashdrop_mixtral_2l_drop0_ms_per_iter "$d0" ms
  result flashdrop_mixtral_2l_drop0.1_over_drop0 "$(ratio "$d1" "$d0")" x
  info "mixtral dropout 0.1: $(grep -h '^note: attention dropout' "$O/mixtral_drop01.log")"
fi

# FLASHDROP_MIXTRAL_GENERIC=1 (off by default: ~30 s more): the old path (the generic kernel) in the
# same binary, 4 iterations, for the before/after figure.
if [ "${FLASHDROP_MIXTRAL_GENERIC:-0}" = 1 ] && MEGATRON_ATTENTION_BACKEND=generic run mixtral_drop01_generic 60 \
  "${MIXTRAL[@]}" --train-iters 4 --attention-dropout 0.1; then
  result flashdrop_mixtral_2l_drop0.1_generic_ms_per_iter "$(ms_of "$O/mixtral_drop01_generic.log")" ms
fi
info "flashdrop_check: $(( $(date +%s) - T0 )) s"
exit $status
