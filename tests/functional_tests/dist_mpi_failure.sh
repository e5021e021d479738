#!/usr/bin/env bash
# Under mpirun, a rank killed by SIGKILL, or a rank that never joins a collective, ends the whole
# job with a non-zero status and a message, within the (3 s) distributed timeout plus slack.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
for mode in kill hang; do
  log=$LOGDIR/$mode.log
  start=$(date +%s)
  MEGATRON_TEST_DIST_FAILURE=$mode MEGATRON_TEST_DIST_TIMEOUT_S=3 timeout 120 "${MPIRUN[@]}" -np 3 \
    -x MEGATRON_TEST_DIST_FAILURE -x MEGATRON_TEST_DIST_TIMEOUT_S \
    "$BIN/unit_tests" --gtest_filter='DistFailure*' --gtest_color=no >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  [ $rc -ne 0 ] || fail "$mode: job exited 0"
  [ $rc -ne 124 ] || fail "$mode: job hung until the outer timeout"
  [ $secs -le 60 ] || fail "$mode: took ${secs}s"
  if [ $mode = kill ]; then
    grep -q "exited on signal 9" "$log" || { cat "$log" >&2; fail "kill: no message naming the killed rank"; }
  else
    grep -q "watchdog: all_reduce(sum, \[16\] float32) on group \[0, 1, 2\] did not complete within 3 s" "$log" \
      || { cat "$log" >&2; fail "hang: no watchdog message"; }
  fi
  echo "$mode: job ended with status $rc after ${secs}s"
done
