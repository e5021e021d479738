#!/usr/bin/env bash
# flag_sweep.sh BIN_DIR [FILTER]: runs a tiny CPU GPT (mock data, 2 iterations) with one or two odd flags
# at a time and sorts each run into
#   INTERNAL  the output has "internal error" (a MEGATRON_CHECK reached from flags: a bug, see
#             docs/architecture.md "Errors and output files": flags get one clear user error line)
#   CRASH     killed by a signal (exit > 128) without a line
#   USER      non-zero exit with an "error:" line (the line is printed)
#   OK        trained (exit 0)
# Exit status 1 if any case is INTERNAL or CRASH. FILTER (a grep -E regex) runs only matching cases.
# JOBS=n runs n cases at a time (default 1: an np2 case is two processes; JOBS=2 takes about 15 minutes on 2 cores).
# INPUTS=0 leaves out the damaged-input-file cases (tokenizer.json, checkpoint files; see below).
# CASES_FROM=file reads the case lines from that file instead of the list below (same format).
# Cases marked "np2" run under mpirun -np 2 (skipped when mpirun is missing).
set -uo pipefail
BIN=${1:?usage: flag_sweep.sh BIN_DIR [FILTER]}
BIN=$(cd "$BIN" && pwd)
FILTER=${2:-}
JOBS=${JOBS:-1}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
TMP=$(mktemp -d /tmp/flag_sweep.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

BASE="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
 --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr 1e-3 --mock-data --eval-iters 0
 --tokenizer-type NullTokenizer --vocab-size 128 --attention-dropout 0 --hidden-dropout 0"
MOE="--num-experts 4 --moe-router-topk 2 --disable-bias-linear"
LLAMA="--swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear"
LLAMA+=" --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2"

# One case a line: flags appended to BASE ($MOE / $LLAMA expand). "np2 " first: two ranks.
CASES=$(cat <<EOF
--num-attention-heads 3
--num-attention-heads 3 --kv-channels 16
--num-attention-heads 4 --kv-channels 7
--kv-channels 7 --position-embedding-type rope
--kv-channels 0
--kv-channels -4
--hidden-size 6 --num-attention-heads 2
--group-query-attention --num-query-groups 3
--group-query-attention --num-query-groups 0
--group-query-attention --num-query-groups 8
--num-query-groups 2
--seq-length 64
--seq-length 64 --position-embedding-type rope
--seq-length 1
--seq-length 0
--max-position-embeddings 0 --seq-length 0
--ffn-hidden-size 0
--ffn-hidden-size -8
--ffn-hidden-size 3
--num-layers 0
--hidden-size 0
--num-attention-heads 0
--vocab-size 0
--vocab-size 1
--make-vocab-size-divisible-by 0
--micro-batch-size 0
--rotary-percent 0.3 --position-embedding-type rope
--rotary-percent 0 --position-embedding-type rope
--rotary-percent 1.5 --position-embedding-type rope
--rotary-percent 0.5 --position-embedding-type rope --kv-channels 12
--rotary-base 0 --position-embedding-type rope
--rotary-interleaved --position-embedding-type rope
--position-embedding-type none
--position-embedding-type relative
--position-embedding-type mrope
--position-embedding-type yarn
--use-rope-scaling --position-embedding-type rope
--normalization LayerNorm --apply-layernorm-1p
--normalization RMSNorm --apply-layernorm-1p
--normalization Foo
--norm-epsilon 0
--swiglu
--swiglu --ffn-hidden-size 3
--squared-relu --disable-bias-linear
--squared-relu
--quick-geglu
--geglu
--untie-embeddings-and-output-weights
--disable-bias-linear
--add-qkv-bias --disable-bias-linear
--qk-layernorm
--qk-layernorm --normalization RMSNorm
--apply-query-key-layer-scaling
--attention-softmax-in-fp32
--fp16
--bf16
--fp16 --bf16
--fp16 --loss-scale 0
--fp8-format hybrid
--fp8-format e4m3
--fp8-format hybrid --fp16
--fp8-format hybrid --bf16
--fp8-format hybrid --bf16 --fp8-recipe tensorwise
--fp8-format hybrid --bf16 --fp8-recipe blockwise
--fp8-format hybrid --bf16 --fp8-recipe mxfp8
--fp8-format hybrid --bf16 --hidden-size 40 --num-attention-heads 4
--fp8-format hybrid --bf16 --fp8-recipe blockwise --hidden-size 40 --num-attention-heads 4
--fp8-format hybrid --bf16 --fp8-output-proj
--fp8-format hybrid --bf16 --fp8-output-proj --vocab-size 100 --make-vocab-size-divisible-by 1
--fp8-format hybrid --bf16 $MOE
--fp8-format hybrid --bf16 --fp8-recipe blockwise $MOE
--fp8-margin -1 --fp8-format hybrid --bf16
--fp8-amax-compute-algo foo --fp8-format hybrid --bf16
--recompute-granularity full
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1
--recompute-granularity full --recompute-method block --recompute-num-layers 3
--recompute-granularity full --recompute-method uniform --recompute-num-layers 3
--recompute-granularity full --recompute-method uniform --recompute-num-layers 2
--recompute-granularity selective
--recompute-granularity selective --recompute-modules mlp
--recompute-granularity selective --recompute-modules moe $MOE
--recompute-granularity selective --recompute-modules moe
--recompute-granularity selective --recompute-modules shared_experts
--recompute-activations
--distribute-saved-activations
--distribute-saved-activations --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
--moe-ffn-hidden-size 32
--moe-router-topk 2
--moe-shared-expert-intermediate-size 32
$MOE
$MOE --swiglu
$MOE --moe-ffn-hidden-size 0
$MOE --moe-ffn-hidden-size 3 --swiglu
$MOE --moe-router-topk 0
$MOE --moe-router-topk 5
$MOE --moe-grouped-gemm
$MOE --moe-grouped-gemm --swiglu
$MOE --moe-shared-expert-intermediate-size 32
$MOE --moe-shared-expert-intermediate-size 0
$MOE --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate
$MOE --moe-router-score-function sigmoid
$MOE --moe-router-score-function sigmoid --moe-router-enable-expert-bias
$MOE --moe-router-pre-softmax
$MOE --moe-router-num-groups 2 --moe-router-group-topk 1
$MOE --moe-router-num-groups 3 --moe-router-group-topk 1
$MOE --moe-router-num-groups 2 --moe-router-group-topk 3
$MOE --moe-router-num-groups 2
$MOE --moe-router-topk-scaling-factor 2
$MOE --moe-router-load-balancing-type seq_aux_loss
$MOE --moe-router-load-balancing-type none
$MOE --moe-router-load-balancing-type sinkhorn
$MOE --moe-router-load-balancing-type foo
$MOE --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001
$MOE --moe-expert-capacity-factor 1.0
$MOE --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity
$MOE --moe-expert-capacity-factor 1.0 --moe-token-drop-policy position
$MOE --moe-token-dispatcher-type alltoall
$MOE --moe-token-dispatcher-type allgather
$MOE --moe-token-dispatcher-type foo
$MOE --moe-layer-freq 2
$MOE --moe-layer-freq 3
$MOE --moe-layer-freq 0
$MOE --moe-layer-freq [1,0]
$MOE --moe-router-dtype fp32
$MOE --moe-router-dtype fp64
$MOE --moe-permute-fusion
$MOE --moe-router-fusion
$MOE --moe-input-jitter-eps 0.1
$MOE --num-experts 1 --moe-router-topk 1
$MOE --mtp-num-layers 1 --position-embedding-type rope
$MOE --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
$MOE --moe-layer-recompute
$MOE --qk-layernorm
$MOE $LLAMA
$LLAMA
$LLAMA --num-query-groups 3
$LLAMA --mtp-num-layers 1
$LLAMA --mtp-num-layers 2
$LLAMA --mtp-num-layers 1 --mtp-loss-scaling-factor 0
--mtp-num-layers 1
--mtp-num-layers 1 --position-embedding-type rope
--mtp-num-layers 1 --position-embedding-type none
--mtp-num-layers 0
--mtp-num-layers -1
--mtp-num-layers 1 --position-embedding-type rope --seq-length 31 --max-position-embeddings 32
--mtp-num-layers 1 --position-embedding-type rope --untie-embeddings-and-output-weights
--mtp-num-layers 1 --position-embedding-type rope --fp8-format hybrid --bf16
--mtp-num-layers 1 --position-embedding-type rope --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
--seq-length 31 --max-position-embeddings 32
--micro-batch-size 1 --global-batch-size 1
--init-method-std 0
--clip-grad 0
--clip-grad -1
--weight-decay -1
--adam-beta1 1.5
--adam-eps 0
--optimizer sgd
--optimizer sgd --sgd-momentum 0
--optimizer foo
--use-distributed-optimizer
--overlap-grad-reduce
--overlap-grad-reduce --use-distributed-optimizer --overlap-param-gather
--sequence-parallel
--tensor-model-parallel-size 2
--pipeline-model-parallel-size 2
--context-parallel-size 2
--expert-model-parallel-size 2 $MOE
--decoder-first-pipeline-num-layers 1
--decoder-last-pipeline-num-layers 1
--account-for-embedding-in-pipeline-split
--account-for-loss-in-pipeline-split
--lr-warmup-iters 5 --train-iters 2
--lr-warmup-fraction 2
--lr-decay-iters 0
--lr-decay-style WSD --lr-wsd-decay-iters 1
--lr-decay-style inverse-square-root
--lr-decay-style inverse-square-root --lr-warmup-iters 0
--lr-decay-style cosine --lr-decay-iters 1
--train-iters 0
--eval-iters 2 --eval-interval 1
--eval-iters 2 --eval-interval 1 --skip-train
--skip-train
--log-interval 1 --log-params-norm --log-num-zeros-in-grad
--log-throughput
--seed -1
--hidden-dropout 1.0
--attention-dropout 1.0
--hidden-dropout 1.5
--transformer-impl local
--transformer-impl transformer_engine
--attention-backend flash
--attention-backend foo
--no-masked-softmax-fusion
--no-position-embedding
--tokenizer-type GPT2BPETokenizer
--tokenizer-type HuggingFaceTokenizer
--split 1,0,0
--data-path /nonexistent
--num-workers 0
--no-create-attention-mask-in-dataloader
--reset-position-ids --reset-attention-mask --eod-mask-loss
--calculate-per-token-loss
--deterministic-mode
--cross-entropy-loss-fusion
--cross-entropy-fusion-impl te
--check-for-nan-in-loss-and-grad
--exit-interval 1
--exit-duration-in-mins 0
--save $TMP/ckpt --save-interval 0
--load /nonexistent
--load /nonexistent --finetune
--pretrained-checkpoint /nonexistent
--ckpt-format torch
--ckpt-format zarr
--num-layers 3 --pipeline-model-parallel-size 1 --decoder-first-pipeline-num-layers 1
np2 --tensor-model-parallel-size 2
np2 --tensor-model-parallel-size 2 --sequence-parallel
np2 --tensor-model-parallel-size 2 --num-attention-heads 2 --group-query-attention --num-query-groups 1
np2 --tensor-model-parallel-size 2 --vocab-size 127 --make-vocab-size-divisible-by 1
np2 --tensor-model-parallel-size 2 --ffn-hidden-size 66
np2 --tensor-model-parallel-size 2 --swiglu --ffn-hidden-size 66
np2 --tensor-model-parallel-size 2 $MOE
np2 --tensor-model-parallel-size 2 $MOE --sequence-parallel
np2 --tensor-model-parallel-size 2 --num-attention-heads 8 --hidden-size 64 --kv-channels 12
np2 --pipeline-model-parallel-size 2
np2 --pipeline-model-parallel-size 2 --num-layers 3
np2 --pipeline-model-parallel-size 2 --num-layers 3 --decoder-first-pipeline-num-layers 1
np2 --pipeline-model-parallel-size 2 --num-layers 3 --decoder-first-pipeline-num-layers 3
np2 --pipeline-model-parallel-size 2 --num-layers 2 --decoder-first-pipeline-num-layers 2
np2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
np2 --pipeline-model-parallel-size 2 --mtp-num-layers 1 --position-embedding-type rope
np2 --pipeline-model-parallel-size 2 --global-batch-size 2 --micro-batch-size 2
np2 --pipeline-model-parallel-size 2 --untie-embeddings-and-output-weights
np2 --pipeline-model-parallel-size 2 $MOE
np2 --context-parallel-size 2
np2 --context-parallel-size 2 --seq-length 30
np2 --context-parallel-size 2 --mtp-num-layers 1 --position-embedding-type rope
np2 --context-parallel-size 2 --cp-comm-type a2a
np2 --context-parallel-size 2 --cp-comm-type allgather
np2 --context-parallel-size 2 --cp-comm-type a2a+p2p
np2 --context-parallel-size 2 --cp-comm-type a2a --num-attention-heads 2 --group-query-attention --num-query-groups 1
np2 --context-parallel-size 2 --cp-comm-type a2a --num-attention-heads 3 --kv-channels 16
np2 --context-parallel-size 2 $MOE
np2 --context-parallel-size 2 --reset-attention-mask
np2 --expert-model-parallel-size 2 $MOE
np2 --expert-model-parallel-size 2 $MOE --num-experts 2 --moe-router-topk 1
np2 --expert-model-parallel-size 2 $MOE --moe-token-dispatcher-type alltoall
np2 --expert-model-parallel-size 2 $MOE --moe-expert-capacity-factor 1.0
np2 --use-distributed-optimizer --overlap-param-gather --overlap-grad-reduce
np2 --use-distributed-optimizer --fp8-format hybrid --bf16 --fp8-param-gather
np2 --global-batch-size 6
--fp8-format hybrid --bf16 --seq-length 31 --micro-batch-size 1 --global-batch-size 2
--fp8-format hybrid --bf16 --fp8-recipe blockwise --seq-length 31 --micro-batch-size 1 --global-batch-size 2
--fp8-format hybrid --bf16 --fp8-recipe tensorwise --seq-length 31 --micro-batch-size 1 --global-batch-size 2
--fp8-format hybrid --bf16 --hidden-size 24 --num-attention-heads 4
--fp8-format hybrid --bf16 --fp8-recipe blockwise --hidden-size 24 --num-attention-heads 4
--fp8-format hybrid --bf16 --ffn-hidden-size 40
--fp8-format hybrid --bf16 --fp8-recipe blockwise --ffn-hidden-size 40
--fp8-format hybrid --bf16 --fp8-output-proj --vocab-size 100 --make-vocab-size-divisible-by 1 --fp8-recipe blockwise
--fp8-format hybrid --bf16 --fp8-output-proj --fp16
--fp8-format hybrid --fp16 --fp8-output-proj
--fp8-format hybrid --bf16 $MOE --moe-ffn-hidden-size 40
--fp8-format hybrid --bf16 $MOE --moe-ffn-hidden-size 40 --fp8-recipe blockwise
--fp8-format hybrid --bf16 $MOE --moe-grouped-gemm --fp8-recipe tensorwise
--fp8-format hybrid --bf16 $MOE --moe-shared-expert-intermediate-size 40
--fp8-format hybrid --bf16 --mtp-num-layers 1 --position-embedding-type rope --fp8-recipe blockwise
--fp8-format hybrid --bf16 --recompute-granularity selective --recompute-modules moe $MOE
--fp8-format hybrid --bf16 --swiglu --ffn-hidden-size 40
--fp8-format hybrid --bf16 --kv-channels 8
--fp8-format hybrid --bf16 --fp8-param-gather --use-distributed-optimizer
--fp8-format hybrid --bf16 --fp8-param-gather --use-distributed-optimizer --fp8-recipe blockwise
--fp16 $MOE
--fp16 --mtp-num-layers 1 --position-embedding-type rope
--fp16 --fp16-lm-cross-entropy
--bf16 --grad-reduce-in-bf16
--bf16 --fp32-residual-connection
--ddp-bucket-size 1
--use-distributed-optimizer --optimizer sgd
--use-distributed-optimizer --fp16
--position-embedding-type rope --hidden-size 6 --num-attention-heads 2
--position-embedding-type rope --rotary-percent 0.25 --kv-channels 4
--position-embedding-type rope --rotary-percent 0.1
--seq-length 2 --max-position-embeddings 2
--seq-length 2 --max-position-embeddings 2 --mtp-num-layers 1 --position-embedding-type rope
--seq-length 2 --max-position-embeddings 2 $MOE --moe-expert-capacity-factor 0.1
$MOE --moe-expert-capacity-factor 0.01
$MOE --moe-expert-capacity-factor 0.01 --moe-pad-expert-input-to-capacity
$MOE --moe-expert-capacity-factor 0.01 --moe-token-dispatcher-type alltoall
$MOE --eval-iters 1 --eval-interval 1
$MOE --skip-train --eval-iters 1
--mtp-num-layers 1 --position-embedding-type rope --eval-iters 1 --eval-interval 1
--mtp-num-layers 1 --position-embedding-type rope --qk-layernorm --untie-embeddings-and-output-weights
--mtp-num-layers 3 --position-embedding-type rope --num-layers 1
--num-layers 1 --recompute-granularity full --recompute-method block --recompute-num-layers 1
--rampup-batch-size 2 2 8
--rampup-batch-size 2 2 8 --train-samples 32 --train-iters 0
--micro-batch-size 3 --global-batch-size 3
--micro-batch-size 4 --global-batch-size 2
--exit-interval 1 --save $TMP/ckpt_e --save-interval 5
--lr 0
--lr 1e-3 --min-lr 1e-2
--clip-grad 0 --log-num-zeros-in-grad
--apply-residual-connection-post-layernorm
--normalization RMSNorm --qk-layernorm --apply-layernorm-1p
--num-attention-heads 1 --group-query-attention --num-query-groups 1
--num-attention-heads 64 --hidden-size 64
--hidden-size 64 --num-attention-heads 4 --kv-channels 1
--vocab-size 2 --make-vocab-size-divisible-by 1
--vocab-size 1 --make-vocab-size-divisible-by 1
--tokenizer-type NullTokenizer --vocab-size 100000
--no-async-tensor-model-parallel-allreduce
--hidden-size 65 --num-attention-heads 5
--hidden-size 65 --num-attention-heads 5 --fp8-format hybrid --bf16
np2 --tensor-model-parallel-size 2 --ffn-hidden-size 65 --sequence-parallel
np2 --tensor-model-parallel-size 2 --swiglu --ffn-hidden-size 65 --sequence-parallel
np2 --tensor-model-parallel-size 2 --seq-length 31 --sequence-parallel
np2 --tensor-model-parallel-size 2 --seq-length 31 --sequence-parallel $MOE
np2 --tensor-model-parallel-size 2 --sequence-parallel $MOE --moe-ffn-hidden-size 65
np2 --tensor-model-parallel-size 2 --sequence-parallel $MOE --moe-shared-expert-intermediate-size 65
np2 --tensor-model-parallel-size 2 --sequence-parallel $MOE --expert-tensor-parallel-size 1
np2 --tensor-model-parallel-size 2 --sequence-parallel $MOE --expert-tensor-parallel-size 1 --expert-model-parallel-size 2
np2 --tensor-model-parallel-size 2 --vocab-size 127 --make-vocab-size-divisible-by 1 --fp8-format hybrid --bf16 --fp8-output-proj
np2 --tensor-model-parallel-size 2 --fp8-format hybrid --bf16 --sequence-parallel
np2 --tensor-model-parallel-size 2 --fp8-format hybrid --bf16 --fp8-recipe blockwise --sequence-parallel
np2 --tensor-model-parallel-size 2 --kv-channels 7 --num-attention-heads 2
np2 --tensor-model-parallel-size 2 --mtp-num-layers 1 --position-embedding-type rope --sequence-parallel
np2 --tensor-model-parallel-size 2 --make-vocab-size-divisible-by 3
np2 --tensor-model-parallel-size 2 --hidden-size 65 --num-attention-heads 5 --kv-channels 16
np2 --pipeline-model-parallel-size 2 $MOE --moe-layer-freq [1,0]
np2 --pipeline-model-parallel-size 2 $MOE --moe-layer-freq [0,1]
np2 --pipeline-model-parallel-size 2 --fp8-format hybrid --bf16
np2 --pipeline-model-parallel-size 2 --mtp-num-layers 1 --position-embedding-type rope --untie-embeddings-and-output-weights
np2 --pipeline-model-parallel-size 2 --num-layers 4 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 2 --micro-batch-size 1
np2 --pipeline-model-parallel-size 2 --num-layers 4 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 3 --micro-batch-size 1
np2 --pipeline-model-parallel-size 2 --num-layers 4 --num-layers-per-virtual-pipeline-stage 1 --mtp-num-layers 1 --position-embedding-type rope
np2 --pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method block --recompute-num-layers 2
np2 --pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method uniform --recompute-num-layers 2
np2 --pipeline-model-parallel-size 2 --num-layers 2 --decoder-last-pipeline-num-layers 2
np2 --pipeline-model-parallel-size 2 --num-layers 4 --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1
np2 --pipeline-model-parallel-size 2 --num-layers 3 --decoder-first-pipeline-num-layers 1 --num-layers-per-virtual-pipeline-stage 1
np2 --pipeline-model-parallel-size 2 --eval-iters 1 --eval-interval 1
np2 --pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-param-gather --overlap-grad-reduce
np2 --pipeline-model-parallel-size 2 --fp16
np2 --context-parallel-size 2 --fp8-format hybrid --bf16
np2 --context-parallel-size 2 --fp8-format hybrid --bf16 --fp8-recipe blockwise
np2 --context-parallel-size 2 $MOE --moe-token-dispatcher-type alltoall
np2 --context-parallel-size 2 $MOE --moe-expert-capacity-factor 1.0
np2 --context-parallel-size 2 $MOE --moe-router-load-balancing-type seq_aux_loss
np2 --context-parallel-size 2 --seq-length 4 --max-position-embeddings 4
np2 --context-parallel-size 2 --seq-length 4 --max-position-embeddings 4 --mtp-num-layers 1 --position-embedding-type rope
np2 --context-parallel-size 2 --eval-iters 1 --eval-interval 1
np2 --context-parallel-size 2 --position-embedding-type rope --rotary-interleaved
np2 --context-parallel-size 2 --cp-comm-type a2a --mtp-num-layers 1 --position-embedding-type rope
np2 --context-parallel-size 2 --cp-comm-type p2p a2a
np2 --expert-model-parallel-size 2 $MOE --fp8-format hybrid --bf16
np2 --expert-model-parallel-size 2 $MOE --moe-router-load-balancing-type global_aux_loss
np2 --expert-model-parallel-size 2 $MOE --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity
np2 --expert-model-parallel-size 2 $MOE --moe-token-dispatcher-type alltoall --moe-expert-capacity-factor 0.01
np2 --expert-model-parallel-size 2 $MOE --moe-shared-expert-intermediate-size 32 --moe-shared-expert-overlap --moe-token-dispatcher-type alltoall
np2 --expert-model-parallel-size 2 $MOE --mtp-num-layers 1 --position-embedding-type rope
np2 --expert-model-parallel-size 2 $MOE --moe-router-num-groups 2 --moe-router-group-topk 1
np2 --expert-model-parallel-size 2 $MOE --use-distributed-optimizer
np2 --expert-model-parallel-size 2 $MOE --moe-grouped-gemm --recompute-granularity selective --recompute-modules moe_act
np2 --use-distributed-optimizer --optimizer sgd
np2 --overlap-grad-reduce
np2 --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 10
np2 --calculate-per-token-loss --use-distributed-optimizer
np2 --tensor-model-parallel-size 2 --sequence-parallel $MOE --moe-shared-expert-intermediate-size 65
np2 --tensor-model-parallel-size 2 --hidden-size 65 --num-attention-heads 2 --kv-channels 32 --mtp-num-layers 1 --position-embedding-type rope
np2 --tensor-model-parallel-size 2 --hidden-size 65 --num-attention-heads 2 --kv-channels 32
EOF
)

# Input files (INPUTS=0 skips them): damaged tokenizer.json / checkpoint metadata.json / common.json
# / .idx+.bin files, each made here under $TMP/in and passed with the flag that reads it.
if [[ ${INPUTS:-1} != 0 && -z ${CASES_FROM:-} ]]; then
  IN=$TMP/in; mkdir -p "$IN"
  for t in '{}' '[]' '{"model": []}' '{"model": {"type": 5}}' \
           '{"model": {"type": "BPE", "vocab": [], "merges": {}}, "pre_tokenizer": {"type": "ByteLevel"}}'; do
    d=$(mktemp -d "$IN/tok.XXXX"); printf '%s' "$t" > "$d/tokenizer.json"
    CASES+=$'\n'"--tokenizer-type HuggingFaceTokenizer --tokenizer-model $d"
  done
  # A real checkpoint of the base model, then copies with one file replaced.
  (cd "$TMP" && "$BIN/pretrain_gpt" $BASE --save "$IN/ck" --save-interval 2 --data-cache-path "$IN/cache") >/dev/null 2>&1 ||
    echo "flag_sweep: could not save the base checkpoint; the checkpoint cases will fail"
  n=0
  for spec in 'metadata.json:[]' 'metadata.json:{}' 'metadata.json:garbage' 'common.json:[]' \
              'common.json:{"args": 5}' 'latest:abc' 'latest:7'; do
    f=${spec%%:*} text=${spec#*:} n=$((n + 1)); d=$IN/ck$n; cp -r "$IN/ck" "$d"
    if [[ $f == latest ]]; then printf '%s\n' "$text" > "$d/latest_checkpointed_iteration.txt"
    else
      printf '%s' "$text" > "$d/iter_0000002/$f"
      # common.json without checksums (an older checkpoint's metadata.json) so that its fields are read.
      [[ $f == common.json ]] &&
        printf '%s' '{"sharded_backend":"megatron_cpp_safetensors","sharded_backend_version":1}' > "$d/iter_0000002/metadata.json"
    fi
    CASES+=$'\n'"--load $d --train-iters 4 --override-opt_param-scheduler"
  done
fi

[[ -n ${CASES_FROM:-} ]] && CASES=$(eval "cat <<EOF
$(cat "$CASES_FROM")
EOF")

run_case() {  # run_case INDEX CASE-LINE
  local i=$1 line=$2 launch=() extra
  if [[ $line == np2\ * ]]; then
    command -v mpirun >/dev/null || { echo "SKIP     | $line | no mpirun"; return; }
    launch=(mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS)
    line=${line#np2 }
  fi
  # shellcheck disable=SC2086  # word splitting of the flag lists is intended
  extra=($BASE $line)
  local log="$TMP/$i.log" rc
  (cd "$TMP" && timeout 120 "${launch[@]}" "$BIN/pretrain_gpt" "${extra[@]}" --data-cache-path "$TMP/cache$i") \
    >"$log" 2>&1
  rc=$?
  local tag=${launch:+np2 }
  if grep -qi "internal error" "$log"; then
    echo "INTERNAL | $tag$line | $(grep -i -m1 'internal error' "$log" | cut -c1-300)"
  elif [[ $rc -eq 124 ]]; then
    echo "TIMEOUT  | $tag$line | $(tail -1 "$log" | cut -c1-200)"
  elif [[ $rc -gt 128 ]] || grep -qE "Segmentation fault|Aborted|core dumped|signal [0-9]+|terminate called" "$log"; then
    echo "CRASH    | $tag$line | rc=$rc $(grep -m1 -E 'Segmentation|Aborted|signal|terminate' "$log" | cut -c1-200)"
  elif [[ $rc -ne 0 ]]; then
    local msg; msg=$(grep -m1 -E '(^|: )error' "$log" || tail -1 "$log")
    echo "USER     | $tag$line | $(cut -c1-300 <<<"$msg")"
  else
    echo "OK       | $tag$line |"
  fi
}
export -f run_case
export BASE BIN TMP

i=0
while IFS= read -r line; do
  [[ -z $line ]] && continue
  [[ -n $FILTER ]] && ! grep -qE -- "$FILTER" <<<"$line" && continue
  i=$((i + 1))
  printf '%s\0%s\0' "$i" "$line"
done <<<"$CASES" | xargs -0 -n2 -P "$JOBS" bash -c 'run_case "$0" "$1"' | tee "$TMP/summary"
bad=$(grep -cE '^(INTERNAL|CRASH)' "$TMP/summary")
echo "flag_sweep: $(wc -l <"$TMP/summary") cases, $bad internal errors or crashes"
[[ $bad -eq 0 ]]
