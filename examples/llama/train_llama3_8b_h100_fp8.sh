#!/usr/bin/env bash
# LLaMA-3 8B pretraining with Megatron-LM's flags: the same structure, positional arguments and
# flags as Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh (docs/training.md).
#
#   bash examples/llama/train_llama3_8b_h100_fp8.sh [CHECKPOINT_PATH] [TENSORBOARD_LOGS_PATH] \
#        [TOKENIZER_ARG] [DATA_ARG]
#
# TOKENIZER_ARG / DATA_ARG default to MOCK (NullTokenizer + mock data). DTYPE=fp8 (the default,
# as in Megatron's script: needs GPUs with FP8 tensor cores, compute capability 8.9+ such as
# H100; elsewhere the script stops and says to set DTYPE=bf16) or DTYPE=bf16.
# megatron.cpp extras (environment):
#   NPROC_PER_NODE   processes to start (default: number of GPUs, 1 without GPUs)
#   LAUNCHER         torchrun-style launcher for NPROC_PER_NODE > 1 (default build/bin/megatron_launch)
#   PRETRAIN_GPT     the pretrain_gpt binary (default build/bin/pretrain_gpt)
#   SCALE_DOWN=1     a CPU-sized run of the same flag list: the model/batch/length values below are
#                    replaced by NUM_LAYERS, HIDDEN_SIZE, FFN_HIDDEN_SIZE, NUM_ATTENTION_HEADS,
#                    NUM_QUERY_GROUPS, KV_CHANNELS, SEQ_LENGTH, MICRO_BATCH_SIZE,
#                    GLOBAL_BATCH_SIZE, TRAIN_SAMPLES, LR_DECAY_SAMPLES, LR_WARMUP_SAMPLES,
#                    EVAL_ITERS, EVAL_INTERVAL, SAVE_INTERVAL, PROFILE_STEP_START/END (tiny defaults)
#   EXTRA_ARGS       appended to pretrain_gpt's flags
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$SCRIPT_DIR/../.." && pwd)"

export CUDA_DEVICE_MAX_CONNECTIONS=1

CHECKPOINT_PATH=${1:-"checkpoints/llama3_8b_fp8"}
TENSORBOARD_LOGS_PATH=${2:-"tensorboard_logs/llama3_8b_fp8"}
TOKENIZER_ARG=${3:-"MOCK"}
DATA_ARG=${4:-"MOCK"}
DTYPE=${DTYPE:-"fp8"}
if [[ "$DTYPE" != "fp8" && "$DTYPE" != "bf16" ]]; then
  echo "error: DTYPE=$DTYPE: expected fp8 (the default) or bf16" >&2
  exit 1
fi
# FP8 GEMMs need FP8 tensor cores (Ada/Hopper, compute capability >= 8.9) on every GPU; without
# them (no GPU, or an older one) Transformer Engine refuses FP8 in Megatron: stop here, before
# anything is started, with what to do instead.
if [[ "$DTYPE" == "fp8" ]]; then
  caps=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' ' || true)
  fi
  if [[ -z "$caps" ]]; then
    echo "error: DTYPE=fp8 (the default) needs NVIDIA GPUs with FP8 support (compute capability 8.9 or newer, e.g. H100), and none was found (nvidia-smi); set DTYPE=bf16 to train in bf16" >&2
    exit 1
  fi
  while read -r cap; do
    if ! awk -v c="$cap" 'BEGIN { split(c, v, "."); exit !(v[1] > 8 || (v[1] == 8 && v[2] >= 9)) }'; then
      echo "error: DTYPE=fp8 (the default) needs FP8 tensor cores (compute capability 8.9 or newer, e.g. H100), but this GPU has compute capability $cap; set DTYPE=bf16 to train in bf16" >&2
      exit 1
    fi
  done <<< "$caps"
fi

mkdir -p "$(dirname "$CHECKPOINT_PATH")"
mkdir -p "$(dirname "$TENSORBOARD_LOGS_PATH")"

