#!/usr/bin/env bash
# One command for the machine that has torch + transformers (the GPU machine; CPU math only):
# generates the Hugging Face MoE fixtures, imports each with BIN_DIR/convert_checkpoint, exports
# it back to Hugging Face, loads the export with transformers and compares its logits with the
# fixture's; then copies the fixtures into this source tree and runs the C++ comparison
# (BIN_DIR/unit_tests --gtest_filter='HFMoE*') and tests/functional_tests/ckpt_convert_hf_moe.sh
# (round trip + generation) when BIN_DIR has unit_tests / run_text_generation_server.
#   bash tests/reference/hf_moe/run_on_gpu_machine.sh BIN_DIR OUT_DIR
# MODELS="qwen2_moe_tiny" (space-separated fixture names) limits every step to those fixtures.
# OUT_DIR/summary.txt: one PASS/FAIL line per step; OUT_DIR/hf_moe/ holds the fixtures to commit
# as tests/reference/hf_moe/ (cp -r OUT_DIR/hf_moe/* tests/reference/hf_moe/). Exit 1 on any FAIL.
set -u
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there; everything is local
BIN=$(cd "$1" && pwd); OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
SUM="$OUT/summary.txt"; : > "$SUM"
FIX="$OUT/hf_moe"; WORK="$OUT/work"; mkdir -p "$FIX" "$WORK"
step() {  # step NAME LOG CMD...: runs CMD, logs to LOG, records PASS/FAIL NAME
  local name=$1 log=$2; shift 2
  if "$@" > "$log" 2>&1; then echo "PASS $name" | tee -a "$SUM"; else echo "FAIL $name (see $log)" | tee -a "$SUM"; fi
}
step generate "$OUT/generate.log" python3 "$HERE/generate_hf_moe_fixtures.py" "$FIX" ${MODELS:+--only "${MODELS// /,}"}
for m in ${MODELS:-mixtral_tiny qwen3_moe_tiny qwen2_moe_tiny}; do
  step "$m import" "$OUT/$m.import.log" "$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$FIX/$m" \
    --save-dir "$WORK/$m.ckpt"
  step "$m export" "$OUT/$m.export.log" "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$WORK/$m.ckpt" \
    --save-dir "$WORK/$m.hf"
  step "$m export byte-identical" "$OUT/$m.cmp.log" cmp "$FIX/$m/model.safetensors" "$WORK/$m.hf/model.safetensors"
  step "$m transformers loads the export" "$OUT/$m.check.log" python3 "$HERE/generate_hf_moe_fixtures.py" \
    --check-export "$WORK/$m.hf" --fixture "$FIX/$m"
  cat "$OUT/$m.check.log" >> "$SUM"
done
cp "$FIX"/*/meta.json "$OUT/" 2>/dev/null || true
# The C++ checks read the fixtures from this source tree (unit_tests has its source dir compiled in).
cp -r "$FIX"/* "$HERE/"
if [ -x "$BIN/unit_tests" ]; then
  step "unit_tests HFMoE*" "$OUT/unit_tests.log" "$BIN/unit_tests" --gtest_filter='HFMoE*' --gtest_color=no
  grep "vs transformers" "$OUT/unit_tests.log" >> "$SUM" || true
fi
if [ -x "$BIN/run_text_generation_server" ]; then
  step "functional ckpt_convert_hf_moe" "$OUT/ckpt_convert_hf_moe.log" bash "$HERE/../../functional_tests/ckpt_convert_hf_moe.sh" \
    "$BIN" "$(cd "$HERE/../../.." && pwd)"
  grep "log-prob" "$OUT/ckpt_convert_hf_moe.log" >> "$SUM" || true
fi
rm -rf "$WORK"
du -sh "$FIX" >> "$SUM"
cat "$SUM"
! grep -q '^FAIL' "$SUM"
