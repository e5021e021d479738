#!/bin/bash
# Session 4, call A (lead): recompute check; kernel profiles of GPT-2 124M and the LLaMA-8B-shaped
# 4-layer model (bf16, fp8) to guide this session's work; bf16 vs fp8 at gbs 4; compute-sanitizer
# availability; fp16 on the GPU; tiny GPT/LLaMA 50 steps GPU bf16 vs CPU fp32.
DEADLINE=${DEADLINE:-420}
source "$(dirname "$0")/env.sh"
export CUDA_VISIBLE_DEVICES=0
step recompute 100 bash $R/tests/gpu/recompute_check.sh $B
cp -r ${OUT:-/tmp/out}/recompute $O/ 2>/dev/null; grep -E "^(PASS|FAIL|INFO)" $O/recompute.log | cut -c1-300
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
FP8="--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max"
export MEGATRON_KERNEL_PROFILE_OUT=$O
MEGATRON_KERNEL_PROFILE=5:6 step ll_bf16_g1 60 $B/pretrain_gpt $LL --global-batch-size 1 --train-iters 7
mkdir -p $O/p_bf16 && mv $O/kernel_profile_rank0.json $O/p_bf16/ 2>/dev/null
MEGATRON_KERNEL_PROFILE=5:6 step ll_fp8_g1 60 $B/pretrain_gpt $LL $FP8 --global-batch-size 1 --train-iters 7
mkdir -p $O/p_fp8 && mv $O/kernel_profile_rank0.json $O/p_fp8/ 2>/dev/null
step ll_bf16_g4 60 $B/pretrain_gpt $LL --global-batch-size 4 --train-iters 6
step ll_fp8_g4 60 $B/pretrain_gpt $LL $FP8 --global-batch-size 4 --train-iters 6
for n in ll_bf16_g1 ll_fp8_g1 ll_bf16_g4 ll_fp8_g4; do echo "$n: $(grep -E ' iteration +[0-9]+/' $O/$n.log | tail -3 | sed -E 's/.*iteration +([0-9]+)\/.*elapsed time per iteration \(ms\): ([0-9.]+).*throughput per GPU \(TFLOP\/s\/GPU\): ([0-9.]+).*/\1:\2ms:\3TF/' | tr '\n' ' ')"; done
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --train-iters 12 --log-interval 1 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 64 --global-batch-size 64 --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
MEGATRON_KERNEL_PROFILE=10:11 step gpt2 60 $B/pretrain_gpt $GPT2
mkdir -p $O/p_gpt2 && mv $O/kernel_profile_rank0.json $O/p_gpt2/ 2>/dev/null
echo "gpt2: $(grep -E ' iteration +[0-9]+/' $O/gpt2.log | tail -3 | sed -E 's/.*iteration +([0-9]+)\/.*elapsed time per iteration \(ms\): ([0-9.]+).*/\1:\2ms/' | tr '\n' ' ')"
for n in ll_bf16_g1 ll_fp8_g1 gpt2; do echo "### $n"; grep "kernel profile" $O/$n.log | head -34 | cut -c1-200; done
# compute-sanitizer: available? quick memcheck on one op group
which compute-sanitizer > $O/cs.txt 2>&1; compute-sanitizer --version >> $O/cs.txt 2>&1; head -3 $O/cs.txt
step cs_norms 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu_ops_test --small --only norms,rope
tail -3 $O/cs_norms.log
TINY="--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --vocab-size 1024 --micro-batch-size 4 --global-batch-size 8 --train-iters 50 --log-interval 5 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 5 --clip-grad 1.0 --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache2"
step t_gpu_fp16 60 $B/pretrain_gpt $TINY --fp16 --initial-loss-scale 65536
step t_cpu_fp16 60 env MEGATRON_DEVICE=cpu $B/pretrain_gpt $TINY --fp16 --initial-loss-scale 65536
step t_gpu_bf16 60 $B/pretrain_gpt $TINY --bf16
step t_cpu_fp32 60 env MEGATRON_DEVICE=cpu $B/pretrain_gpt $TINY
for n in t_gpu_fp16 t_cpu_fp16 t_gpu_bf16 t_cpu_fp32; do echo "$n: $(grep -E ' iteration +[0-9]+/' $O/$n.log | sed -E 's/.*iteration +([0-9]+)\/.*lm loss: ([0-9.E+-]+).*/\1:\2/' | tr '\n' ' ') $(grep -m1 -iE 'error|what\(' $O/$n.log)"; done
echo "#### callA done $(( $(date +%s) - T0 )) s"; pack
