#!/usr/bin/env bash
# The MoE grouped GEMM in pretrain_gpt on one GPU (docs/moe.md "Kernels"), < 1 min.
#   tests/gpu/moegemm_check.sh BIN_DIR   (a CUDA build's bin with pretrain_gpt)
# Logs go to ${OUT:-/tmp/out}/moegemm/. PASS/FAIL/INFO lines; exit 1 on any FAIL.
#
# What: a tiny bf16 MoE GPT (2 MoE layers, 16 SwiGLU experts top-4, aux + z loss; 16 experts over
# 256 routed rows per micro-batch leave some experts without tokens) trained 10 iterations on the
# GPU three ways: the grouped cuBLAS GEMM (forced: MEGATRON_MOE_GROUPED_GEMM=1; the default rule
# would pick it here too, small experts), the per-expert cuBLASLt loop
# (MEGATRON_MOE_GROUPED_GEMM=0) and the CPU reference (fp32 math on bf16 values).
# The grouped and loop runs differ only in the GEMMs' summation order (fp32 accumulation, then the
# same bf16 rounding: a last-bit flip in some outputs), so iteration 1's lm loss agrees to 1e-3
# relative and every iteration's to 2e-2 (bf16 training over 10 Adam steps amplifies last-bit
# differences to ~1e-3; a wrong expert row block, a lost expert, a mis-transposed GEMM or a missing
# wgrad accumulation changes the experts' outputs or updates wholesale, while the loss falls by
# ~0.57 over the 10 iterations: 5.575 -> 5.005 on the CPU).
# The CPU run must agree to the same 2e-2 (a bf16 GPU run vs fp32-math CPU run; looser sources of
# difference than grouped vs loop, but the same order of magnitude at this size).
set -u
BIN=${1:?usage: tests/gpu/moegemm_check.sh BIN_DIR}
BIN=$(cd "$BIN" && pwd)
OUTD=${OUT:-/tmp/out}/moegemm
rm -rf "$OUTD"; mkdir -p "$OUTD"
source "$(dirname "$0")/cuda_libs.sh"
status=0
ARGS=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
  --attention-dropout 0.0 --hidden-dropout 0.0 --micro-batch-size 4 --global-batch-size 8 --train-iters 10
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --weight-decay 0.1
  --seed 1234 --mock-data --tokenizer-type NullTokenizer --vocab-size 256 --data-cache-path "$OUTD/cache"
  --log-interval 1 --eval-iters 0 --bf16 --disable-bias-linear --swiglu --num-experts 16 --moe-router-topk 4
  --moe-ffn-hidden-size 96 --moe-grouped-gemm --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3)
run() {  # run NAME DEVICE [ENV...]
  local name=$1 dev=$2; shift 2
  if ! env MEGATRON_DEVICE="$dev" "$@" timeout 120 "$BIN/pretrain_gpt" "${ARGS[@]}" >"$OUTD/$name.log" 2>&1; then
    echo "FAIL $name exited with an error (see $OUTD/$name.log)"; tail -5 "$OUTD/$name.log"; status=1; return 1
  fi
}
compare() {  # compare NAME REF
  python3 - "$OUTD/$1.log" "$OUTD/$2.log" "$1" "$2" <<'PY' || status=1
import re, sys
def parse(path):
    it = {}
    for line in open(path):
        m = re.search(r'\] iteration +(\d+)/.*lm loss: ([0-9.E+-]+)', line)
        if m: it[int(m.group(1))] = float(m.group(2))
    return it
g, r = parse(sys.argv[1]), parse(sys.argv[2])
if not g or sorted(g) != sorted(r) or len(g) != 10:
    print('FAIL %s vs %s: iterations %s vs %s' % (sys.argv[3], sys.argv[4], sorted(g), sorted(r))); sys.exit(1)
rel = {i: abs(g[i] - r[i]) / abs(r[i]) for i in r}
ok = rel[1] <= 1e-3 and max(rel.values()) <= 2e-2
print('%s %s vs %s: lm loss relative difference iteration 1 %.2e, worst %.2e (losses %.4f -> %.4f)'
      % ('PASS' if ok else 'FAIL', sys.argv[3], sys.argv[4], rel[1], max(rel.values()), r[1], r[10]))
sys.exit(0 if ok else 1)
PY
}
run grouped cuda MEGATRON_MOE_GROUPED_GEMM=1 || exit 1
run loop cuda MEGATRON_MOE_GROUPED_GEMM=0 && compare grouped loop
run cpu cpu OMP_NUM_THREADS=8 && compare grouped cpu
grep -h "elapsed time per iteration" "$OUTD/grouped.log" | tail -1 | sed 's/^/INFO grouped: /'
grep -h "elapsed time per iteration" "$OUTD/loop.log" | tail -1 | sed 's/^/INFO loop: /'
exit $status
