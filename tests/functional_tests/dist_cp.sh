#!/usr/bin/env bash
# Context parallelism equals the single-rank model (tiny GPT and tiny LLaMA with GQA + RoPE):
# CP2 under mpirun, CP2 x TP2 and CP4 on 4 ranks: losses, (TP-gathered) gradients and parameters
# after SGD steps (tests/unit_tests/transformer/context_parallel_dist_test.cpp).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
run() {  # ranks expected_passing log launcher...
  local n=$1 want=$2 log=$3; shift 3
  timeout 600 "$@" "$BIN/unit_tests" --gtest_filter='DistCP*' --gtest_color=no >"$log" 2>&1 \
    || { tail -50 "$log" >&2; fail "$* exited with $?"; }
  expect_passed "$log" $want $n
}
run 2 1 "$LOGDIR/cp2.log" "${MPIRUN[@]}" -np 2
echo "CP2 (mpirun): losses, gradients and parameters equal the single-rank run"
run 4 2 "$LOGDIR/cp2tp2.log" "${MPIRUN[@]}" -np 4
echo "CP2xTP2 and CP4 (mpirun): equal to the single-rank run"
