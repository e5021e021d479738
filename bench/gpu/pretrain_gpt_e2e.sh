#!/bin/bash
# pretrain_gpt on one H200: tiny GPT/LLaMA on the GPU in bf16 (compare with the same flags run
# with MEGATRON_DEVICE=cpu and without --bf16 on the build machine), then GPT-2 124M and the
# LLaMA-3-8B-shaped 4-layer decoder with --log-throughput. Usage: copy build/bin/pretrain_gpt
# next to this script, plus lib.tar.xz = lib/ holding the binary's non-CUDA shared libraries
# (ldd build/bin/pretrain_gpt: ICU, sentencepiece, Open MPI, OpenBLAS ...; the GPU image lacks
# them), then run it there; logs go to $OUT. Results: bench/results.csv (suite e2e;
# bench/gpu/run_bench.sh e2e runs the same GPT-2 and LLaMA flags and appends the rows).
D=$(cd "$(dirname "$0")" && pwd); B=$D/pretrain_gpt; O=${OUT:-/tmp/out}; mkdir -p $O
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/gl && tar xJf $D/lib.tar.xz -C /tmp/gl && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl/lib
for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
  if ! ldd $B | grep -q "$l => /"; then
    d=$(dirname "$(find / -xdev -name "$l" 2>/dev/null | head -1)"); export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; fi
done
ldd $B | tee $O/ldd.txt | grep -E "cublas|cudart|nccl|not found"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee $O/gpu.txt
COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
TINY="--num-layers 2 --hidden-size 64 --num-attention-heads 1 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 --vocab-size 128 --log-interval 1"
TLLAMA="--num-layers 2 --hidden-size 128 --ffn-hidden-size 256 --num-attention-heads 2 --group-query-attention --num-query-groups 1 --kv-channels 64 --seq-length 128 --max-position-embeddings 128 --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 --vocab-size 128 --log-interval 1"
timeout 40 $B $TINY $COMMON --bf16 > $O/tiny_gpt_gpu_bf16.log 2>&1; echo "rc $?" >> $O/tiny_gpt_gpu_bf16.log
timeout 40 $B $TLLAMA $COMMON --bf16 > $O/tiny_llama_gpu_bf16.log 2>&1; echo "rc $?" >> $O/tiny_llama_gpu_bf16.log
tail -n 4 $O/tiny_gpt_gpu_bf16.log $O/tiny_llama_gpu_bf16.log
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --train-iters 30 --log-interval 10 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput"
timeout 75 $B $GPT2 $COMMON --micro-batch-size 64 --global-batch-size 64 > $O/gpt2_124m_mbs64.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpt2_124m_mbs64.log
if [ $rc != 0 ]; then timeout 45 $B $GPT2 $COMMON --micro-batch-size 16 --global-batch-size 16 > $O/gpt2_124m_mbs16.log 2>&1; echo "rc $?" >> $O/gpt2_124m_mbs16.log; fi
tail -n 5 $O/gpt2_124m_mbs*.log
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --train-iters 15 --log-interval 5 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput"
timeout 90 $B $LL $COMMON > $O/llama8b_4l_seq8192.log 2>&1; echo "rc $?" >> $O/llama8b_4l_seq8192.log
tail -n 6 $O/llama8b_4l_seq8192.log
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv
