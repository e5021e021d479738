#!/bin/bash
# Lead call 4: (a) GPU determinism and resume on a small LLaMA with the 8B script's exact flags
# (SCALE_DOWN): two straight 6-iteration runs, and a save at 3 + resume to 6; (b) LLaMA-3 8B at the
# script's own global batch 128 (64 micro-batches per GPU) in bf16 and fp8, DP2 + distributed optimizer.
DEADLINE=${DEADLINE:-280}
source "$(dirname "$0")/env.sh"
SD="SCALE_DOWN=1 NUM_LAYERS=4 HIDDEN_SIZE=1024 FFN_HIDDEN_SIZE=3584 NUM_ATTENTION_HEADS=8 NUM_QUERY_GROUPS=2 KV_CHANNELS=128 SEQ_LENGTH=2048"
for r in s1 s2; do run8b small_$r 40 NPROC_PER_NODE=2 $SD BENCH_ITERS=6 BENCH_GBS=8; done
rm -rf /tmp/ckpt8b
run8b small_save 40 NPROC_PER_NODE=2 $SD BENCH_ITERS=6 BENCH_GBS=8 BENCH_CKPT=1 EXTRA_ARGS="--exit-interval 3"
run8b small_resume 40 NPROC_PER_NODE=2 $SD BENCH_ITERS=6 BENCH_GBS=8 BENCH_CKPT=load
rm -rf /tmp/ckpt8b
for r in small_s1 small_s2 small_save small_resume; do echo "$r: $(grep -E 'iteration +[0-9]+/' $O/$r.log | sed -E 's/.*iteration +([0-9]+)\/.*lm loss: ([0-9.E+-]+).*grad norm: ([0-9.]+).*/\1:\2:\3/' | tr '\n' ' ')"; done
run8b bf16_g128 150 NPROC_PER_NODE=2 DTYPE=bf16 BENCH_ITERS=2 BENCH_GBS=128
run8b fp8_g128 90 NPROC_PER_NODE=2 DTYPE=fp8 BENCH_ITERS=2 BENCH_GBS=128
echo "#### call4 done $(( $(date +%s) - T0 )) s"; pack
