#!/usr/bin/env bash
# Session 5 combined check: cefuse (GPU0) || dups (GPU1), then ppnccl (both GPUs).
DEADLINE=${DEADLINE:-230}
source .device/s5a/env.sh
cd $R
( CUDA_VISIBLE_DEVICES=0 OUT=$O timeout $(( $(left) - 5 )) bash tests/gpu/cefuse_check.sh $B > $O/cefuse.txt 2>&1; echo "rc $?" >> $O/cefuse.txt ) &
p1=$!
( CUDA_VISIBLE_DEVICES=1 OUT=$O timeout $(( $(left) - 5 )) bash tests/gpu/dups_check.sh $B > $O/dups.txt 2>&1; echo "rc $?" >> $O/dups.txt ) &
p2=$!
wait $p1 $p2; pack
echo "== cefuse $(( $(date +%s) - T0 ))s"; grep -E "^(PASS|FAIL|INFO GPT-2 step|rc)" $O/cefuse.txt | cut -c1-300
echo "== dups"; grep -E "^(PASS|FAIL|rc)" $O/dups.txt | cut -c1-300
OUT=$O timeout $(( $(left) - 3 )) bash tests/gpu/ppnccl_check.sh $B > $O/ppnccl.txt 2>&1; echo "rc $?" >> $O/ppnccl.txt
pack
echo "== ppnccl $(( $(date +%s) - T0 ))s"; grep -E "^(PASS|FAIL|INFO|rc)" $O/ppnccl.txt | cut -c1-300
