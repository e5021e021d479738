#!/usr/bin/env bash
# Tensor parallelism equals the single-rank model (tiny GPT and tiny LLaMA with GQA/SwiGLU):
# TP2 and TP4 under mpirun, TP2 under megatron_launch, and TP2 x DP2 with --overlap-grad-reduce
# (tests/unit_tests/tensor_parallel/tensor_parallel_test.cpp).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
run() {  # ranks expected_passing log launcher...
  local n=$1 want=$2 log=$3; shift 3
  timeout 600 "$@" "$BIN/unit_tests" --gtest_filter='DistTP*' --gtest_color=no >"$log" 2>&1 \
    || { tail -50 "$log" >&2; fail "$* exited with $?"; }
  expect_passed "$log" $want $n
}
run 2 2 "$LOGDIR/tp2.log" "${MPIRUN[@]}" -np 2
echo "TP2 (mpirun): losses, gathered gradients and parameters equal the single-rank run"
run 4 3 "$LOGDIR/tp4.log" "${MPIRUN[@]}" -np 4
echo "TP4 and TP2xDP2 with overlapped grad reduction (mpirun): equal to the single-rank run"
run 2 2 "$LOGDIR/launch.log" "$BIN/megatron_launch" --nproc-per-node 2 --master-port $(free_port)
echo "TP2 (megatron_launch, tcp backend): equal to the single-rank run"