# Data cache path (useful for both mock and real data)
DATA_CACHE_PATH="${PWD}/benchmark_cache_llama3_8b_fp8"
mkdir -p "$DATA_CACHE_PATH"

if command -v nvidia-smi >/dev/null 2>&1; then
  GPUS_PER_NODE=${NPROC_PER_NODE:-$(nvidia-smi -L | wc -l)}
else
  GPUS_PER_NODE=${NPROC_PER_NODE:-1}
fi
NUM_NODES=${NUM_NODES:-1}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
NODE_RANK=${NODE_RANK:-0}

# Model and run sizes: Megatron's values, or a CPU-sized run of the same flags with SCALE_DOWN=1.
if [[ "${SCALE_DOWN:-0}" == "1" ]]; then
  NUM_LAYERS=${NUM_LAYERS:-2}; HIDDEN_SIZE=${HIDDEN_SIZE:-64}; FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-224}
  NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-4}; NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-2}; KV_CHANNELS=${KV_CHANNELS:-16}
  SEQ_LENGTH=${SEQ_LENGTH:-64}; MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}; GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-4}
  TRAIN_SAMPLES=${TRAIN_SAMPLES:-32}; LR_DECAY_SAMPLES=${LR_DECAY_SAMPLES:-28}; LR_WARMUP_SAMPLES=${LR_WARMUP_SAMPLES:-8}
  EVAL_ITERS=${EVAL_ITERS:-2}; EVAL_INTERVAL=${EVAL_INTERVAL:-4}; SAVE_INTERVAL=${SAVE_INTERVAL:-4}
  PROFILE_STEP_START=${PROFILE_STEP_START:-2}; PROFILE_STEP_END=${PROFILE_STEP_END:-3}
else
  NUM_LAYERS=32; HIDDEN_SIZE=4096; FFN_HIDDEN_SIZE=14336; NUM_ATTENTION_HEADS=32; NUM_QUERY_GROUPS=8
  KV_CHANNELS=128; SEQ_LENGTH=8192; MICRO_BATCH_SIZE=1; GLOBAL_BATCH_SIZE=128; TRAIN_SAMPLES=1953125000
  LR_DECAY_SAMPLES=1949218748; LR_WARMUP_SAMPLES=3906252; EVAL_ITERS=32; EVAL_INTERVAL=100; SAVE_INTERVAL=1000
  PROFILE_STEP_START=4; PROFILE_STEP_END=6
fi

DISTRIBUTED_ARGS=(
  --nproc_per_node "$GPUS_PER_NODE"
  --nnodes "$NUM_NODES"
  --node_rank "$NODE_RANK"
  --master_addr "$MASTER_ADDR"
  --master_port "$MASTER_PORT"
)

MODEL_ARGS=(
  --use-mcore-models
  --num-layers "$NUM_LAYERS"
  --hidden-size "$HIDDEN_SIZE"
  --ffn-hidden-size "$FFN_HIDDEN_SIZE"
  --num-attention-heads "$NUM_ATTENTION_HEADS"
  --group-query-attention
  --num-query-groups "$NUM_QUERY_GROUPS"
  --kv-channels "$KV_CHANNELS"
  --seq-length "$SEQ_LENGTH"
  --max-position-embeddings "$SEQ_LENGTH"
  --position-embedding-type rope
  --rotary-base 1000000
  --rotary-percent 1.0
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --swiglu
  --normalization RMSNorm
  --init-method-std 0.0134
  --attention-backend fused
  --apply-layernorm-1p
  --untie-embeddings-and-output-weights
  --disable-bias-linear
)

TRAINING_ARGS=(
  --micro-batch-size "$MICRO_BATCH_SIZE"
  --global-batch-size "$GLOBAL_BATCH_SIZE"
  --train-samples "$TRAIN_SAMPLES"
  --lr-decay-samples "$LR_DECAY_SAMPLES"
  --lr-warmup-samples "$LR_WARMUP_SAMPLES"
  --lr 0.00015
  --min-lr 0.00001
  --decoupled-lr 5.0e-4
  --decoupled-min-lr 4.5e-5
  --lr-decay-style cosine
  --clip-grad 1.0
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.95
  --bf16
  --grad-reduce-in-bf16
  --cross-entropy-loss-fusion
  --calculate-per-token-loss
  --manual-gc
  --empty-unused-memory-level 1
  --exit-duration-in-mins 235
)

DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
  DTYPE_ARGS+=(
    "--fp8-format hybrid"
    "--fp8-amax-history-len 1024"
    "--fp8-amax-compute-algo max"
    "--fp8-param-gather"
  )
fi

MODEL_PARALLEL_ARGS=(
  --tensor-model-parallel-size 1
  --context-parallel-size 1
  --sequence-parallel
)

DDP_ARGS=(
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
)
TRAINING_ARGS+=("${DDP_ARGS[@]}")

if [[ "$TOKENIZER_ARG" == "MOCK" ]] || [[ "$DATA_ARG" == "MOCK" ]] || [[ -z "$TOKENIZER_ARG" ]]; then
  DATA_ARGS_LIST=(
    "--mock-data"
    "--tokenizer-type NullTokenizer"
    "--vocab-size 128256"
    "--data-cache-path ${DATA_CACHE_PATH}"
    "--tiktoken-pattern v2"
    "--split '99,1,0'"
    "--no-create-attention-mask-in-dataloader"
    "--no-mmap-bin-files"
    "--num-workers 1"
  )
else
  DATA_ARGS_LIST=(
    "--data-path $DATA_ARG"
    "--tokenizer-type HuggingFaceTokenizer"
    "--tokenizer-model $TOKENIZER_ARG"
    "--data-cache-path ${DATA_CACHE_PATH}"
    "--split '99,1,0'"
    "--no-create-attention-mask-in-dataloader"
    "--no-mmap-bin-files"
    "--num-workers 1"
    "--vocab-size 128256"
  )
fi

EVAL_AND_LOGGING_ARGS=(
  --log-interval 1
  --eval-iters "$EVAL_ITERS"
  --eval-interval "$EVAL_INTERVAL"
  --save-interval "$SAVE_INTERVAL"
  --log-throughput
  --profile
  --profile-step-start "$PROFILE_STEP_START"
  --profile-step-end "$PROFILE_STEP_END"
  --ckpt-format torch_dist
  --distributed-timeout-minutes 60
  --save "$CHECKPOINT_PATH"
  --load "$CHECKPOINT_PATH"
  --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)

PRETRAIN_GPT=${PRETRAIN_GPT:-"$ROOT/build/bin/pretrain_gpt"}
LAUNCHER=${LAUNCHER:-"$ROOT/build/bin/megatron_launch"}
# The unquoted expansions of DTYPE_ARGS and DATA_ARGS_LIST are word-split exactly as in
# Megatron's script (so --split receives the literal '99,1,0', quotes included).
# shellcheck disable=SC2068
if [[ "$GPUS_PER_NODE" -gt 1 || "$NUM_NODES" -gt 1 ]]; then
  if [[ ! -x "$LAUNCHER" ]]; then
    echo "error: $LAUNCHER not found; multi-process runs need the launcher (or set NPROC_PER_NODE=1)" >&2
    exit 1
  fi
  exec "$LAUNCHER" "${DISTRIBUTED_ARGS[@]}" "$PRETRAIN_GPT" \
    "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" ${DTYPE_ARGS[@]} "${MODEL_PARALLEL_ARGS[@]}" \
    ${DATA_ARGS_LIST[@]} "${EVAL_AND_LOGGING_ARGS[@]}" ${EXTRA_ARGS:-}
else
  exec "$PRETRAIN_GPT" \
    "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" ${DTYPE_ARGS[@]} "${MODEL_PARALLEL_ARGS[@]}" \
    ${DATA_ARGS_LIST[@]} "${EVAL_AND_LOGGING_ARGS[@]}" ${EXTRA_ARGS:-}
fi
