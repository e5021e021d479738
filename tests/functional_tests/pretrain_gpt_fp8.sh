#!/usr/bin/env bash
# pretrain_gpt --bf16 --fp8-format hybrid on the CPU (quantize-dequantize emulation of the FP8
# GEMMs, docs/fp8.md): a tiny LLaMA on mock data trains (loss falls by > 1 nat in 16 iterations),
# the checkpoint holds the FP8 amax histories and scales, and a resume from iteration 8 reproduces
# iterations 9..16 of the straight run exactly (the restored scales are the ones the straight run
# used; fresh scales would change the quantized GEMMs and the losses). The FP8 weight cache
# (docs/fp8.md) changes no number: with 2 micro-batches per step and an evaluation every 4 steps,
# MEGATRON_FP8_WEIGHT_CACHE=0 gives the same losses (training and validation) to the last digit.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export MEGATRON_DEVICE=cpu
ARGS=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 2 --group-query-attention
      --num-query-groups 1 --kv-channels 16 --seq-length 32 --max-position-embeddings 32
      --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
      --disable-bias-linear --attention-dropout 0 --hidden-dropout 0
      --micro-batch-size 2 --global-batch-size 4 --train-iters 16 --lr 1e-2 --min-lr 1e-3
      --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
      --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$OUT/cache"
      --log-interval 1 --eval-iters 0 --bf16
      --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max)
fail() { for f in "$OUT"/*.log; do echo "== $f"; cat "$f"; done; echo "FAIL: $*"; exit 1; }

"$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/a.log" 2>&1 || fail "straight run"
"$BIN/pretrain_gpt" "${ARGS[@]}" --save "$OUT/ck" --save-interval 100 --exit-interval 8 > "$OUT/b1.log" 2>&1 || fail "first half"
"$BIN/pretrain_gpt" "${ARGS[@]}" --load "$OUT/ck" > "$OUT/b2.log" 2>&1 || fail "resumed run"

"$BIN/pretrain_gpt" "${ARGS[@]}" --eval-interval 4 --eval-iters 1 > "$OUT/c_on.log" 2>&1 || fail "cache-on run"
MEGATRON_FP8_WEIGHT_CACHE=0 "$BIN/pretrain_gpt" "${ARGS[@]}" --eval-interval 4 --eval-iters 1 > "$OUT/c_off.log" 2>&1 ||
  fail "cache-off run"
grep -oE "lm loss( value)?: [0-9.E+-]+" "$OUT/c_on.log" > "$OUT/c_on.loss"
grep -oE "lm loss( value)?: [0-9.E+-]+" "$OUT/c_off.log" > "$OUT/c_off.loss"
[[ $(wc -l < "$OUT/c_on.loss") -ge 20 ]] || fail "expected 16 training + 4 validation losses"
cmp -s "$OUT/c_on.loss" "$OUT/c_off.loss" || fail "FP8 weight cache changed the losses: $(diff "$OUT/c_on.loss" "$OUT/c_off.loss" | head -4)"

loss() { grep " iteration *$2/ *16 " "$1" | sed 's/.*lm loss: \([0-9.E+-]*\) .*/\1/'; }
first=$(loss "$OUT/a.log" 1); last=$(loss "$OUT/a.log" 16)
python3 -c "import sys; f,l=float('$first'),float('$last'); sys.exit(0 if l < f - 1.0 else 1)" ||
  fail "fp8 loss did not fall by > 1 nat ($first -> $last)"
grep -q '_extra_state.fp8.amax_history' "$OUT"/ck/iter_0000008/.metadata 2>/dev/null ||
  grep -rqa '_extra_state.fp8.amax_history' "$OUT/ck/iter_0000008" || fail "no FP8 state in the checkpoint"
for it in 9 12 16; do
  a=$(loss "$OUT/a.log" $it); b=$(loss "$OUT/b2.log" $it)
  [[ -n "$a" && "$a" == "$b" ]] || fail "iteration $it differs after resume: straight $a vs resumed $b"
done
echo "OK: fp8 (CPU emulation) lm loss $first -> $last; resume from iteration 8 exact; weight cache on == off"
