#!/bin/bash
# sweep helper (session 5), branch sweep: gpu_ops_test activations group (incl. squared_relu), then
# tests/gpu/sweep_check.sh on 2 GPUs; table + logs back under $OUT. ~90 s on nvidia-h200-x2.
#   bash .device/sweep/run.sh [config-regex]     (carry .device/sweep)
DEADLINE=${DEADLINE:-200}
source "$(dirname "$0")/env.sh"
echo "binaries of sweep $(cat $D/commit.txt)"; nvidia-smi -L; nproc
CUDA_VISIBLE_DEVICES=0 timeout 60 $B/gpu_ops_test --only activations > $O/ops_act.log 2>&1; echo "gpu_ops_test activations rc $? $(grep -c squared_relu $O/ops_act.log) squared_relu lines: $(tail -1 $O/ops_act.log)"
grep -E "squared_relu|FAIL" $O/ops_act.log | head -6
cd $D && OUT=$O SWEEP_JOBS=12 timeout 170 bash $D/sweep_check.sh $B "${1:-.}"; echo "sweep rc=$?"
cp $O/sweep/table.md $O/sweep/results.tsv $OUTD/ 2>/dev/null
tar czf $OUTD/sweeplogs.tgz -C $O sweep env.txt ops_act.log 2>/dev/null
ls -la $OUTD
