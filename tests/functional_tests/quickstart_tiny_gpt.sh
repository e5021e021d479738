#!/usr/bin/env bash
# The main job (examples/quickstart_tiny_gpt.sh) end to end: Megatron log lines, falling loss.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
SRC=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PRETRAIN_GPT="$BIN/pretrain_gpt" DATA_CACHE_PATH="$OUT/cache" bash "$SRC/examples/quickstart_tiny_gpt.sh" > "$OUT/log" 2>&1 || {
  cat "$OUT/log"; echo "FAIL: quickstart exited non-zero"; exit 1; }
n=$(grep -c '^ \[[0-9-]* [0-9:.]*\] iteration ' "$OUT/log" || true)
[[ "$n" -eq 9 ]] || { cat "$OUT/log"; echo "FAIL: expected 9 training lines (1, 5, ..., 40), got $n"; exit 1; }
first=$(grep ' iteration        1/      40 ' "$OUT/log" | sed 's/.*lm loss: \([0-9.E+-]*\) .*/\1/')
last=$(grep ' iteration       40/      40 ' "$OUT/log" | sed 's/.*lm loss: \([0-9.E+-]*\) .*/\1/')
python3 -c "import sys; f,l=float('$first'),float('$last'); sys.exit(0 if l < f - 1.0 else 1)" || {
  cat "$OUT/log"; echo "FAIL: loss did not fall by > 1 nat ($first -> $last)"; exit 1; }
grep -q '^ validation loss at iteration 40 on test set | lm loss value: ' "$OUT/log" || { echo "FAIL: no test line"; exit 1; }
echo "OK: lm loss $first -> $last"
