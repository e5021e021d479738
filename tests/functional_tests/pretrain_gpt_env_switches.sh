#!/usr/bin/env bash
# The A/B and tuning switches that only some runs read (docs/environment.md: MEGATRON_OPTIM_OVERLAP,
# MEGATRON_OPTIM_OVERLAP_PRIORITY, MEGATRON_MOE_DEVICE_ROUTER, MEGATRON_MOE_FP8_FUSE, MEGATRON_FP8_BLOCK_FUSED,
# MEGATRON_FP8_BLOCK_WGRAD_ALGO, MEGATRON_MOE_GROUPED_GEMM, MEGATRON_MOE_GEMM_STREAMS,
# MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN, MEGATRON_GEMM_AUTOTUNE, MEGATRON_FP8_BLOCK_GEMM): a bad value
# stops every pretrain_gpt run with one line naming the variable -- also a CPU run of a dense bf16 model, which reaches none of the code that uses
# them (before, such runs trained and ignored the value); so does any value of the removed
# MEGATRON_FP8_BLOCK_QUANT, with a line saying it was removed;
# MEGATRON_OPTIM_OVERLAP=1 on the CPU says the overlap does not apply and changes no loss.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export MEGATRON_DEVICE=cpu
ARGS=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
      --micro-batch-size 1 --global-batch-size 2 --train-iters 2 --lr 1e-3 --lr-warmup-iters 0
      --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --log-interval 1
      --mock-data --tokenizer-type NullTokenizer --vocab-size 64 --data-cache-path "$OUT/cache")
fail() { echo "FAIL: $*"; exit 1; }
for bad in MEGATRON_OPTIM_OVERLAP=2 MEGATRON_OPTIM_OVERLAP_PRIORITY=yes MEGATRON_MOE_DEVICE_ROUTER=on MEGATRON_MOE_FP8_FUSE=2 \
           MEGATRON_FP8_BLOCK_FUSED=true MEGATRON_FP8_BLOCK_QUANT=fast MEGATRON_FP8_BLOCK_QUANT=tiled \
           MEGATRON_FP8_BLOCK_QUANT=legacy MEGATRON_FP8_BLOCK_WGRAD_ALGO=16 MEGATRON_FP8_BLOCK_WGRAD_ALGO=3x \
           MEGATRON_FP8_BLOCK_WGRAD_ALGO=-1 MEGATRON_MOE_GROUPED_GEMM=yes MEGATRON_MOE_GEMM_STREAMS=0 \
           MEGATRON_MOE_GEMM_STREAMS=9 MEGATRON_MOE_GEMM_STREAMS=two MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=65 \
           MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=-1 MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=16sm MEGATRON_GEMM_AUTOTUNE=yes \
           MEGATRON_FP8_BLOCK_GEMM=wgmma MEGATRON_FP8_BLOCK_GEMM=Ours; do
  name=${bad%%=*}
  if env "$bad" "$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/err.log" 2>&1; then fail "$bad: the run trained"; fi
  grep -q "^error: $name=" "$OUT/err.log" || fail "$bad: no one-line error naming $name: $(tail -2 "$OUT/err.log")"
  [[ $(grep -c '^error:' "$OUT/err.log") == 1 ]] || fail "$bad: more than one error line"
  grep -q "iteration *1/" "$OUT/err.log" && fail "$bad: an iteration ran before the refusal"
  if [[ $name == MEGATRON_FP8_BLOCK_QUANT ]]; then
    grep -q "^error: $bad: this switch was removed; the tiled blockwise quantize kernel is the only one" "$OUT/err.log" ||
      fail "$bad: the error does not say the switch was removed: $(grep '^error:' "$OUT/err.log")"
  fi
done
echo "OK: bad values of the eleven switches, and any value of the removed MEGATRON_FP8_BLOCK_QUANT, are refused by name before training"
for good in MEGATRON_FP8_BLOCK_QUANT= MEGATRON_FP8_BLOCK_WGRAD_ALGO=15 MEGATRON_OPTIM_OVERLAP_PRIORITY=0 \
            MEGATRON_FP8_BLOCK_FUSED=1 MEGATRON_FP8_BLOCK_FUSED=0 MEGATRON_MOE_FP8_FUSE=0 MEGATRON_MOE_GROUPED_GEMM=auto \
            MEGATRON_MOE_GEMM_STREAMS=1 MEGATRON_MOE_GEMM_STREAMS=8 MEGATRON_MOE_GEMM_STREAMS= \
            MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=0 MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=64 MEGATRON_GEMM_AUTOTUNE=1 \
            MEGATRON_FP8_BLOCK_GEMM=cublaslt MEGATRON_FP8_BLOCK_GEMM=ours; do
  env "$good" "$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/ok.log" 2>&1 || fail "$good refused: $(tail -2 "$OUT/ok.log")"
