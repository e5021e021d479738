#!/bin/bash
# FP8 on one H200 (docs/fp8.md, docs/performance.md): fp8_gpu_test, a 300-step small LLaMA on the
# bundled real text in bf16 / fp8 delayed / fp8 tensorwise, and the LLaMA-3-8B-shaped 4-layer
# step at seq 8192 in fp8 and bf16. Runs on the device machine from a folder holding this script
# and fp8.tar.xz = stage/{pretrain_gpt,fp8_gpu_test} (stripped, CUDA build), stage/lib/ (the
# non-CUDA shared libraries they need, from ldd) and stage/data/ (corpus_text_document.{bin,idx}
# from examples/quickstart_real_data.sh's preprocessing, encoder.json, vocab.bpe).
# Usage: bash fp8_e2e.sh [all|test|train|bench]; logs in $OUT.
D=$(cd "$(dirname "$0")" && pwd); O=${OUT:-/tmp/out}; mkdir -p $O
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
mkdir -p /tmp/f8 && tar xJf $D/fp8.tar.xz -C /tmp/f8; S=/tmp/f8/stage
export LD_LIBRARY_PATH=$S/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=$S/pretrain_gpt
for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
  if ! ldd $B | grep -q "$l => /"; then
    d=$(dirname "$(find / -xdev -name "$l" 2>/dev/null | head -1)"); export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; fi
done
ldd $B | grep -E "cublas|cudart|not found"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee $O/gpu.txt
WHAT=${1:-all}
if [[ $WHAT == all || $WHAT == test ]]; then
  timeout 150 $S/fp8_gpu_test > $O/fp8_gpu_test.log 2>&1; echo "rc $?" >> $O/fp8_gpu_test.log; cat $O/fp8_gpu_test.log
fi
T=$S/data
SMALL="--num-layers 4 --hidden-size 256 --ffn-hidden-size 768 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --kv-channels 64 --seq-length 256 --max-position-embeddings 256 --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 8 --global-batch-size 8 --train-iters 300 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.1 --clip-grad 1.0 --bf16 --seed 1234 --data-path $T/corpus_text_document --split 95,5,0 --tokenizer-type GPT2BPETokenizer --vocab-file $T/encoder.json --merge-file $T/vocab.bpe --data-cache-path /tmp/cache --log-interval 50 --eval-interval 100 --eval-iters 10"
FP8="--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max"
if [[ $WHAT == all || $WHAT == train ]]; then
  timeout 80 $B $SMALL > $O/small_llama_bf16.log 2>&1; echo "rc $?" >> $O/small_llama_bf16.log
  timeout 80 $B $SMALL $FP8 > $O/small_llama_fp8.log 2>&1; echo "rc $?" >> $O/small_llama_fp8.log
  timeout 60 $B $SMALL $FP8 --fp8-recipe tensorwise --no-fp8-wgrad > $O/small_llama_fp8_tensorwise.log 2>&1; echo "rc $?" >> $O/small_llama_fp8_tensorwise.log
  grep -E "iteration +300/|validation loss at iteration 300 on val|rc " $O/small_llama_*.log
fi
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --train-iters 15 --log-interval 5 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
if [[ $WHAT == all || $WHAT == bench ]]; then
  timeout 100 $B $LL $FP8 > $O/llama8b_4l_fp8.log 2>&1; echo "rc $?" >> $O/llama8b_4l_fp8.log
  timeout 100 $B $LL > $O/llama8b_4l_bf16.log 2>&1; echo "rc $?" >> $O/llama8b_4l_bf16.log
  grep -E "iteration +(5|10|15)/|rc |rror" $O/llama8b_4l_*.log
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,memory.used --format=csv
