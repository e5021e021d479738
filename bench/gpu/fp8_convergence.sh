#!/bin/bash
# FP8 vs bf16 convergence on real text (issue #10: "300 steps of a small LLaMA on real data in fp8
# and in bf16 — final losses within 2%"), both runs side by side on two GPUs (GPU 0 bf16, GPU 1 fp8).
#   bench/gpu/fp8_convergence.sh BIN DATA_PREFIX TOKENIZER_DIR [OUT]
# DATA_PREFIX: a preprocess_data output (LLaMA-3 tokenizer; 2026-11-30: the first 100,000 lines of
# the corpus of tests/reference/preprocess/make_corpus.py bench = 11.4 M tokens). The model sees
# 300 x 32 x 1024 = 9.8 M tokens, less than one epoch of the 98% train split, so the losses
# measure learning, not memorisation.
# Prints the final training loss (mean of the last 50 logged iterations) and the validation loss of
# both runs and their relative difference. Not a unit test: a measurement for docs/fp8.md.
B=${1:?bin dir}; DATA=${2:?data prefix}; TOK=${3:?tokenizer dir}; O=${4:-${OUT:-/tmp/out}}; mkdir -p $O
M="--num-layers 8 --hidden-size 512 --ffn-hidden-size 1536 --num-attention-heads 8 --group-query-attention
 --num-query-groups 2 --kv-channels 64 --seq-length 1024 --max-position-embeddings 1024 --position-embedding-type rope
 --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
 --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 8 --global-batch-size 32 --train-iters 300 --lr 1e-3
 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.1 --clip-grad 1.0 --bf16 --seed 1234
 --data-path $DATA --split 98,2,0 --tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOK
 --data-cache-path /tmp/cache_conv --log-interval 1 --eval-interval 300 --eval-iters 20"
FP8="--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max"
CUDA_VISIBLE_DEVICES=0 timeout ${CONV_TIMEOUT:-150} $B/pretrain_gpt $M > $O/conv_bf16.log 2>&1 & p0=$!
CUDA_VISIBLE_DEVICES=1 timeout ${CONV_TIMEOUT:-150} $B/pretrain_gpt $M $FP8 > $O/conv_fp8.log 2>&1 & p1=$!
wait $p0; echo "rc $?" >> $O/conv_bf16.log; wait $p1; echo "rc $?" >> $O/conv_fp8.log
stat() {  # mean lm loss of iterations 251-300, validation loss at 300
  local tr va
  tr=$(grep -E "iteration +[0-9]+/ +300 \|" $1 | awk -F'|' '{split($1,a," "); it=a[length(a)-1]+0; for(i=1;i<=NF;i++) if ($i ~ /lm loss:/) {split($i,b,":"); if (it>250) {s+=b[2]; n++}}} END {if (n) printf "%.5f", s/n}')
  va=$(grep -E "validation loss at iteration 300 on validation set" $1 | sed -E 's/.*lm loss value: ([0-9.E+-]+).*/\1/')
  echo "$tr $va"
}
read tb vb < <(stat $O/conv_bf16.log); read tf vf < <(stat $O/conv_fp8.log)
echo "bf16: train(251-300) $tb  val $vb   $(tail -1 $O/conv_bf16.log)"
echo "fp8 : train(251-300) $tf  val $vf   $(tail -1 $O/conv_fp8.log)"
python3 -c "
tb,tf,vb,vf=[float(x) if x else float('nan') for x in ('$tb','$tf','$vb','$vf')]
rt=abs(tf-tb)/tb; rv=abs(vf-vb)/vb
print(f'fp8 vs bf16: train rel diff {rt:.4f}, val rel diff {rv:.4f} (goal <= 0.02): ' + ('PASS' if rt<=0.02 and rv<=0.02 else 'FAIL'))"
