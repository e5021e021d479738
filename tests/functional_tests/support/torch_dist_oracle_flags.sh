# Sourced by tests/gpu/torch_dist_oracle.sh and the functional tests of the Megatron-LM torch_dist
# fixtures it wrote (tests/reference/torch_dist): the tiny models' flags, the same for Megatron-LM
# and megatron.cpp (fp32, dropout 0, constant LR, mock data). TD_MODEL: the model and training
# flags; TD_LLAMA: LLaMA's on top of them; TD_BF16 and TD_MOE: the flags of the oracle's bf16 and
# MoE legs (the MoE model as Megatron's local spec builds it: SequentialMLP, no linear biases).
# shellcheck shell=bash disable=SC2034
TD_MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
          --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --min-lr 1e-3 --lr-decay-style constant
          --weight-decay 0.01 --clip-grad 1.0 --seed 1234 --init-method-std 0.02
          --attention-dropout 0 --hidden-dropout 0 --mock-data --tokenizer-type NullTokenizer --vocab-size 127
          --make-vocab-size-divisible-by 64 --log-interval 1 --eval-interval 1000 --eval-iters 0
          --no-bias-gelu-fusion)
TD_LLAMA=(--swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
          --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2)
TD_BF16=(--bf16)
TD_MOE=(--num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2
        --disable-bias-linear --moe-ffn-hidden-size 64)
