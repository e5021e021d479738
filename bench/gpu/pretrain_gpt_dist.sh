#!/bin/bash
# Multi-process pretrain_gpt: correctness of DP2 / DP2 + distributed optimizer / TP2 on two GPUs
# with NCCL against the CPU fp32 run of the same flags (mpirun), DP2 throughput of the
# LLaMA-3-8B-shaped 4-layer model against one GPU, and the real LLaMA-3 8B shape on two GPUs.
#
#   bench/gpu/pretrain_gpt_dist.sh BIN_DIR OUT_DIR MODE [PARTS]
#     MODE  cpu: fp32 on the CPU (MEGATRON_DEVICE=cpu, no --bf16), every run under mpirun -np 2
#           gpu: --bf16 on cuda:LOCAL_RANK with NCCL, under megatron_launch and mpirun
#     PARTS any of: tiny (correctness), ll (4-layer throughput), 8b (32 layers); default "tiny"
#
# BIN_DIR holds pretrain_gpt and megatron_launch. Logs: OUT_DIR/<name>.log, one "rc N" line last.
# Compare the lm losses with bench/gpu/compare_lm_loss.sh CPU_LOG GPU_LOG.
# Results: docs/gpu-test-log.md, docs/performance.md, bench/results.csv (bench/gpu/run_bench.sh dist
# runs this script's ll part and appends the rows).
set -u
B=$1; O=$2; MODE=$3; PARTS=${4:-tiny}
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# megatron_launch sets OMP_NUM_THREADS=1 when unset (as torchrun); the host-side parameter
# initialization is OpenMP-parallel, so give each of the two ranks half the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
PORT=29610
COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache_dist_$MODE"
OPT="--train-iters 20 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 --log-interval 1"
# Head dim 64 (the CUDA attention kernels take 64 and 128); heads and query groups divisible by TP=2.
TGPT="--num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 8 --vocab-size 128 --lr 3e-3 --min-lr 3e-4 $OPT"
# A lower learning rate for the LLaMA: at 3e-3 its loss on mock data falls to ~0.03, where bf16
# rounding of the logits is a large relative error of the loss.
TLLAMA="--num-layers 2 --hidden-size 256 --ffn-hidden-size 512 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --kv-channels 64 --seq-length 128 --max-position-embeddings 128 --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 4 --global-batch-size 8 --vocab-size 128 --lr 5e-4 --min-lr 5e-5 $OPT"

if [ "$MODE" = cpu ]; then
  export MEGATRON_DEVICE=cpu; PREC=""
else
  PREC="--bf16"
fi

# run NAME LAUNCHER(launch|mpirun|single) TIMEOUT ARGS...
run() {
  local name=$1 how=$2 to=$3; shift 3
  PORT=$((PORT + 1))
  local log=$O/$name.log
  echo "== $name ($how, $(date -u +%T))"
  case $how in
    launch) timeout "$to" "$B/megatron_launch" --nproc-per-node 2 --master-port $PORT "$B/pretrain_gpt" "$@" >"$log" 2>&1 ;;
    mpirun) MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT timeout "$to" mpirun -np 2 --allow-run-as-root --bind-to none --oversubscribe \
              -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS -x MASTER_ADDR -x MASTER_PORT ${MEGATRON_DEVICE:+-x MEGATRON_DEVICE} \
              "$B/pretrain_gpt" "$@" >"$log" 2>&1 ;;
    single) CUDA_VISIBLE_DEVICES=0 timeout "$to" "$B/pretrain_gpt" "$@" >"$log" 2>&1 ;;
  esac
  local rc=$?
  echo "rc $rc" >>"$log"
  grep -E "iteration +[0-9]+/" "$log" | tail -n 2 | cut -c1-400
  [ $rc = 0 ] || tail -n 15 "$log"
}

L() { [ "$MODE" = cpu ] && echo mpirun || echo "$1"; }

