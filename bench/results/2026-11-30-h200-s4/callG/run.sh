#!/bin/bash
# Session 4, call G (lead): NCCL tests after the watchdog fix (no blocking CUDA call on its thread).
DEADLINE=${DEADLINE:-200}
source "$(dirname "$0")/env.sh"
mkdir -p /tmp/nb && ln -sfn $B /tmp/nb/bin
t1=$(date +%s)
timeout 180 bash $R/tests/gpu/run_nccl_tests.sh /tmp/nb > $O/nccl.log 2>&1; echo "rc $? $(( $(date +%s) - t1 )) s"
grep -E "PASS|FAIL|watchdog|rank" $O/nccl.log | head -20 | cut -c1-250
echo "#### callG done $(( $(date +%s) - T0 )) s"; pack
