#!/usr/bin/env bash
# Every ProcessGroup collective (and the TP/SP mappings) on the MPI backend under mpirun with 2, 3, 4 and 8 ranks; values
# are checked inside tests/unit_tests/comm/collectives_test.cpp against closed forms.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
for n in 2 3 4 8; do
  log=$LOGDIR/np$n.log
  MEGATRON_TEST_EXPECT_BACKEND=mpi timeout 300 "${MPIRUN[@]}" -np $n -x MEGATRON_TEST_EXPECT_BACKEND \
    "$BIN/unit_tests" --gtest_filter='DistCollectives*:DistMappings*' --gtest_color=no >"$log" 2>&1 \
    || { tail -50 "$log" >&2; fail "mpirun -np $n exited with $?"; }
  expect_passed "$log" 12 $n
  echo "mpirun -np $n: all collectives pass on every rank"
done
