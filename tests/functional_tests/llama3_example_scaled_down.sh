#!/usr/bin/env bash
# examples/llama/train_llama3_8b_h100_fp8.sh with its full Megatron flag list, scaled down to
# tiny dimensions (SCALE_DOWN=1; --vocab-size 512 appended, argparse's last value wins) on CPU.
# First its DTYPE default, as Megatron's (fp8): with a stand-in nvidia-smi first on PATH it stops
# with one line saying to set DTYPE=bf16 when there is no GPU or one without FP8 (compute
# capability 8.0), and on an FP8 GPU (9.0) it passes Megatron's FP8 flags (a stand-in
# pretrain_gpt records them). Then the real run, DTYPE=bf16, on the CPU.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
SRC=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cd "$OUT"
EX="$SRC/examples/llama/train_llama3_8b_h100_fp8.sh"
mkdir -p stub
cat > stub/nvidia-smi <<'SH'
#!/usr/bin/env bash
[[ -n "${FAKE_CAP:-}" ]] || { echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9; }
case "$*" in
  -L) echo "GPU 0: Stand-in (UUID: GPU-0)" ;;
  *compute_cap*) echo "$FAKE_CAP" ;;
  *) exit 2 ;;
esac
SH
printf '#!/usr/bin/env bash\nprintf "%%s\\n" "$@" > "%s/args.txt"\n' "$OUT" > stub/pretrain_gpt
chmod +x stub/nvidia-smi stub/pretrain_gpt
for cap in "" 8.0; do
  if FAKE_CAP=$cap PATH="$OUT/stub:$PATH" SCALE_DOWN=1 NPROC_PER_NODE=1 PRETRAIN_GPT="$OUT/stub/pretrain_gpt" \
       bash "$EX" "$OUT/c0/llama" "$OUT/t0/llama" > dflt.log 2>&1; then
    cat dflt.log; echo "FAIL: default DTYPE (fp8) ran without an FP8 GPU (compute capability '${cap:-none}')"; exit 1
  fi
  [[ ! -e args.txt ]] || { echo "FAIL: pretrain_gpt was started without an FP8 GPU"; exit 1; }
  [[ $(wc -l < dflt.log) == 1 ]] && grep -q '^error: DTYPE=fp8 (the default) needs .*; set DTYPE=bf16 to train in bf16$' dflt.log || {
    cat dflt.log; echo "FAIL: no one-line error saying to set DTYPE=bf16 (compute capability '${cap:-none}')"; exit 1; }
  [[ -z "$cap" ]] || grep -q "compute capability $cap" dflt.log || { cat dflt.log; echo "FAIL: the GPU's compute capability is not named"; exit 1; }
done
FAKE_CAP=9.0 PATH="$OUT/stub:$PATH" SCALE_DOWN=1 NPROC_PER_NODE=1 PRETRAIN_GPT="$OUT/stub/pretrain_gpt" \
  bash "$EX" "$OUT/c0/llama" "$OUT/t0/llama" > fp8.log 2>&1 || { cat fp8.log; echo "FAIL: DTYPE=fp8 on a 9.0 GPU"; exit 1; }
tr '\n' ' ' < args.txt | grep -q -- '--bf16 .*--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather ' ||
  { cat args.txt; echo "FAIL: the default DTYPE did not pass Megatron's FP8 flags"; exit 1; }
rm -f args.txt
if DTYPE=fp16 PATH="$OUT/stub:$PATH" bash "$EX" "$OUT/c0/llama" "$OUT/t0/llama" > bad.log 2>&1 ||
   ! grep -q '^error: DTYPE=fp16: expected fp8 (the default) or bf16$' bad.log; then
  cat bad.log; echo "FAIL: DTYPE=fp16 not refused"; exit 1
fi
DTYPE=bf16 PATH="$OUT/stub:$PATH" SCALE_DOWN=1 NPROC_PER_NODE=1 PRETRAIN_GPT="$BIN/pretrain_gpt" EXTRA_ARGS="--vocab-size 512" \
  bash "$EX" "$OUT/ckpt/llama" "$OUT/tb/llama" > log 2>&1 || {
  cat log; echo "FAIL: the example exited non-zero"; exit 1; }
grep -q "fp8 \.* None$" log || { grep -i fp8 log; echo "FAIL: DTYPE=bf16 run has FP8 enabled"; exit 1; }
n=$(grep -c '^ \[[0-9-]* [0-9:.]*\] iteration ' log || true)
[[ "$n" -eq 8 ]] || { cat log; echo "FAIL: expected 8 training lines (--log-interval 1, 32 samples / 4), got $n"; exit 1; }
grep -q 'throughput per GPU (TFLOP/s/GPU): ' log || { echo "FAIL: --log-throughput field missing"; exit 1; }
grep -q '^ validation loss at iteration 4 | ' log || { cat log; echo "FAIL: no validation at --eval-interval"; exit 1; }
grep -q '^note: --use-mcore-models is accepted: ' log || { echo "FAIL: no note for --use-mcore-models"; exit 1; }
grep -q '^note: --manual-gc is accepted: ' log || { echo "FAIL: no note for --manual-gc"; exit 1; }
[[ -s "$OUT/tb/llama/trace_rank0.json" ]] || { cat log; echo "FAIL: --profile trace missing"; exit 1; }
python3 -c "import json,sys; d=json.load(open('$OUT/tb/llama/trace_rank0.json')); sys.exit(0 if any(e.get('name')=='forward-backward' for e in d['traceEvents']) else 1)" \
  || { echo "FAIL: trace has no forward-backward events"; exit 1; }
ev=$(ls "$OUT"/tb/llama/events.out.tfevents.* 2>/dev/null | head -1)
[[ -n "$ev" ]] || { echo "FAIL: no TensorBoard event file in $OUT/tb/llama"; exit 1; }
if command -v protoc >/dev/null && /usr/bin/python3 -c 'import google.protobuf' 2>/dev/null; then
  /usr/bin/python3 "$SRC/tests/reference/tensorboard/read_events.py" "$ev" > tb.txt || { cat tb.txt; echo "FAIL: event file unreadable"; exit 1; }
  for tag in "lm loss" learning-rate grad-norm batch-size loss-scale "lm loss validation"; do
    grep -q "$tag=" tb.txt || { cat tb.txt; echo "FAIL: no '$tag' scalar in the event file"; exit 1; }
  done
fi
echo "OK"
