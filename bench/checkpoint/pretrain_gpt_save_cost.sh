#!/usr/bin/env bash
# The training step's cost of checkpointing in pretrain_gpt: no save vs --save (synchronous) vs
# --save --async-save, same model and data, saves at iterations 5, 10, 15 of 20 (and the final one
# at 20, outside the measured window). Figures: the sum of Megatron's "elapsed time per iteration"
# over iterations 2..20 (the save after iteration i is inside iteration i+1's interval); the time
# training was blocked by each of the saves at 5, 10, 15 (the "save-checkpoint" timer line);
# and the mean time from the "saving checkpoint" line to the "successfully saved" line (async:
# until the checkpoint is published). Not a test; results go to docs/performance.md.
# Usage: bench/checkpoint/pretrain_gpt_save_cost.sh BIN_DIR [WORK_DIR] [REPEATS]
set -euo pipefail
BIN=$1 WORK=${2:-/tmp/pretrain_gpt_save_cost} REP=${3:-2}
mkdir -p "$WORK"
ARGS=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 64 --max-position-embeddings 64
  --micro-batch-size 2 --global-batch-size 2 --train-iters 20 --lr 1e-4 --seed 1234
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
    blocked=$({ grep -oE 'save-checkpoint \.+: \([0-9.]+' "$WORK/$mode.log" || true; } | head -3 | sed 's/.*(//' |
              awk '{ printf "%s%.0f", (n++ ? "/" : ""), $1 } END { if (!n) print "-" }')
    publish=$(python3 - "$WORK/$mode.log" <<'PY'
import re, sys, datetime
t = {}
for line in open(sys.argv[1]):
    m = re.search(r'\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] (saving|successfully saved) checkpoint (?:at|from) iteration +(\d+)', line)
    if m:
        t.setdefault(int(m.group(3)), {})[m.group(2)] = datetime.datetime.strptime(m.group(1), '%Y-%m-%d %H:%M:%S.%f')
d = [(v['successfully saved'] - v['saving']).total_seconds() * 1e3 for k, v in t.items() if k < 20 and len(v) == 2]
print('%.0f' % (sum(d) / len(d)) if d else '-')
PY
)
    echo "RESULT repeat $r mode $mode iters_2_20_ms $(sum "$WORK/$mode.log") blocked_ms_saves_5/10/15 $blocked" \
         "save_to_published_ms $publish checkpoint_bytes ${size:-0} load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