for part in $PARTS; do
  case $part in
  tiny)
    run gpt_dp2 "$(L launch)" 120 $TGPT $COMMON $PREC
    run gpt_dp2_distopt "$(L mpirun)" 120 $TGPT $COMMON $PREC --use-distributed-optimizer
    run gpt_tp2 "$(L launch)" 120 $TGPT $COMMON $PREC --tensor-model-parallel-size 2
    run llama_dp2 "$(L mpirun)" 120 $TLLAMA $COMMON $PREC
    run llama_dp2_distopt "$(L launch)" 120 $TLLAMA $COMMON $PREC --use-distributed-optimizer
    run llama_tp2 "$(L mpirun)" 120 $TLLAMA $COMMON $PREC --tensor-model-parallel-size 2
    run llama_tp2_launch "$(L launch)" 120 $TLLAMA $COMMON $PREC --tensor-model-parallel-size 2
    ;;
  ll)
    # LLaMA-3-8B-shaped 4-layer decoder, seq 8192, mbs 1: one micro-batch per GPU per iteration.
    LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --bf16 --train-iters 20 --log-interval 5 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput"
    run ll_1gpu single 150 $LL $COMMON --global-batch-size 1
    run ll_dp2 launch 150 $LL $COMMON --global-batch-size 2
    run ll_dp2_distopt launch 150 $LL $COMMON --global-batch-size 2 --use-distributed-optimizer
    run ll_dp2_bf16grad launch 150 $LL $COMMON --global-batch-size 2 --use-distributed-optimizer --grad-reduce-in-bf16
    run ll_dp2_overlap launch 150 $LL $COMMON --global-batch-size 2 --use-distributed-optimizer --grad-reduce-in-bf16 \
      --overlap-grad-reduce --overlap-param-gather
    ;;
  8b)
    # The real LLaMA-3 8B shape with examples/llama/train_llama3_8b_h100_fp8.sh's flags (bf16,
    # DP2 + distributed optimizer); bench/gpu/llama3_8b_bench_args.sh makes the run short.
    # If that fails (e.g. out of memory), TP2 + sequence parallel (BENCH_TP=2) in the time left.
    export REAL_PRETRAIN_GPT=$B/pretrain_gpt BENCH_ITERS=${BENCH_ITERS:-6} BENCH_GBS=${BENCH_GBS:-8}
    D=$(cd "$(dirname "$0")" && pwd)
    end=$(( $(date +%s) + ${BENCH_TIMEOUT:-400} ))
    for layout in dp2 tp2; do
      left=$(( end - $(date +%s) )); [ $left -gt 30 ] || break
      (nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$O/8b_${layout}_mem.csv" 2>/dev/null &
       echo $! >/tmp/gpudist_smi.pid)
      echo "== 8b_$layout ($(date -u +%T), ${left} s left)"
      if [ $layout = tp2 ]; then export BENCH_TP=2; fi
      NPROC_PER_NODE=2 LAUNCHER=$B/megatron_launch PRETRAIN_GPT=$D/llama3_8b_bench_args.sh MASTER_PORT=$([ $layout = dp2 ] && echo 29691 || echo 29692) \
        timeout $left bash "$D/../../examples/llama/train_llama3_8b_h100_fp8.sh" /tmp/ckpt8b /tmp/tb8b >"$O/8b_$layout.log" 2>&1
      rc=$?
      echo "rc $rc" >>"$O/8b_$layout.log"
      kill "$(cat /tmp/gpudist_smi.pid)" 2>/dev/null
      grep -E "iteration +[0-9]+/|error|rc " "$O/8b_$layout.log" | cut -c1-420 | tail -n 8
      awk -F', ' '{if ($2 > m[$1]) m[$1] = $2} END {for (g in m) print "peak memory.used GPU " g ": " m[g] " MiB"}' "$O/8b_${layout}_mem.csv"
      [ $rc = 0 ] && break
    done
    ;;
  esac
done
