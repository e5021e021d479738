#!/usr/bin/env bash
# The training step's cost of checkpointing in pretrain_gpt: no save vs --save (synchronous) vs
# --save --async-save, same model and data, saves at iterations 5, 10, 15 of 20 (and the final one
# at 20, outside the measured window). Figure: the sum of Megatron's "elapsed time per iteration"
# over iterations 2..20 (the save after iteration i is inside iteration i+1's interval), and per
# save (mode - none) / 3. Not a test; results go to docs/performance.md.
# Usage: bench/checkpoint/pretrain_gpt_save_cost.sh BIN_DIR [WORK_DIR] [REPEATS]
set -euo pipefail
BIN=$1 WORK=${2:-/tmp/pretrain_gpt_save_cost} REP=${3:-2}
mkdir -p "$WORK"
ARGS=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 128 --max-position-embeddings 128
  --micro-batch-size 4 --global-batch-size 4 --train-iters 20 --lr 1e-4 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 1024 --data-cache-path "$WORK/cache"
  --log-interval 1 --eval-iters 0)
sum() { grep -oE 'iteration +[0-9]+/ +20 \| .*elapsed time per iteration \(ms\): [0-9.]+' "$1" |
        awk '{ split($0, a, "/"); it = a[1]; sub(/.*iteration +/, "", it); if (it + 0 >= 2) { sub(/.*: /, ""); s += $0 } } END { printf "%.0f", s }'; }
for r in $(seq "$REP"); do
  for mode in none sync async; do
    rm -rf "$WORK/ckpt"
    extra=()
    [ "$mode" != none ] && extra=(--save "$WORK/ckpt" --save-interval 5)
    [ "$mode" = async ] && extra+=(--async-save)
    "$BIN/pretrain_gpt" "${ARGS[@]}" "${extra[@]}" > "$WORK/$mode.log" 2>&1
    size=$(du -sb "$WORK/ckpt/iter_0000005" 2>/dev/null | cut -f1 || echo 0)
    echo "RESULT repeat $r mode $mode iters_2_20_ms $(sum "$WORK/$mode.log") checkpoint_bytes ${size:-0} load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
