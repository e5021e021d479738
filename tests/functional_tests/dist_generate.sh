#!/usr/bin/env bash
# Text generation with tensor parallelism: TP2 (mpirun -np 2) gives the tokens and log-probs of the
# single-rank model, greedy and seeded sampling (tests/unit_tests/inference/generate_tp_test.cpp).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
log="$LOGDIR/tp2.log"
timeout 600 "${MPIRUN[@]}" -np 2 "$BIN/unit_tests" --gtest_filter='DistGenerate*' --gtest_color=no >"$log" 2>&1 \
  || { tail -50 "$log" >&2; fail "mpirun -np 2 unit_tests --gtest_filter=DistGenerate* exited with $?"; }
expect_passed "$log" 1 2
echo "dist_generate: TP2 generation equals TP1 (greedy, temperature sampling, top-k sampling)"
