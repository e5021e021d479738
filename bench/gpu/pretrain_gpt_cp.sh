#!/bin/bash
# Context parallelism of pretrain_gpt on two GPUs (not yet run on the GPU machine: see
# docs/distributed.md, "Context parallelism").
#
#   bench/gpu/pretrain_gpt_cp.sh BIN_DIR OUT_DIR MODE [PARTS]
#     MODE  cpu: fp32 on the CPU (MEGATRON_DEVICE=cpu, no --bf16), the CP runs under mpirun -np 2
#           gpu: --bf16, CP1 on cuda:0, CP2 on two GPUs with NCCL (megatron_launch)
#     PARTS any of: tiny (correctness: CP2 p2p and a2a, GPT and LLaMA, head dim 64),
#           long (LLaMA-3-8B-shaped 4 layers at seq 16384 and 32768: CP1 on one GPU vs CP2 on
#           two, --log-throughput and the memory lines); default "tiny"
#
# Logs: OUT_DIR/<name>.log, one "rc N" line last. Correctness: bench/gpu/compare_lm_loss.sh
# OUT_DIR/<x>_cp1.log OUT_DIR/<x>_cp2.log (bf16 tolerance), or a CPU log against a GPU log.
set -u
B=$1; O=$2; MODE=$3; PARTS=${4:-tiny}
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
PORT=29650
COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache_cp_$MODE"
OPT="--train-iters 20 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 --log-interval 1"
TGPT="--num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 256 --max-position-embeddings 256 --micro-batch-size 2 --global-batch-size 4 --vocab-size 128 --lr 3e-3 --min-lr 3e-4 $OPT"
TLLAMA="--num-layers 2 --hidden-size 256 --ffn-hidden-size 512 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --kv-channels 64 --seq-length 256 --max-position-embeddings 256 --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 2 --global-batch-size 4 --vocab-size 128 --lr 5e-4 --min-lr 5e-5 $OPT"
if [ "$MODE" = cpu ]; then export MEGATRON_DEVICE=cpu; PREC=""; else PREC="--bf16"; fi

# run NAME (single|two) TIMEOUT ARGS...
run() {
  local name=$1 how=$2 to=$3; shift 3
  PORT=$((PORT + 1))
  local log=$O/$name.log
  echo "== $name ($how, $(date -u +%T))"
  if [ "$how" = single ]; then
    CUDA_VISIBLE_DEVICES=0 timeout "$to" "$B/pretrain_gpt" "$@" >"$log" 2>&1
  elif [ "$MODE" = cpu ]; then
    timeout "$to" mpirun -np 2 --allow-run-as-root --bind-to none --oversubscribe -x OMP_NUM_THREADS -x MEGATRON_DEVICE \
      "$B/pretrain_gpt" "$@" >"$log" 2>&1
  else
    timeout "$to" "$B/megatron_launch" --nproc-per-node 2 --master-port $PORT "$B/pretrain_gpt" "$@" >"$log" 2>&1
  fi
  local rc=$?
  echo "rc $rc" >>"$log"
  grep -E "iteration +[0-9]+/|memory \(MB\)" "$log" | tail -n 3 | cut -c1-400
  [ $rc = 0 ] || tail -n 15 "$log"
}

for part in $PARTS; do
  case $part in
  tiny)
    run gpt_cp1 single 120 $TGPT $COMMON $PREC
    run gpt_cp2 two 120 $TGPT $COMMON $PREC --context-parallel-size 2
    run gpt_cp2_a2a two 120 $TGPT $COMMON $PREC --context-parallel-size 2 --cp-comm-type a2a
    run llama_cp1 single 120 $TLLAMA $COMMON $PREC
    run llama_cp2 two 120 $TLLAMA $COMMON $PREC --context-parallel-size 2
    run llama_cp2_a2a two 120 $TLLAMA $COMMON $PREC --context-parallel-size 2 --cp-comm-type a2a
    ;;
  long)
    for S in 16384 32768; do
      LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length $S --max-position-embeddings $S --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --train-iters 10 --log-interval 5 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --use-distributed-optimizer"
      run ll_s${S}_cp1 single 300 $LL $COMMON
      run ll_s${S}_cp2 two 300 $LL $COMMON --context-parallel-size 2
    done
    ;;
  esac
done
