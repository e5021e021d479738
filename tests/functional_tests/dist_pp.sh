#!/usr/bin/env bash
# The 1F1B and interleaved (virtual pipeline) schedules and their p2p communication with 2, 3 and 4 stages under mpirun and
# 2 stages under megatron_launch (tests/unit_tests/pipeline_parallel/pipeline_schedule_test.cpp).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
for n in 2 3 4; do
  log=$LOGDIR/pp$n.log
  timeout 300 "${MPIRUN[@]}" -np $n "$BIN/unit_tests" --gtest_filter='DistPipeline*' --gtest_color=no >"$log" 2>&1 \
    || { tail -50 "$log" >&2; fail "mpirun -np $n exited with $?"; }
  expect_passed "$log" 2 $n
  echo "PP$n 1F1B and interleaved VP2/VP3 (mpirun): losses and weight gradients equal the sequential run"
done
log=$LOGDIR/launch.log
timeout 300 "$BIN/megatron_launch" --nproc-per-node 2 --master-port $(free_port) \
  "$BIN/unit_tests" --gtest_filter='DistPipeline*' --gtest_color=no >"$log" 2>&1 || { tail -50 "$log" >&2; fail "launch"; }
expect_passed "$log" 2 2
echo "PP2 1F1B (megatron_launch): equal to the sequential run"
