#!/usr/bin/env bash
# Mixtral 8x7B pretraining with Megatron-LM's flags: the flag list of Megatron-LM's
# examples/mixtral/train_mixtral_8x7b_distributed.sh (docs/moe.md).
#
#   bash examples/mixtral/train_mixtral_8x7b.sh [CHECKPOINT_PATH] [TOKENIZER_MODEL] [DATA_PATH]
#
# TOKENIZER_MODEL / DATA_PATH default to MOCK (NullTokenizer + mock data). megatron.cpp extras
# (environment):
#   NPROC_PER_NODE   processes to start (default: number of GPUs, 1 without GPUs)
#   LAUNCHER         torchrun-style launcher for NPROC_PER_NODE > 1 (default build/bin/megatron_launch)
#   PRETRAIN_GPT     the pretrain_gpt binary (default build/bin/pretrain_gpt)
#   SCALE_DOWN=1     a CPU-sized run of the same flags: tiny NUM_LAYERS, HIDDEN_SIZE, FFN_HIDDEN_SIZE,
#                    NUM_ATTENTION_HEADS, NUM_QUERY_GROUPS, SEQ_LENGTH, GLOBAL_BATCH_SIZE, TRAIN_ITERS,
#                    and PP = EP = 1 (one process)
#   PP, EP           --pipeline-model-parallel-size / --expert-model-parallel-size (Megatron's 4 / 8).
#                    pretrain_gpt does not train with EP > 1 yet (expert-data-parallel gradient
#                    reduction, docs/moe.md): use EP=1 until then.
#   EXTRA_ARGS       appended to pretrain_gpt's flags
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$SCRIPT_DIR/../.." && pwd)"

export CUDA_DEVICE_MAX_CONNECTIONS=1

CHECKPOINT_PATH=${1:-"checkpoints/mixtral_8x7b"}
TOKENIZER_MODEL=${2:-"MOCK"}
DATA_PATH=${3:-"MOCK"}

if command -v nvidia-smi >/dev/null 2>&1; then
  GPUS_PER_NODE=${NPROC_PER_NODE:-$(nvidia-smi -L | wc -l)}
else
  GPUS_PER_NODE=${NPROC_PER_NODE:-1}
fi
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
MASTER_PORT=${MASTER_PORT:-"29500"}

if [[ "${SCALE_DOWN:-0}" == "1" ]]; then
  NUM_LAYERS=${NUM_LAYERS:-2}; HIDDEN_SIZE=${HIDDEN_SIZE:-64}; FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-96}
  NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-4}; NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-2}
  SEQ_LENGTH=${SEQ_LENGTH:-64}; MAX_POSITION_EMBEDDINGS=${MAX_POSITION_EMBEDDINGS:-64}
  GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-4}; TRAIN_ITERS=${TRAIN_ITERS:-6}; LR_DECAY_ITERS=${LR_DECAY_ITERS:-6}
  LR_WARMUP_ITERS=${LR_WARMUP_ITERS:-2}; EVAL_INTERVAL=${EVAL_INTERVAL:-3}; EVAL_ITERS=${EVAL_ITERS:-1}
  SAVE_INTERVAL=${SAVE_INTERVAL:-6}; PP=${PP:-1}; EP=${EP:-1}
else
  NUM_LAYERS=${NUM_LAYERS:-32}; HIDDEN_SIZE=${HIDDEN_SIZE:-4096}; FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-14336}
  NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-32}; NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-8}
  SEQ_LENGTH=${SEQ_LENGTH:-4096}; MAX_POSITION_EMBEDDINGS=${MAX_POSITION_EMBEDDINGS:-32768}
  GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-256}; TRAIN_ITERS=${TRAIN_ITERS:-500000}; LR_DECAY_ITERS=${LR_DECAY_ITERS:-320000}
  LR_WARMUP_ITERS=${LR_WARMUP_ITERS:-500}; EVAL_INTERVAL=${EVAL_INTERVAL:-1000}; EVAL_ITERS=${EVAL_ITERS:-10}
  SAVE_INTERVAL=${SAVE_INTERVAL:-10000}; PP=${PP:-4}; EP=${EP:-8}
fi

MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $MAX_POSITION_EMBEDDINGS
    --num-layers $NUM_LAYERS
    --hidden-size $HIDDEN_SIZE
    --ffn-hidden-size $FFN_HIDDEN_SIZE
    --num-attention-heads $NUM_ATTENTION_HEADS
    --init-method-std 0.01
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --normalization RMSNorm
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention
    --num-query-groups $NUM_QUERY_GROUPS
    --no-masked-softmax-fusion
    --rotary-base 1000000
)

MOE_ARGS=(
    --num-experts 8
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --overlap-param-gather
    --overlap-grad-reduce
)

if [[ "$TOKENIZER_MODEL" == "MOCK" || "$DATA_PATH" == "MOCK" ]]; then
  DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --split 99990,8,2)
else
  DATA_ARGS=(--tokenizer-type Llama2Tokenizer --tokenizer-model "$TOKENIZER_MODEL" --data-path "$DATA_PATH"
             --split 99990,8,2)
fi

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size $GLOBAL_BATCH_SIZE
    --lr 1e-4
    --train-iters $TRAIN_ITERS
    --lr-decay-iters $LR_DECAY_ITERS
    --lr-decay-style cosine
    --min-lr 1.0e-5
    --weight-decay 0.1
    --lr-warmup-iters $LR_WARMUP_ITERS
    --clip-grad 1.0
    --bf16
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size $PP
    --expert-model-parallel-size $EP
    --use-distributed-optimizer
    --sequence-parallel
)

LOGGING_ARGS=(
    --log-interval 1
    --save-interval $SAVE_INTERVAL
    --eval-interval $EVAL_INTERVAL
    --eval-iters $EVAL_ITERS
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --tensorboard-dir "${CHECKPOINT_PATH}/tensorboard"
    --no-load-optim
    --no-load-rng
)

PRETRAIN_GPT=${PRETRAIN_GPT:-"$ROOT/build/bin/pretrain_gpt"}
ARGS=("${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${DATA_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}"
      "${LOGGING_ARGS[@]}")
# shellcheck disable=SC2206
ARGS+=(${EXTRA_ARGS:-})
if [[ "$GPUS_PER_NODE" -gt 1 || "$NNODES" -gt 1 ]]; then
  LAUNCHER=${LAUNCHER:-"$ROOT/build/bin/megatron_launch"}
  exec "$LAUNCHER" --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$PRETRAIN_GPT" "${ARGS[@]}"
fi
exec "$PRETRAIN_GPT" "${ARGS[@]}"
