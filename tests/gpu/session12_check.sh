#!/usr/bin/env bash
# GPU check of Session 12's LLaMA-shape kernels (issue 21), one H200, < 200 s:
#   A. QKV split + RoPE reads each token's (cos, sin) from a per-call table (rope.cu;
#      MEGATRON_ROPE_TABLE=0 = per-channel powf + sincosf): same bits.
#   B. fused cross entropy rows that only partly fit in shared memory (LLaMA-3's 128256) take the
#      bulk-copy kernel (embedding_ce.cu; MEGATRON_CE_FUSED_BULK=0 = the stash kernel): same bits.
#   C. LayerNorm/RMSNorm backward for 1024 < h <= 8192 by one block per row (norm.cu;
#      MEGATRON_NORM_BWD_ROW=0 = the shared-memory-atomics kernel): other summation order.
# Predictions and outcomes: docs/performance.md "Session 12: ...".
#   tests/gpu/session12_check.sh BIN_DIR LOGDIR
# BIN_DIR: gpu_ops_test, gpu_bench and pretrain_gpt of a CUDA build. Every line that matters
# starts with PASS/FAIL/RESULT/INFO; exit status 1 iff a FAIL:
#   1. gpu_ops_test --only rope,rope_table,ce_fused,norms: float64 references; table == per-channel
#      and bulk == stash bitwise; row-block vs float64, vs old within tolerance, twice bitwise.
#   2. gpu_bench mem: RESULT ms per QKV split + RoPE call at 8192 x 6144 bf16 with / without table.
#   3. --deterministic-mode, a 2-layer LLaMA-3-8B-wide model (h 4096, GQA 32/8, vocab 128256,
#      seq 2048), 6 iterations, A and B on vs off (C on in both): PASS iff every logged lm loss and
#      grad norm is bitwise equal (the printed digits).
#   4. the LLaMA-3-8B-shaped 4-layer step (seq 8192, gbs 1), all three on vs all off, ABAB:
#      RESULT ms/iter (mean of iterations 3-10) of each run and the saving.
set -u
BIN=$(cd "${1:?usage: tests/gpu/session12_check.sh BIN_DIR LOGDIR}" && pwd)
O=${2:?usage: tests/gpu/session12_check.sh BIN_DIR LOGDIR}
mkdir -p "$O" && O=$(cd "$O" && pwd)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
. "$HERE/gpucheck_lib.sh"  # gc_find_libs, gc_steptime
gc_find_libs session12
status=0
fail() { echo "FAIL $*"; status=1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | sed 's/^/INFO gpu: /'
OLD="MEGATRON_ROPE_TABLE=0 MEGATRON_CE_FUSED_BULK=0 MEGATRON_NORM_BWD_ROW=0"

echo "== 1. gpu_ops_test --only rope,rope_table,ce_fused,norms"
timeout 150 "$BIN/gpu_ops_test" --only rope,rope_table,ce_fused,norms > "$O/gpu_ops_test.log" 2>&1
rc=$?
grep -E "^FAIL|checks passed" "$O/gpu_ops_test.log" | head -20
[ "$(grep -c 'table == per-channel angles bitwise' "$O/gpu_ops_test.log")" -gt 0 ] || fail "gpu_ops_test ran no RoPE table case"
[ $rc = 0 ] || fail "gpu_ops_test exit $rc ($O/gpu_ops_test.log)"

echo "== 2. gpu_bench mem (QKV split + RoPE)"
timeout 150 "$BIN/gpu_bench" mem > "$O/gpu_bench_mem.log" 2>&1 || fail "gpu_bench mem exit $? ($O/gpu_bench_mem.log)"
grep -E '^qkv_split_rope' "$O/gpu_bench_mem.log" |
  awk '{t = ($0 ~ /no angle table/) ? "no_table" : "table"; printf "RESULT rope_%s_%s %s ms\n", $2, t, $(NF-3)}'

COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache_s12 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --bf16 --micro-batch-size 1 --global-batch-size 1"
WIDE="--hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256"
echo "== 3. --deterministic-mode, 2 layers, seq 2048: A and B on vs off, bitwise"
vals() { grep -oE '(lm loss|grad norm): [0-9.E+-]+' "$1"; }
for side in on off; do
  envs="X=1"; [ $side = off ] && envs="MEGATRON_ROPE_TABLE=0 MEGATRON_CE_FUSED_BULK=0"
  env $envs timeout 120 "$BIN/pretrain_gpt" --num-layers 2 $WIDE --seq-length 2048 --max-position-embeddings 2048 \
    $COMMON --deterministic-mode --train-iters 6 > "$O/det_$side.log" 2>&1 || fail "deterministic run ($side) exit $? ($O/det_$side.log)"
done
n=$(vals "$O/det_on.log" | wc -l)
if [ "$n" -ge 12 ] && cmp -s <(vals "$O/det_on.log") <(vals "$O/det_off.log"); then
  echo "PASS deterministic 2-layer LLaMA-wide: all $n logged lm loss / grad norm values bitwise equal with and without the RoPE table and the partial-row bulk CE"
else
  fail "deterministic 2-layer LLaMA-wide: $n values, on vs off differ ($O/det_on.log, $O/det_off.log)"
fi

echo "== 4. LLaMA-3-8B-shaped 4 layers, seq 8192, gbs 1: all on vs all off (ABAB)"
for k in a b; do
  for side in on off; do
    envs="X=1"; [ $side = off ] && envs=$OLD
    env $envs timeout 120 "$BIN/pretrain_gpt" --num-layers 4 $WIDE --seq-length 8192 --max-position-embeddings 8192 \
      $COMMON --log-throughput --train-iters 10 > "$O/ll4_${side}_$k.log" 2>&1 || fail "ll4 $side $k exit $?"
    echo "RESULT ll4_${side}_$k $(gc_steptime "$O/ll4_${side}_$k.log" 3) ms/iter"
  done
done
awk -v a="$(gc_steptime "$O/ll4_on_a.log" 3)" -v b="$(gc_steptime "$O/ll4_on_b.log" 3)" \
    -v c="$(gc_steptime "$O/ll4_off_a.log" 3)" -v d="$(gc_steptime "$O/ll4_off_b.log" 3)" \
    'BEGIN { printf "RESULT ll4_saving %.2f ms/iter (off %.1f - on %.1f, means of a and b)\n", (c + d - a - b) / 2, (c + d) / 2, (a + b) / 2 }'
[ $status = 0 ] && echo "PASS session12_check" || echo "FAIL session12_check"
exit $status
