#!/usr/bin/env bash
# FP8 amax reduction across tensor- and data-parallel ranks and FP8 state in multi-process
# checkpoints (docs/fp8.md): pretrain_gpt --fp8-format hybrid on the CPU (emulated FP8 GEMMs), tiny
# GPT, 6 iterations, as one rank, as TP2 and as TP2 x DP2 under mpirun. MEGATRON_DUMP_FP8_STATE
# makes every rank write its FP8 state (amax history, scale, scale_inv of every role, as exact hex
# floats) after each step's reduction. Checks, none of which depends on the CPU's kernels:
#  1. The invariant: every step, every rank of the amax group (TP x DP x CP) holds bitwise the same
#     FP8 state. The amaxes are all-reduced with MAX, which is exact and order-independent, and the
#     scale update is the same code on the same values. Without the reduction the ranks differ at
#     step 1 already (each weight shard, each row-parallel input shard has its own amax).
#  2. Step 1, where the arithmetic is identical by construction: the weight role of every linear
#     (the initial weights equal the single-rank ones and the max over the shards' maxes is the
#     full tensor's max) and the input role of layer 0's linear_qkv (embedding lookup, + 0 from the
#     other vocab shard, and layernorm: the same per-row operations on the same values) equal the
#     single-rank run bitwise. The other roles see GEMMs split over ranks (fp32 summation order
#     depends on OpenBLAS's kernel set) and are not compared across runs.
#  3. Losses of iterations 1-2 within 2e-6 relative of the single-rank run (two units of the 7th
#     printed significant digit). Iteration 1 runs both forwards with the initial scales: the runs
#     differ by fp32 summation order (~n*eps with n = 64, a few 1e-7 relative per value) and, where
#     such a difference straddles an FP8 rounding midpoint, by one flipped element: one e4m3 step
#     (<= 2^-3 of one activation of one token) moves the mean loss over 256 tokens by ~1e-7.
#     Iteration 2's weights come from one Adam step, whose update is lr * sign(g) (m/sqrt(v) = g/|g|
#     on the first step; clipping scales all g alike), insensitive to gradient rounding, and its
#     forward uses the step-1 input/weight scales, equal (check 2) or a few ulps apart. From
#     iteration 3 Adam's update depends on gradient magnitudes and one-ulp differences grow ~10x per
#     step (7.8e-5 at iteration 5 with SkylakeX): those iterations are only required to train.
#  4. The TP2 x DP2 resume reproduces the straight run's losses and FP8 state bitwise (the same
#     arithmetic by construction; the resumed run's second printed loss is the mean of its first
#     two iterations, as Megatron prints it, compared within print rounding).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
export MEGATRON_DEVICE=cpu
fp8_tiny_gpt_args  # ARGS
mkdir -p "$LOGDIR/f1" "$LOGDIR/f2" "$LOGDIR/f4"
MEGATRON_DUMP_FP8_STATE="$LOGDIR/f1" timeout 120 "$BIN/pretrain_gpt" "${ARGS[@]}" > "$LOGDIR/single.log" 2>&1 ||
  { tail -30 "$LOGDIR/single.log"; fail "single rank"; }
timeout 120 "${MPIRUN[@]}" -np 2 -x MEGATRON_DEVICE -x MEGATRON_DUMP_FP8_STATE="$LOGDIR/f2" "$BIN/pretrain_gpt" \
  "${ARGS[@]}" --tensor-model-parallel-size 2 > "$LOGDIR/tp2.log" 2>&1 || { tail -30 "$LOGDIR/tp2.log"; fail "TP2"; }