done
echo "OK: the documented values are accepted (an empty MEGATRON_FP8_BLOCK_QUANT counts as unset)"
"$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/serial.log" 2>&1 || fail "serial run"
MEGATRON_OPTIM_OVERLAP=1 "$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/overlap.log" 2>&1 || fail "MEGATRON_OPTIM_OVERLAP=1 run"
grep -q "optimizer step not overlapped with the next forward (not on a CUDA device)" "$OUT/overlap.log" ||
  fail "MEGATRON_OPTIM_OVERLAP=1 on the CPU does not say that it does not apply"
a=$(grep -o "lm loss: [0-9.E+-]*" "$OUT/serial.log"); b=$(grep -o "lm loss: [0-9.E+-]*" "$OUT/overlap.log")
[[ -n "$a" && "$a" == "$b" ]] || fail "losses differ with MEGATRON_OPTIM_OVERLAP=1 on the CPU: '$a' vs '$b'"
echo "OK: MEGATRON_OPTIM_OVERLAP=1 on the CPU reports that it does not apply; losses unchanged"
# The overlap's diagnostic switch: refused by name like the others, accepted with 0/1.
if env MEGATRON_OPTIM_OVERLAP_FULL_WAIT=2 "$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/err.log" 2>&1; then
  fail "MEGATRON_OPTIM_OVERLAP_FULL_WAIT=2: the run trained"
fi
grep -q "^error: MEGATRON_OPTIM_OVERLAP_FULL_WAIT=2: expected 0 (off) or 1 (on)" "$OUT/err.log" ||
  fail "MEGATRON_OPTIM_OVERLAP_FULL_WAIT=2: no one-line error naming it: $(tail -2 "$OUT/err.log")"
grep -q "iteration *1/" "$OUT/err.log" && fail "MEGATRON_OPTIM_OVERLAP_FULL_WAIT=2: an iteration ran before the refusal"
MEGATRON_OPTIM_OVERLAP_FULL_WAIT=1 "$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/ok.log" 2>&1 ||
  fail "MEGATRON_OPTIM_OVERLAP_FULL_WAIT=1 refused: $(tail -2 "$OUT/ok.log")"
echo "OK: MEGATRON_OPTIM_OVERLAP_FULL_WAIT=2 refused by name, 1 accepted"
# The GEMM switches say on the CPU that they do not apply (not read and ignored).
MEGATRON_GEMM_AUTOTUNE=1 MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=16 "$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/gemm.log" 2>&1 ||
  fail "MEGATRON_GEMM_AUTOTUNE=1 MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=16 run: $(tail -2 "$OUT/gemm.log")"
grep -q "MEGATRON_GEMM_AUTOTUNE=1 has no effect: it tunes cuBLASLt GEMMs, and this run is not on a CUDA device" "$OUT/gemm.log" ||
  fail "MEGATRON_GEMM_AUTOTUNE=1 on the CPU does not say that it does not apply"
grep -q "MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=16 has no effect: the optimizer step is not overlapped (MEGATRON_OPTIM_OVERLAP=0)" "$OUT/gemm.log" ||
  fail "MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN without the overlap does not say that it does not apply"
MEGATRON_FP8_BLOCK_GEMM=ours "$BIN/pretrain_gpt" "${ARGS[@]}" > "$OUT/bgemm.log" 2>&1 || fail "MEGATRON_FP8_BLOCK_GEMM=ours run"
grep -q "MEGATRON_FP8_BLOCK_GEMM=ours has no effect: it selects the GEMM of --fp8-recipe blockwise on a CUDA device" "$OUT/bgemm.log" ||
  fail "MEGATRON_FP8_BLOCK_GEMM=ours on a CPU bf16 run does not say that it does not apply"
d=$(grep -o "lm loss: [0-9.E+-]*" "$OUT/bgemm.log")
[[ -n "$d" && "$d" == "$a" ]] || fail "losses differ with MEGATRON_FP8_BLOCK_GEMM=ours on the CPU: '$d' vs '$a'"
c=$(grep -o "lm loss: [0-9.E+-]*" "$OUT/gemm.log")
[[ -n "$c" && "$c" == "$a" ]] || fail "losses differ with the GEMM switches on the CPU: '$c' vs '$a'"
echo "OK: MEGATRON_GEMM_AUTOTUNE, MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN and MEGATRON_FP8_BLOCK_GEMM report that they do not apply on the CPU; losses unchanged"
