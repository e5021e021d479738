#!/bin/bash
# Lead call 2 (session 3): the helpers' GPU checks of the merged tree, side by side on two GPUs,
# and the fp8-vs-bf16 convergence run on real text. Logs -> $OUT/logs.tgz.
DEADLINE=${DEADLINE:-480}
source "$(dirname "$0")/env.sh"
cat $O/env.txt
# real data for the convergence run (LLaMA-3 tokenizer, 30 workers; ~1 s)
mkdir -p /tmp/data && (cd /tmp/data && tar xzf $D/tok.tar.gz && gzip -dc $D/bench.jsonl.gz > bench.jsonl && \
  $B/preprocess_data --input bench.jsonl --output-prefix /tmp/data/llama3 --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model /tmp/data/llama3-tok --append-eod --workers 30 --log-interval 100000000 > $O/preprocess.log 2>&1)
# A) one-GPU checks in pairs: GPU0 hostgap | GPU1 fp8perf, then GPU0 kprof | GPU1 gpu_ops_test
( export CUDA_VISIBLE_DEVICES=0 OUT=$O/a0; step hostgap 170 bash $R/tests/gpu/hostgap_check.sh $B ) > $O/a0.txt 2>&1 &
( export CUDA_VISIBLE_DEVICES=1 OUT=$O/a1; step fp8perf 150 bash $R/tests/gpu/fp8perf_check.sh $B ) > $O/a1.txt 2>&1 &
wait; cat $O/a0.txt $O/a1.txt
grep -hE "PASS|FAIL|INFO|tok|ratio" $O/hostgap.log $O/fp8perf.log | cut -c1-220 | head -60
( export CUDA_VISIBLE_DEVICES=0 OUT=$O/b0; step kprof 60 bash $R/tests/gpu/kprof_check.sh $B ) > $O/b0.txt 2>&1 &
( export CUDA_VISIBLE_DEVICES=1; step gpu_ops_test 90 $B/gpu_ops_test ) > $O/b1.txt 2>&1 &
( OUT=$O/ck step ckptio 100 bash $R/tests/gpu/ckptio_check.sh $B ) > $O/b2.txt 2>&1 &
wait; cat $O/b0.txt $O/b1.txt $O/b2.txt
grep -hE "PASS|FAIL" $O/kprof.log | cut -c1-200 | head -30
echo "gpu_ops_test: $(grep -c PASS $O/gpu_ops_test.log) PASS, $(grep -c FAIL $O/gpu_ops_test.log) FAIL"; grep FAIL $O/gpu_ops_test.log | head
grep -hE "PASS|FAIL|MB/s|GB/s" $O/ckptio.log | head -20
# B) two-GPU checks
OUT=$O/ex step example 90 bash $R/tests/gpu/example_gpu_check.sh $B; grep -hE "PASS|FAIL|SKIP" $O/example.log | cut -c1-200
OUT=$O/tp step tp2mem 120 bash $R/tests/gpu/tp2mem_check.sh $B; grep -hE "PASS|FAIL|allocated|peak" $O/tp2mem.log | cut -c1-220 | head -20
CONV_TIMEOUT=150 step fp8conv 160 bash $R/bench/gpu/fp8_convergence.sh $B /tmp/data/llama3_text_document /tmp/data/llama3-tok $O/conv; tail -4 $O/fp8conv.log
echo "#### call2 done $(( $(date +%s) - T0 )) s"; pack
