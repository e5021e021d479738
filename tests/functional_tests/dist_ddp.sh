#!/usr/bin/env bash
# Data parallelism (DistributedDataParallel, distributed-optimizer sharding, overlap with small and
# uneven buckets) equals the single-rank run: tests/unit_tests/distributed/ddp_test.cpp under
# mpirun -np 2, 3 and 4 and under megatron_launch with 2 ranks.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
for n in 2 3 4; do
  log=$LOGDIR/np$n.log
  timeout 600 "${MPIRUN[@]}" -np $n "$BIN/unit_tests" --gtest_filter='DistDDP*' --gtest_color=no >"$log" 2>&1 \
    || { tail -50 "$log" >&2; fail "mpirun -np $n exited with $?"; }
  expect_passed "$log" 6 $n
  echo "DP$n (mpirun): losses, gradients and parameters equal the single-rank run"
done
log=$LOGDIR/launch.log
timeout 600 "$BIN/megatron_launch" --nproc-per-node 2 --master-port $(free_port) \
  "$BIN/unit_tests" --gtest_filter='DistDDP*' --gtest_color=no >"$log" 2>&1 || { tail -50 "$log" >&2; fail "launch"; }
expect_passed "$log" 6 2
echo "DP2 (megatron_launch, tcp backend): equal to the single-rank run"
