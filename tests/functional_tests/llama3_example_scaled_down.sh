#!/usr/bin/env bash
# examples/llama/train_llama3_8b_h100_fp8.sh with its full Megatron flag list, scaled down to
# tiny dimensions (SCALE_DOWN=1; --vocab-size 512 appended, argparse's last value wins) on CPU.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
SRC=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cd "$OUT"
SCALE_DOWN=1 NPROC_PER_NODE=1 PRETRAIN_GPT="$BIN/pretrain_gpt" EXTRA_ARGS="--vocab-size 512" \
  bash "$SRC/examples/llama/train_llama3_8b_h100_fp8.sh" "$OUT/ckpt/llama" "$OUT/tb/llama" > log 2>&1 || {
  cat log; echo "FAIL: the example exited non-zero"; exit 1; }
n=$(grep -c '^ \[[0-9-]* [0-9:.]*\] iteration ' log || true)
[[ "$n" -eq 8 ]] || { cat log; echo "FAIL: expected 8 training lines (--log-interval 1, 32 samples / 4), got $n"; exit 1; }
grep -q 'throughput per GPU (TFLOP/s/GPU): ' log || { echo "FAIL: --log-throughput field missing"; exit 1; }
grep -q '^ validation loss at iteration 4 | ' log || { cat log; echo "FAIL: no validation at --eval-interval"; exit 1; }
grep -q '^note: --use-mcore-models is accepted: ' log || { echo "FAIL: no note for --use-mcore-models"; exit 1; }
grep -q '^note: --manual-gc is accepted: ' log || { echo "FAIL: no note for --manual-gc"; exit 1; }
[[ -s "$OUT/tb/llama/trace_rank0.json" ]] || { cat log; echo "FAIL: --profile trace missing"; exit 1; }
python3 -c "import json,sys; d=json.load(open('$OUT/tb/llama/trace_rank0.json')); sys.exit(0 if any(e.get('name')=='forward-backward' for e in d['traceEvents']) else 1)" \
  || { echo "FAIL: trace has no forward-backward events"; exit 1; }
echo "OK"
