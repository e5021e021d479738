#!/usr/bin/env bash
# megatron_launch (our torchrun): the collective tests on the TCP backend with 2, 3 and 4 local
# ranks and as two "nodes" on localhost; a killed or hung rank ends the job naming the rank;
# bad options and a missing program are reported.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
L=$BIN/megatron_launch
for n in 2 3 4; do
  log=$LOGDIR/l$n.log
  MEGATRON_TEST_EXPECT_BACKEND=tcp timeout 300 "$L" --nproc-per-node $n --master-port $(free_port) \
    "$BIN/unit_tests" --gtest_filter='DistCollectives*' --gtest_color=no >"$log" 2>&1 \
    || { tail -50 "$log" >&2; fail "launch $n ranks exited with $?"; }
  expect_passed "$log" 11 $n
  echo "megatron_launch --nproc-per-node $n: all collectives pass"
done

# Two nodes of two ranks each (torchrun's --nnodes/--node-rank) on this host.
port=$(free_port)
for node in 1 0; do
  MEGATRON_TEST_EXPECT_BACKEND=tcp timeout 300 "$L" --nnodes 2 --node-rank $node --nproc_per_node=2 \
    --master-addr 127.0.0.1 --master-port $port \
    "$BIN/unit_tests" --gtest_filter='DistCollectives*' --gtest_color=no >"$LOGDIR/node$node.log" 2>&1 &
  eval pid$node=$!
done
wait $pid0 || fail "node 0 failed"
wait $pid1 || fail "node 1 failed"
expect_passed "$LOGDIR/node0.log" 11 2
expect_passed "$LOGDIR/node1.log" 11 2
echo "two nodes x two ranks: all collectives pass"

for mode in kill hang; do
  log=$LOGDIR/f$mode.log
  start=$(date +%s)
  MEGATRON_TEST_DIST_FAILURE=$mode MEGATRON_TEST_DIST_TIMEOUT_S=3 timeout 120 "$L" --nproc-per-node 3 \
    --master-port $(free_port) "$BIN/unit_tests" --gtest_filter='DistFailure*' --gtest_color=no >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  [ $rc -eq 1 ] || { cat "$log" >&2; fail "$mode: launcher exited with $rc, want 1"; }
  [ $secs -le 60 ] || fail "$mode: took ${secs}s"
  if [ $mode = kill ]; then
    grep -q "megatron_launch: rank 1 (local rank 1) was killed by signal 9 (SIGKILL) (pid [0-9]*)" "$log" \
      || { cat "$log" >&2; fail "kill: no message naming rank 1"; }
  else
    grep -q "watchdog: all_reduce" "$log" || { cat "$log" >&2; fail "hang: no watchdog message"; }
    grep -q "megatron_launch: rank [02] (local rank [02]) exited with code 1 (pid [0-9]*)" "$log" \
      || { cat "$log" >&2; fail "hang: launcher did not name the failing rank"; }
  fi
  echo "$mode: job ended with status $rc after ${secs}s"
done

out=$("$L" --bogus 2 true 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown option --bogus" <<<"$out" || fail "bad option: rc=$rc out=$out"
out=$("$L" --nproc-per-node 2 /nonexistent/program 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "cannot run /nonexistent/program" <<<"$out" && grep -q "exited with code 127" <<<"$out" \
  || fail "missing program: rc=$rc out=$out"
echo "launcher option errors reported"
