#!/usr/bin/env bash
# --fp8-output-proj with tensor parallelism (docs/fp8.md "FP8 output layer"): pretrain_gpt on the CPU
# (emulated FP8 GEMMs), tiny GPT (tied embedding and output weights), 6 iterations, as one rank and
# as TP2 under mpirun, both with the flag. The output layer is column-parallel: each rank quantizes
# its vocab shard of the weight and of dlogits. Checks (the arguments of dist_fp8_amax.sh, which
# checks the same without the flag):
#  1. Every step both TP ranks hold bitwise the same FP8 state, the output layer's three roles
#     included (27 roles: 2 layers x 4 linears + the output layer, x 3): its weight and dlogits amaxes
#     are MAX-reduced over TP like every role's (without the reduction each shard has its own).
#  2. Step 1: the output layer's weight role (the max over the shards' maxes is the full table's max;
#     the initial weights are the single rank's) equals the single-rank run bitwise.
#  3. Losses of iterations 1-2 within 2e-6 relative of the single-rank run: iteration 1 quantizes
#     with the initial scales (1) on both layouts, the split GEMMs differ by fp32 summation order only
#     (a few 1e-7 relative; a value straddling an FP8 rounding midpoint flips one element by one
#     step, moving the mean loss by ~1e-7); iteration 2's weights come from Adam's first step
#     (lr * sign(g)) and its scales from check 2's equal or ulp-close amaxes.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
export MEGATRON_DEVICE=cpu
fp8_tiny_gpt_args  # ARGS (dist_common.inc)
ARGS+=(--fp8-output-proj)
mkdir -p "$LOGDIR/f1" "$LOGDIR/f2"
MEGATRON_DUMP_FP8_STATE="$LOGDIR/f1" timeout 120 "$BIN/pretrain_gpt" "${ARGS[@]}" > "$LOGDIR/single.log" 2>&1 ||
  { tail -30 "$LOGDIR/single.log"; fail "single rank"; }
timeout 120 "${MPIRUN[@]}" -np 2 -x MEGATRON_DEVICE -x MEGATRON_DUMP_FP8_STATE="$LOGDIR/f2" "$BIN/pretrain_gpt" \
  "${ARGS[@]}" --tensor-model-parallel-size 2 > "$LOGDIR/tp2.log" 2>&1 || { tail -30 "$LOGDIR/tp2.log"; fail "TP2"; }
n=$(grep -c '^step 6 ' "$LOGDIR/f2/fp8_state_rank0.txt" 2>/dev/null || true)
[[ "$n" == 27 ]] || fail "expected 27 FP8 roles at step 6 (2 layers x 4 linears + output layer, x 3), found '$n'"
grep -q '^step 6 output_layer ' "$LOGDIR/f2/fp8_state_rank0.txt" || fail "no output_layer roles in the FP8 state dump"
cmp -s "$LOGDIR/f2/fp8_state_rank0.txt" "$LOGDIR/f2/fp8_state_rank1.txt" ||
  fail "FP8 state of TP rank 1 differs from rank 0: $(diff "$LOGDIR/f2/fp8_state_rank0.txt" "$LOGDIR/f2/fp8_state_rank1.txt" | head -4)"
echo "OK: TP2 ranks hold bitwise equal FP8 state (output layer included) at every step"
a=$(grep -E '^step 1 output_layer 1 ' "$LOGDIR/f1/fp8_state_rank0.txt"); b=$(grep -E '^step 1 output_layer 1 ' "$LOGDIR/f2/fp8_state_rank0.txt")
[[ -n "$a" && "$a" == "$b" ]] || fail "step-1 output-layer weight state: single '$a' vs TP2 '$b'"
echo "OK: TP2 step-1 output-layer weight amax/scale equals the single-rank run bitwise"
python3 "$SRC/tests/functional_tests/support/early_losses_match.py" "$LOGDIR/single.log" "$LOGDIR/tp2.log" 6 2 2e-6 || fail "TP2 losses differ from the single-rank run"
echo "OK: --fp8-output-proj TP2 losses of iterations 1-2 equal the single-rank run within 2e-6; both train"