# fp8_state STEP FILE: the state lines of STEP; equal_ranks DIR N: N ranks' dumps identical, 6 steps.
fp8_state() { grep "^step $1 " "$2"; }
equal_ranks() {
  local r n
  n=$(grep -c '^step 6 ' "$1/fp8_state_rank0.txt" 2>/dev/null || true)
  [[ "$n" == 24 ]] || fail "$1: expected 24 FP8 roles at step 6 (2 layers x 4 linears x 3), found '$n'"
  for ((r = 1; r < $2; r++)); do
    cmp -s "$1/fp8_state_rank0.txt" "$1/fp8_state_rank$r.txt" ||
      fail "FP8 state of rank $r differs from rank 0 (amaxes not reduced over the amax group):
$(diff "$1/fp8_state_rank0.txt" "$1/fp8_state_rank$r.txt" | head -6)"
  done
}
equal_ranks "$LOGDIR/f2" 2
echo "OK: TP2 ranks hold bitwise equal FP8 state at every step"
same=$(fp8_state 1 "$LOGDIR/f1/fp8_state_rank0.txt" | grep -E ' 1 amax_history |layers\.0\.self_attention\.linear_qkv 0 ')
[[ $(wc -l <<<"$same") == 9 ]] || fail "expected 8 weight roles and 1 input role at step 1, got: $same"
diff <(echo "$same") <(fp8_state 1 "$LOGDIR/f2/fp8_state_rank0.txt" | grep -E ' 1 amax_history |layers\.0\.self_attention\.linear_qkv 0 ') ||
  fail "TP2 step-1 FP8 weight / layer-0 input state differs from the single-rank run"
echo "OK: TP2 step-1 weight and layer-0 input amaxes/scales equal the single-rank run bitwise"
python3 "$SRC/tests/functional_tests/support/early_losses_match.py" "$LOGDIR/single.log" "$LOGDIR/tp2.log" 6 2 2e-6 || fail "TP2 fp8 losses differ from the single-rank run"
echo "OK: FP8 TP2 losses of iterations 1-2 equal the single-rank run within 2e-6; both train"

# TP2 x DP2 checkpoint: the FP8 state is written once per amax group (replica ids) and restored on
# every rank; a resume from iteration 4 reproduces iterations 5..6 of the straight run exactly.
P4=("${MPIRUN[@]}" -np 4 -x MEGATRON_DEVICE "$BIN/pretrain_gpt" "${ARGS[@]}" --tensor-model-parallel-size 2)
timeout 120 "${MPIRUN[@]}" -np 4 -x MEGATRON_DEVICE -x MEGATRON_DUMP_FP8_STATE="$LOGDIR/f4" "$BIN/pretrain_gpt" \
  "${ARGS[@]}" --tensor-model-parallel-size 2 > "$LOGDIR/s4.log" 2>&1 ||
  { tail -30 "$LOGDIR/s4.log"; fail "TP2xDP2 straight"; }
equal_ranks "$LOGDIR/f4" 4
echo "OK: TP2xDP2 ranks hold bitwise equal FP8 state at every step"
timeout 120 "${P4[@]}" --save "$LOGDIR/ck" --save-interval 100 --exit-interval 4 > "$LOGDIR/r1.log" 2>&1 ||
  { tail -30 "$LOGDIR/r1.log"; fail "TP2xDP2 first half"; }
mkdir -p "$LOGDIR/f4r"
timeout 120 "${MPIRUN[@]}" -np 4 -x MEGATRON_DEVICE -x MEGATRON_DUMP_FP8_STATE="$LOGDIR/f4r" "$BIN/pretrain_gpt" \
  "${ARGS[@]}" --tensor-model-parallel-size 2 --load "$LOGDIR/ck" > "$LOGDIR/r2.log" 2>&1 ||
  { tail -30 "$LOGDIR/r2.log"; fail "TP2xDP2 resume"; }
# The resumed steps 5..6 (the dump's step counter restarts at the load) hold the straight run's state.
for ((r = 0; r < 4; r++)); do
  cmp -s <(tail -n 48 "$LOGDIR/f4/fp8_state_rank$r.txt" | cut -d' ' -f3-) <(cut -d' ' -f3- "$LOGDIR/f4r/fp8_state_rank$r.txt") ||
    fail "rank $r: FP8 state of the resumed iterations 5..6 differs from the straight run"
done
# Iteration 6, the resumed run's second line, prints the mean of 5 and 6 (Megatron's first logged
# iteration does not reset the interval): within print rounding of the straight run's mean.
python3 "$SRC/tests/functional_tests/support/resumed_log.py" compare "$LOGDIR/s4.log" "$LOGDIR/r2.log" --iterations 5-6 --fields 'lm loss' --name "TP2xDP2 resume" ||
  fail "TP2xDP2 losses differ after resume from the straight run"
echo "OK: FP8 TP2xDP2 resume from iteration 4 exact (losses and FP8 state)"
