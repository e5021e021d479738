# The 2-layer Mixtral-8x7B-shaped pretrain_gpt of the MoE GPU checks (tests/gpu/moerouter_check.sh,
# tests/gpu/moecap_check.sh; as bench/gpu/moe_bench.sh): 6 iterations of mock data, bf16, no dropout.
# Source it, then: mixtral2l_args CACHE_DIR  -> the array MIXTRAL.
mixtral2l_args() {
  MIXTRAL=(--num-layers 2 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention
    --num-query-groups 8 --kv-channels 128 --seq-length 4096 --max-position-embeddings 4096 --position-embedding-type rope
    --rotary-base 1000000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
    --vocab-size 32000 --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2 --micro-batch-size 1 --global-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5
    --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --mock-data --tokenizer-type NullTokenizer
    --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path "$1" --train-iters 6)
}
# mixtral2l_run_routers LOG_PREFIX TIMEOUT LABEL: pretrain_gpt "${MIXTRAL[@]}" with
# MEGATRON_MOE_DEVICE_ROUTER=0 (host router) and =1 (device router), logs LOG_PREFIX0.log and
# LOG_PREFIX1.log; a failed run prints "FAIL pretrain_gpt LABEL MEGATRON_MOE_DEVICE_ROUTER=r rc=N"
# and its log's tail and sets status=1. Needs BIN and MIXTRAL.
mixtral2l_run_routers() {
  local r rc
  for r in 0 1; do
    MEGATRON_MOE_DEVICE_ROUTER=$r timeout "$2" "$BIN/pretrain_gpt" "${MIXTRAL[@]}" > "$1$r.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || { echo "FAIL pretrain_gpt ${3:+$3 }MEGATRON_MOE_DEVICE_ROUTER=$r rc=$rc"; tail -5 "$1$r.log"; status=1; }
  done
}
