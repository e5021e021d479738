#!/usr/bin/env bash
# The README's main job on real data (examples/quickstart_real_data.sh), shortened to 20
# iterations: preprocess_data must succeed, the lm loss must fall by more than 2 nats from its
# first value (ln 50257 = 10.8 at init; a tiny model on real text gets below 8 in 20 steps), and a
# validation line must be printed.
set -euo pipefail
BIN=$1
SRC=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
MEGATRON_BIN=$BIN QUICKSTART_DIR=$OUT/work bash "$SRC/examples/quickstart_real_data.sh" \
  --train-iters 20 --eval-interval 10 --lr-warmup-iters 2 > "$OUT/log" 2>&1 || { cat "$OUT/log"; exit 1; }
first=$(grep -m1 -oE 'lm loss: [0-9.E+-]+' "$OUT/log" | awk '{print $3}')
last=$(grep -oE 'iteration +20/ +20 .*lm loss: [0-9.E+-]+' "$OUT/log" | grep -oE 'lm loss: [0-9.E+-]+' | awk '{print $3}')
[[ -n "$first" && -n "$last" ]] || { cat "$OUT/log"; echo "FAIL: no loss lines"; exit 1; }
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 2.0) }' || { cat "$OUT/log"; echo "FAIL: loss $first -> $last did not fall by 2"; exit 1; }
grep -q "validation loss at iteration 20 on validation set | lm loss value:" "$OUT/log" || { cat "$OUT/log"; echo "FAIL: no validation line"; exit 1; }
echo "PASS: real-data quickstart loss $first -> $last"
