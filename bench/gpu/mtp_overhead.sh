#!/usr/bin/env bash
# Multi-token prediction overhead on the GPU machine: the LLaMA-3-8B-shaped 4-layer model of
# run_bench.sh's ll4 suite (seq 8192, mbs 1, bf16, vocab 128256) with --mtp-num-layers 0 and 1,
# same seed and mock data. Prints per run the mean "elapsed time per iteration (ms)" of iterations
# 3..ITERS (the first two carry warm-up), the last "mtp_1 loss", the peak memory line, and the
# D=1 / D=0 step-time ratio. Megatron's FLOPs formula counts one more layer + logits for D=1
# (num_floating_point_operations), so its throughput column stays comparable.
#
#   bench/gpu/mtp_overhead.sh BIN_DIR [OUT_DIR]      (ITERS=10, DTYPE=bf16|fp8)
set -euo pipefail
BIN=$(cd "${1:?usage: mtp_overhead.sh BIN_DIR [OUT_DIR]}" && pwd)
OUT=${2:-/tmp/out/mtp}; mkdir -p "$OUT"
ITERS=${ITERS:-10}
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention
    --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192
    --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm
    --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1
    --global-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
    --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --mock-data --tokenizer-type NullTokenizer
    --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
[ "${DTYPE:-bf16}" = fp8 ] && LL="$LL --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max"
mean_ms() {  # mean elapsed ms of iterations 3..ITERS
  sed -n 's/.* iteration *\([0-9]*\)\/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1 \2/p' "$1" |
    awk -v n="$ITERS" '$1 >= 3 && $1 <= n {s += $2; c++} END {if (c) printf "%.1f", s / c; else print "nan"}'
}
for d in 0 1; do
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 600 "$BIN/pretrain_gpt" $LL --train-iters "$ITERS" \
    --mtp-num-layers $d > "$OUT/ll4_mtp$d.log" 2>&1 || { tail -20 "$OUT/ll4_mtp$d.log"; echo "FAIL: D=$d run"; exit 1; }
  echo "D=$d: $(mean_ms "$OUT/ll4_mtp$d.log") ms/iteration (iterations 3..$ITERS);" \
       "$(grep -o 'throughput per GPU (TFLOP/s/GPU): [0-9.]*' "$OUT/ll4_mtp$d.log" | tail -1);" \
       "$(grep -o 'mtp_1 loss: [0-9.E+-]*' "$OUT/ll4_mtp$d.log" | tail -1)"
  grep 'memory (MB)' "$OUT/ll4_mtp$d.log" | tail -1
done
python3 -c "import sys; a, b = map(float, sys.argv[1:]); print(f'INFO mtp overhead D=1 vs D=0: {b / a:.3f} x step time ({(b / a - 1) * 100:.1f} %)')" \
  "$(mean_ms "$OUT/ll4_mtp0.log")" "$(mean_ms "$OUT/ll4_mtp1.log")"
