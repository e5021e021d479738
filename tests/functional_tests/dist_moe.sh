#!/usr/bin/env bash
# Expert parallelism of the MoE layer on the MPI backend: EP2 and EP4 (allgather, alltoall, alltoall
# with capacity dropping) and EP2 x expert-TP2 under mpirun -np 2 / 4. Every gradient (router,
# experts, input) is checked inside tests/unit_tests/transformer/moe/moe_layer_test.cpp (DistMoE*)
# against the single-rank layer run on each rank's tokens.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
for n in 2 4; do
  log=$LOGDIR/np$n.log
  timeout 300 "${MPIRUN[@]}" -np $n "$BIN/unit_tests" --gtest_filter='DistMoE*' --gtest_color=no >"$log" 2>&1 \
    || { tail -50 "$log" >&2; fail "mpirun -np $n exited with $?"; }
  grep -q "SKIPPED" "$log" && [ $n = 4 ] && { tail -30 "$log" >&2; fail "np 4: a DistMoE test was skipped"; }
  if [ $n = 2 ]; then expect_passed "$log" 3 $n; else expect_passed "$log" 4 $n; fi
  echo "mpirun -np $n: MoE expert-parallel gradients equal the single-rank layer on every rank"
done
