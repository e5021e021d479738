#!/bin/bash
# Session 4, call E (lead): merged tree with fp8pg + fp8mem + fp8fuse + gpt2perf: the re-written
# FP8 residual-GEMM check; LLaMA-4L fp8 losses with/without the FP8 residual epilogue; fp8pg check
# (now with the bf16 copy freed); NCCL tests incl. the watchdog fix; LLaMA-3 8B fp8 DP2 gbs 32.
DEADLINE=${DEADLINE:-540}
source "$(dirname "$0")/env.sh"
OO=${OUT:-/tmp/out}
CUDA_VISIBLE_DEVICES=0 step resgemm 60 $B/fp8_gpu_test --no-timing --groups residual_gemm,linear
grep -E "^(ok|FAIL)" $O/resgemm.log | cut -c1-250
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache --global-batch-size 1 --train-iters 10"
FP8="--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max"
( CUDA_VISIBLE_DEVICES=0 timeout 60 $B/pretrain_gpt $LL $FP8 > $O/ll_fp8_ep1.log 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 MEGATRON_GEMM_EPILOGUES=0 timeout 60 $B/pretrain_gpt $LL $FP8 > $O/ll_fp8_ep0.log 2>&1 ) &
wait
for n in ll_fp8_ep1 ll_fp8_ep0; do echo "$n: $(grep -E ' iteration +[0-9]+/' $O/$n.log | sed -E 's/.*iteration +([0-9]+)\/.*elapsed time per iteration \(ms\): ([0-9.]+).*lm loss: ([0-9.E+-]+).*/\1:\2:\3/' | tr '\n' ' ')"; done
step fp8pg 150 bash $R/tests/gpu/fp8pg_check.sh $B
grep -E "^(PASS|FAIL|INFO)" $O/fp8pg.log | cut -c1-260
mkdir -p /tmp/nb && ln -sfn $B /tmp/nb/bin
step nccl 120 bash $R/tests/gpu/run_nccl_tests.sh /tmp/nb
grep -E "PASS|FAIL|watchdog" $O/nccl.log | head -12 | cut -c1-250
run8b fp8_g32 150 NPROC_PER_NODE=2 DTYPE=fp8 BENCH_ITERS=4 BENCH_GBS=32
grep -E "iteration +[0-9]+/" $O/fp8_g32.log | cut -c1-300
mkdir -p $O/res_fp8pg; cp $OO/fp8pg/*.txt $OO/fp8pg/*.log $O/res_fp8pg/ 2>/dev/null
echo "#### callE done $(( $(date +%s) - T0 )) s"; pack
