#!/bin/bash
# Session 4, call D (lead): tests/gpu/run_gpu_tests.sh (issue #7 deliverable 3) on the merged tree:
# lanes A (kernels, 50-step GPU-vs-CPU training, fp16, determinism, recompute) on GPU 0 and B
# (compute-sanitizer) on GPU 1.
DEADLINE=${DEADLINE:-560}
source "$(dirname "$0")/env.sh"
OO=${OUT:-/tmp/out}
GPUCHECK_SANITIZER_GPU=1 GPUCHECK_BUDGET=${GPUCHECK_BUDGET:-400} CUDA_VISIBLE_DEVICES=0 timeout 520 bash $R/tests/gpu/run_gpu_tests.sh $B $O/gpucheck > $O/gpucheck.log 2>&1
echo "rc $?"
grep -E "^(PASS|FAIL|INFO)" $O/gpucheck.log | cut -c1-300
cp $O/gpucheck/summary.md $O/gpucheck_summary.txt 2>/dev/null; cp $O/gpucheck/results.tsv $O/gpucheck_results.txt 2>/dev/null
echo "#### callD done $(( $(date +%s) - T0 )) s"; pack
