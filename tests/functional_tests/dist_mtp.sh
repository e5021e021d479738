#!/usr/bin/env bash
# Multi-token prediction across ranks equals one rank: TP2, TP2 with sequence parallelism, DP2 and
# CP2 under mpirun -np 2 (tests/unit_tests/distributed/mtp_dist_test.cpp).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
log="$LOGDIR/mtp2.log"
timeout 600 "${MPIRUN[@]}" -np 2 "$BIN/unit_tests" --gtest_filter='DistMTP*' --gtest_color=no >"$log" 2>&1 \
  || { tail -50 "$log" >&2; fail "mpirun -np 2 exited with $?"; }
expect_passed "$log" 4 2
echo "MTP with TP2, TP2+SP, DP2 and CP2 (mpirun): losses and gradients equal the single-rank run"
