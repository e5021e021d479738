# The pretrain_gpt runs of tests/gpu/run_gpu_tests.sh (steps 2-4) and of the CPU reference logs in
# tests/gpu/fixtures/gpucheck/ (make_fixtures.sh): sourced by both, so that they use the same flags.
# Needs ITERS (training steps; 50) set before sourcing. run_args NAME TAG -> RUN_ARGS, where NAME =
# MODEL_PRECISION: gpt|llama _ fp32|bf16|fp8|fp16dyn|fp16static, TAG separates data caches.
GPT=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256)
LLAMA=(--num-layers 4 --hidden-size 256 --ffn-hidden-size 704 --num-attention-heads 4 --group-query-attention
  --num-query-groups 2 --seq-length 256 --max-position-embeddings 256 --position-embedding-type rope --swiglu
  --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear)
COMMON=(--micro-batch-size 4 --global-batch-size 8 --train-iters "$ITERS" --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine
  --lr-warmup-iters $(( ITERS > 5 ? 5 : 1 )) --clip-grad 1.0 --weight-decay 0.1 --seed 1234 --mock-data --tokenizer-type NullTokenizer
  --vocab-size 4095 --attention-dropout 0 --hidden-dropout 0 --log-interval 1 --eval-iters 0)
FP8=(--bf16 --fp8-format hybrid)
FP16DYN=(--fp16 --initial-loss-scale 4294967296 --loss-scale-window 8 --hysteresis 2 --min-loss-scale 1)
FP16DYN_LLAMA=(--fp16 --initial-loss-scale 65536 --loss-scale-window 5 --hysteresis 1 --min-loss-scale 16384)
FP16STATIC=(--fp16 --loss-scale 4096)
# run_args NAME -> the flags of run NAME (model_precision) in RUN_ARGS
run_args() {
  local model=${1%%_*} prec=${1#*_}
  case $model in gpt) RUN_ARGS=("${GPT[@]}");; llama) RUN_ARGS=("${LLAMA[@]}");; esac
  case $prec in
    fp32) ;;
    bf16) RUN_ARGS+=(--bf16);;
    fp8) RUN_ARGS+=("${FP8[@]}");;
    fp16dyn) if [ "$model" = gpt ]; then RUN_ARGS+=("${FP16DYN[@]}"); else RUN_ARGS+=("${FP16DYN_LLAMA[@]}"); fi;;
    fp16static) RUN_ARGS+=("${FP16STATIC[@]}");;
  esac
  RUN_ARGS+=("${COMMON[@]}" --data-cache-path "${CACHE_ROOT:-/tmp}/gpucheck_cache_$1_$2")
}
