#!/bin/bash
# Session 4, call C (lead): the helpers' GPU checks on the merged tree: gpt2perf (GPU 0) and
# fp8fuse (GPU 1) side by side, then fp8pg (both GPUs) and the NCCL unit/functional checks.
DEADLINE=${DEADLINE:-560}
source "$(dirname "$0")/env.sh"
OO=${OUT:-/tmp/out}
t1=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 timeout 200 bash $R/tests/gpu/gpt2perf_check.sh $B > $O/gpt2perf.log 2>&1; echo "rc $?" >> $O/gpt2perf.log ) &
p1=$!
( CUDA_VISIBLE_DEVICES=1 timeout 200 bash $R/tests/gpu/fp8fuse_check.sh $B > $O/fp8fuse.log 2>&1; echo "rc $?" >> $O/fp8fuse.log ) &
p2=$!
wait $p1 $p2
echo "== gpt2perf+fp8fuse $(( $(date +%s) - t1 )) s"
grep -E "^(PASS|FAIL|INFO)|^rc " $O/gpt2perf.log | cut -c1-260
echo "-----"
grep -E "^(PASS|FAIL|INFO)|^rc " $O/fp8fuse.log | cut -c1-260
pack
step fp8pg 150 bash $R/tests/gpu/fp8pg_check.sh $B
grep -E "^(PASS|FAIL|INFO)" $O/fp8pg.log | cut -c1-260
mkdir -p /tmp/nb && ln -sfn $B /tmp/nb/bin
step nccl 150 bash $R/tests/gpu/run_nccl_tests.sh /tmp/nb
grep -E "PASS|FAIL" $O/nccl.log | head -20 | cut -c1-200
for d in gpt2perf fp8fuse fp8pg; do mkdir -p $O/res_$d; cp -r $OO/$d/*.txt $OO/$d/*.log $O/res_$d/ 2>/dev/null; done
echo "#### callC done $(( $(date +%s) - T0 )) s"; pack
