#!/bin/bash
# Session 4, call F (lead): where does the NCCL watchdog test hang? (thread backtraces of rank 0 via
# cuda-gdb 15 s in); the compute-sanitizer lane again with every initcheck/synccheck record attributed.
DEADLINE=${DEADLINE:-400}
source "$(dirname "$0")/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
( MEGATRON_TEST_DIST_BACKEND=nccl MEGATRON_TEST_DIST_FAILURE=hang MEGATRON_TEST_DIST_TIMEOUT_S=5 NCCL_DEBUG=WARN timeout 60 $B/megatron_launch --nproc-per-node 2 --master-port 29741 $B/unit_tests --gtest_filter='DistNcclFailure.*' --gtest_color=no > $O/hang.log 2>&1; echo "rc $?" >> $O/hang.log ) &
sleep 15
ps -eo pid,ppid,etimes,args | grep unit_tests | grep -v grep > $O/hang_ps.txt
cat $O/hang_ps.txt | cut -c1-150
for p in $(ps -eo pid,args | grep "unit_tests --gtest_filter=DistNcclFailure" | grep -v -e grep -e megatron_launch | awk '{print $1}'); do
  echo "=== pid $p" >> $O/hang_bt.txt
  timeout 40 cuda-gdb -p $p -batch -ex "info threads" -ex "thread apply all bt 12" >> $O/hang_bt.txt 2>&1
done
grep -E "^=== pid|^Thread|^#[0-9]+ " $O/hang_bt.txt | cut -c1-200 | head -90
wait
tail -8 $O/hang.log | cut -c1-250
GPUCHECK_STEPS=sanitizer GPUCHECK_BUDGET=200 CUDA_VISIBLE_DEVICES=0 GPUCHECK_SANITIZER_GPU=1 timeout 260 bash $R/tests/gpu/run_gpu_tests.sh $B $O/gpucheck > $O/gpucheck_san.log 2>&1
echo "rc $?"
grep -E "^(PASS|FAIL|INFO)" $O/gpucheck_san.log | cut -c1-300
echo "#### callF done $(( $(date +%s) - T0 )) s"; pack
