#!/usr/bin/env bash
# Per-rank activation memory under TP2 + sequence parallelism is about half of TP1's and does not
# grow with the number of micro-batches (tests/unit_tests/tensor_parallel/tp_memory_test.cpp, mpirun -np 2).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
log="$LOGDIR/tp_memory.log"
timeout 600 "${MPIRUN[@]}" -np 2 "$BIN/unit_tests" --gtest_filter='DistMemory*' --gtest_color=no >"$log" 2>&1 \
  || { tail -50 "$log" >&2; fail "mpirun -np 2 DistMemory exited with $?"; }
expect_passed "$log" 1 2
grep "activation peak" "$log" | head -1
echo "TP2+SP activation peak per rank about half of TP1's, no growth over micro-batches"
