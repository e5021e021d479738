#!/bin/bash
# Lead call 3 (session 3): LLaMA-3 8B on two H200 with Megatron's script flags -- bf16 and fp8 at
# global batch 32 (16 micro-batches per GPU) with the kernel profile of iterations 3-4 on every rank,
# TP2 + sequence parallel, then a checkpoint: save at iteration 2 (--exit-interval), evaluation of
# that checkpoint on ONE GPU (DP2 + distributed optimizer -> 1 GPU, no optimizer state), and the
# resume of the DP2 run from it. Logs -> $OUT/logs.tgz.
DEADLINE=${DEADLINE:-540}
source "$(dirname "$0")/env.sh"
cat $O/env.txt; grep -hE "PASS|FAIL|INFO|tok/s|tokens/s|ratio|GB/s" $O/hostgap.log $O/fp8perf.log 2>/dev/null | cut -c1-230 | head -90
rm -rf /tmp/ckpt8b /tmp/tb8b
export MEGATRON_KERNEL_PROFILE_OUT=$O/kprof
prof() { grep -A32 "kernel profile |" $O/$1.log | head -${2:-34} | cut -c1-200; }
# 1) bf16 DP2, gbs 32, profile iterations 3-4 (all ranks)
run8b bf16_dp2_g32 110 NPROC_PER_NODE=2 DTYPE=bf16 BENCH_ITERS=5 BENCH_GBS=32 MEGATRON_KERNEL_PROFILE=3:4
prof bf16_dp2_g32
# 2) fp8 DP2, gbs 32, same profile
run8b fp8_dp2_g32 100 NPROC_PER_NODE=2 DTYPE=fp8 BENCH_ITERS=5 BENCH_GBS=32 MEGATRON_KERNEL_PROFILE=3:4
prof fp8_dp2_g32
# 3) TP2 + SP, bf16, gbs 8 (8 micro-batches per GPU)
run8b bf16_tp2 70 NPROC_PER_NODE=2 DTYPE=bf16 BENCH_ITERS=4 BENCH_GBS=8 BENCH_TP=2
# 4) checkpoint: 4-iteration schedule, exit + save after iteration 2 (model + distributed optimizer)
df -h /tmp | tail -1
run8b ckpt_save 150 NPROC_PER_NODE=2 DTYPE=bf16 BENCH_ITERS=4 BENCH_GBS=8 BENCH_CKPT=1 EXTRA_ARGS="--exit-interval 2"
ls -la /tmp/ckpt8b /tmp/ckpt8b/iter_0000002 2>&1 | head -14; du -sh /tmp/ckpt8b 2>&1; grep -E "saving|saved|time across|save-checkpoint" $O/ckpt_save.log | head -5 | cut -c1-200
# 5) evaluation only on ONE GPU from that checkpoint (resharded DP2+distributed optimizer -> 1 GPU)
run8b eval_1gpu 90 NPROC_PER_NODE=1 CUDA_VISIBLE_DEVICES=0 DTYPE=bf16 BENCH_ITERS=4 BENCH_GBS=8 BENCH_CKPT=load BENCH_EVAL_ITERS=4 EXTRA_ARGS="--skip-train --no-load-optim --no-load-rng"
grep -E "allocated bytes|validation loss|memory" $O/eval_1gpu.log | head -5 | cut -c1-200
# 6) resume the DP2 run: iterations 3-4 from the checkpoint
run8b ckpt_resume 120 NPROC_PER_NODE=2 DTYPE=bf16 BENCH_ITERS=4 BENCH_GBS=8 BENCH_CKPT=load
echo "#### call3 done $(( $(date +%s) - T0 )) s"; pack
