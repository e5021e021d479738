#!/usr/bin/env bash
# Full activation recomputation (--recompute-granularity full --recompute-method uniform|block
# --recompute-num-layers N) must not change training: a 4-layer GPT on mock data with dropout on
# (the recomputed forward must replay the same dropout masks) and 2 micro-batches per step, trained
# 3 iterations with and without recomputation. On the CPU in fp32 the per-iteration lm loss and grad
# norm lines and the trained parameters (MEGATRON_DUMP_PARAMS) must be BITWISE equal: recomputation
# replays exactly the same kernels on the same inputs in the same order (the CPU kernels are
# deterministic), only later, so every gradient is the same float. Covered: single process (uniform
# 1, uniform 3 = a 3-layer chunk plus a 1-layer chunk, block 1, block 4), bf16, FP8 hybrid (CPU
# emulation: the replay records no amax and reuses the weight cast), selective (accepted, no change;
# also with --recompute-modules core_attn), and under mpirun: TP2 + sequence parallel, PP2 with two
# virtual stages (block counts per model chunk), DP2 with --overlap-grad-reduce (the grad-ready
# hooks of recomputed layers still fire), a LLaMA-flavoured CP2 run. Also the argument checks of
# Megatron's validate_args.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
ARGS=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.1 --hidden-dropout 0.1 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --log-interval 1 --eval-interval 2 --eval-iters 1 --distributed-backend nccl)
UNIFORM1=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)

source "$SRC/tests/functional_tests/recompute_common.inc"  # run, values, same

# ---- single process -------------------------------------------------------------------------
run ref env --
run uniform1 env -- "${UNIFORM1[@]}"
grep -q 'recompute_granularity \.* full' "$LOGDIR/uniform1.log" || fail "uniform1: arguments table lacks recompute_granularity full"
if grep -q 'recompute.*not implemented' "$LOGDIR/uniform1.log"; then fail "uniform1: 'not implemented' note printed"; fi
same ref uniform1
run uniform3 env -- --recompute-granularity full --recompute-method uniform --recompute-num-layers 3
same ref uniform3
run block1 env -- --recompute-granularity full --recompute-method block --recompute-num-layers 1
same ref block1
run block4 env -- --recompute-granularity full --recompute-method block --recompute-num-layers 4
same ref block4
run selective env -- --recompute-activations
grep -q 'note: --recompute-activations is accepted' "$LOGDIR/selective.log" || fail "selective: no note"
grep -q 'recompute_granularity \.* selective' "$LOGDIR/selective.log" || fail "selective: granularity not set"
same ref selective
run selective_core_attn env -- --recompute-granularity selective --recompute-modules core_attn
grep -q 'recompute_modules \.* \[.core_attn.\]' "$LOGDIR/selective_core_attn.log" || fail "selective_core_attn: arguments table lacks recompute_modules"
same ref selective_core_attn
run bf16_ref env -- --bf16
run bf16_uniform1 env -- --bf16 "${UNIFORM1[@]}"
same bf16_ref bf16_uniform1
run fp8_ref env -- --fp8-format hybrid
run fp8_uniform1 env -- --fp8-format hybrid "${UNIFORM1[@]}"
same fp8_ref fp8_uniform1

# ---- Megatron's argument checks ---------------------------------------------------------------
bad 'needs --recompute-method' --recompute-granularity full --recompute-num-layers 1
bad 'needs --recompute-num-layers' --recompute-granularity full --recompute-method block
bad 'argument --recompute-num-layers: invalid value 0' --recompute-granularity full --recompute-method uniform --recompute-num-layers 0
bad 'not yet supported for selective' --recompute-granularity selective --recompute-method uniform
bad 'invalid choice' --recompute-granularity half
bad 'invalid choice' --recompute-granularity full --recompute-method every --recompute-num-layers 1
# --recompute-modules: Megatron's choices and moe_act rule; core_attn, moe, moe_act and
# shared_experts are implemented (the MoE ones and their refusals: pretrain_gpt_moe_recompute.sh).
bad 'Invalid choices for recompute_modules: attn' --recompute-granularity selective --recompute-modules attn
bad 'moe_act in recompute_modules is only supported with moe_grouped_gemm' --recompute-granularity selective \
  --recompute-modules core_attn moe_act
bad 'recompute-modules mlp is not implemented' --recompute-granularity selective --recompute-modules mlp
bad 'recompute-modules layernorm is not implemented' --recompute-granularity selective \
  --recompute-modules layernorm
bad 'Do not set --moe-layer-recompute with full recompute granularity' --moe-layer-recompute "${UNIFORM1[@]}"
bad 'recompute-modules mlp is not implemented' --moe-layer-recompute --recompute-modules mlp  # = selective
echo "PASS argument checks"

# ---- under mpirun -----------------------------------------------------------------------------
run tp2sp "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel
run tp2sp_uniform1 "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel "${UNIFORM1[@]}"
same tp2sp tp2sp_uniform1
PP=(--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1)
run pp2vp "${MPIRUN[@]}" -np 2 -- "${PP[@]}"
run pp2vp_block1 "${MPIRUN[@]}" -np 2 -- "${PP[@]}" --recompute-granularity full --recompute-method block \
  --recompute-num-layers 1
same pp2vp pp2vp_block1
DP=(--overlap-grad-reduce --overlap-param-gather --use-distributed-optimizer --ddp-bucket-size 2000)
run dp2 "${MPIRUN[@]}" -np 2 -- "${DP[@]}"
run dp2_uniform1 "${MPIRUN[@]}" -np 2 -- "${DP[@]}" "${UNIFORM1[@]}"
same dp2 dp2_uniform1
# LLaMA flavour (RoPE, RMSNorm, SwiGLU, GQA, untied) with context parallelism: the replayed
# attention runs the CP ring exchange again.
LLAMA=(--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
  --group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights)
run llama_cp2 "${MPIRUN[@]}" -np 2 -- "${LLAMA[@]}" --context-parallel-size 2
run llama_cp2_uniform1 "${MPIRUN[@]}" -np 2 -- "${LLAMA[@]}" --context-parallel-size 2 "${UNIFORM1[@]}"
same llama_cp2 llama_cp2_uniform1
echo "PASS all"
