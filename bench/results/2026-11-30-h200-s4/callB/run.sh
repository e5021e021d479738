#!/bin/bash
# Session 4, call B (lead): GEMM autotuning A/B (MEGATRON_GEMM_AUTOTUNE=0/1) on the LLaMA-8B-shaped
# 4-layer model (bf16, fp8, gbs 1) and GPT-2 124M; GPT-2 kernel profile without epilogues.
DEADLINE=${DEADLINE:-300}
source "$(dirname "$0")/env.sh"
export CUDA_VISIBLE_DEVICES=0
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache --global-batch-size 1 --train-iters 10"
FP8="--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max"
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --train-iters 12 --log-interval 1 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 64 --global-batch-size 64 --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
ms() { grep -E ' iteration +[0-9]+/' $O/$1.log | awk -F'elapsed time per iteration \\(ms\\): ' '{split($1,a,"iteration +"); split(a[2],b,"/"); if (b[1]+0 >= 4) {split($2,c," "); s+=c[1]; n++}} END {if (n) printf "%.1f", s/n; else print "NA"}'; }
loss() { grep -E ' iteration +[0-9]+/' $O/$1.log | tail -1 | sed -E 's/.*lm loss: ([0-9.E+-]+).*/\1/'; }
for at in 0 1; do
  MEGATRON_GEMM_AUTOTUNE=$at step ll_bf16_at$at 60 $B/pretrain_gpt $LL
  MEGATRON_GEMM_AUTOTUNE=$at step ll_fp8_at$at 60 $B/pretrain_gpt $LL $FP8
  MEGATRON_GEMM_AUTOTUNE=$at step gpt2_at$at 60 $B/pretrain_gpt $GPT2
  MEGATRON_GEMM_AUTOTUNE=$at MEGATRON_GEMM_EPILOGUES=0 step gpt2_noep_at$at 60 $B/pretrain_gpt $GPT2
done
for n in ll_bf16 ll_fp8 gpt2 gpt2_noep; do echo "$n: autotune0 $(ms ${n}_at0) ms (loss $(loss ${n}_at0)) | autotune1 $(ms ${n}_at1) ms (loss $(loss ${n}_at1)) | first iters at1: $(grep -E ' iteration +[0-9]+/' $O/${n}_at1.log | head -2 | sed -E 's/.*elapsed time per iteration \(ms\): ([0-9.]+).*/\1/' | tr '\n' ' ')"; done
export MEGATRON_KERNEL_PROFILE_OUT=$O
MEGATRON_GEMM_EPILOGUES=0 MEGATRON_KERNEL_PROFILE=10:11 step gpt2_noep_prof 60 $B/pretrain_gpt $GPT2
grep "kernel profile" $O/gpt2_noep_prof.log | head -38 | cut -c1-220
MEGATRON_GEMM_AUTOTUNE=1 MEGATRON_KERNEL_PROFILE=6:7 step ll_bf16_at1_prof 60 $B/pretrain_gpt $LL
grep "kernel profile" $O/ll_bf16_at1_prof.log | head -30 | cut -c1-220
echo "#### callB done $(( $(date +%s) - T0 )) s"; pack
