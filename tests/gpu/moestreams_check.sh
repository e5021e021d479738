#!/usr/bin/env bash
# The MoE expert GEMMs on several CUDA streams (MEGATRON_MOE_GEMM_STREAMS; docs/moe.md "Kernels" and
# "Session 11: expert GEMMs on several streams") on one H200, < 90 s (about 60 s).
#   tests/gpu/moestreams_check.sh BIN_DIR LOGDIR   (BIN_DIR: gpu_ops_test, gpu_bench, pretrain_gpt)
# Logs (small text files) go to LOGDIR/moestreams/. PASS/FAIL/INFO and RESULT lines; exit 1 on any FAIL.
#  1. gpu_ops_test --only moe: the grouped GEMM ops against float64 products (both paths, bf16 and
#     fp32), and the per-expert loop on 2, 3 and 4 streams byte for byte equal to the serial loop
#     (forward, dgrad, wgrad accumulated into fp32 and overwritten; the lane counters must show the
#     calls forked). gpu_ops_test --only router: the device router against the host float64 router,
#     with the float64 device router of --moe-router-dtype fp64 (first run on a GPU: six float64-logit
#     shapes with differences below float32's resolution, the float64 gating kernels bitwise
#     against the host loops, two MoELayer cases device vs host with fp64; "router ... fp64" and
#     "router gating fp64" lines; --small: T = 256 for the large shapes, to stay in the budget).
#     PASS = the group's every check passed.
#  2. gpu_bench moe_gemms: the Mixtral-8x7B-shaped (8 experts x 1024 rows, hidden 4096, ffn 14336)
#     and Qwen3-30B-A3B-shaped (128 x 256, 2048, 768) expert GEMMs fwd + bwd with the loop on 1, 2,
#     4 streams, the auto rule with 1 stream and with the default, beside the dense GEMMs of the same
#     FLOPs. RESULT TFLOP/s per figure and the expert / dense ratio (goal at Mixtral: >= 0.85).
#     Figures, not checks.
#  3. a small bf16 MoE pretrain_gpt (2 layers, hidden 1024, 8 SwiGLU experts top-2, 512 routed
#     rows per expert, 2 micro-batches per step so the wgrads accumulate) with the per-expert loop
#     forced (MEGATRON_MOE_GROUPED_GEMM=0) and --deterministic-mode, MEGATRON_MOE_GEMM_STREAMS=1 vs
#     the default: PASS iff every logged lm loss and grad norm is the same string and the trained
#     parameters (MEGATRON_DUMP_PARAMS, under /tmp, deleted after) are byte for byte equal. If they
#     differ, the streams=1 run is repeated: a repeat that differs from the first says the baseline
#     itself is not reproducible (FAIL either way: nothing was shown).
set -u
unset MEGATRON_MOE_GEMM_STREAMS MEGATRON_MOE_GROUPED_GEMM
BIN="${1:?usage: moestreams_check.sh BIN_DIR LOGDIR}"
OUT="${2:?usage: moestreams_check.sh BIN_DIR LOGDIR}"
BIN=$(cd "$BIN" && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"
gc_check_init moestreams name,driver_version
result() { echo "RESULT $1 $2 $3" | tee -a "$O/summary.txt"; }

# ---- 1. ops ------------------------------------------------------------------------------------
for group in moe router; do
  L="$O/gpu_ops_test_$group.log"
  small=(); [ "$group" = router ] && small=(--small)  # the router group in full: tests/gpu/moerouter_check.sh
  timeout 60 "$BIN/gpu_ops_test" --only "$group" "${small[@]}" > "$L" 2>&1
  rc=$?
  grep -E '^FAIL' "$L" | head -20
  np=$(grep -c '^PASS' "$L"); nf=$(grep -c '^FAIL' "$L")
  if [ "$rc" = 0 ] && [ "$nf" = 0 ] && [ "$np" -gt 20 ]; then
    pass "gpu_ops_test --only $group ($np checks; streams / fp64 ones: $(grep -cE '^PASS +(moe streams|router.*fp64)' "$L"))"
  else
    fail "gpu_ops_test --only $group rc=$rc, $np passed, $nf failed ($L)"; tail -3 "$L"
  fi
done

# ---- 2. expert GEMM rates ------------------------------------------------------------------------
L="$O/gpu_bench_moe_gemms.log"
timeout 60 "$BIN/gpu_bench" moe_gemms > "$L" 2>&1
rc=$?
[ $rc = 0 ] || fail "gpu_bench moe_gemms rc=$rc ($L)"
grep " paths: " "$L" | sed 's/^/INFO /'
# "moe mixtral-8x7b expert gemms loop streams=2 E=8 rows=1024 fwd+bwd   14.1 ms  614.2 TFLOP/s"
rate() { grep -E "^moe $1 $2.*fwd\+bwd +[0-9.]+ ms" "$L" | grep -v " paths: " | head -1 | awk '{print $(NF-1)}'; }
for shape in mixtral-8x7b qwen3-30b-a3b; do
  dense=$(rate "$shape" "dense gemms")
  result "moe_${shape}_dense_tflops" "${dense:-NA}" TFLOP/s
  for v in "loop streams=1" "loop streams=2" "loop streams=4" "auto streams=1" "auto" "grouped"; do
    r=$(rate "$shape" "expert gemms $v E=")
    n=$(echo "$v" | tr ' =' '_')
    result "moe_${shape}_expert_${n}_tflops" "${r:-NA}" TFLOP/s
    result "moe_${shape}_expert_${n}_vs_dense" "$(ratio "${r:-NA}" "${dense:-NA}")" x
  done
done

# ---- 3. pretrain_gpt: streams=1 vs the default, bitwise -------------------------------------------
ARGS=(--num-layers 2 --hidden-size 1024 --ffn-hidden-size 2048 --num-attention-heads 8 --group-query-attention
  --num-query-groups 4 --seq-length 1024 --max-position-embeddings 1024 --position-embedding-type rope --swiglu
  --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 8192
  --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --micro-batch-size 2 --global-batch-size 4 --bf16
  --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0
  --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0
  --data-cache-path "$O/cache" --train-iters 8 --deterministic-mode)
DUMP=$(mktemp -d /tmp/moestreams_params.XXXXXX)
trap 'rm -rf "$DUMP" "$O/cache"' EXIT
run() {  # run NAME STREAMS ("" = unset: the default)
  local name=$1 rc
  mkdir -p "$DUMP/$name"
  if [ -n "$2" ]; then export MEGATRON_MOE_GEMM_STREAMS=$2; else unset MEGATRON_MOE_GEMM_STREAMS; fi
  MEGATRON_MOE_GROUPED_GEMM=0 MEGATRON_DUMP_PARAMS="$DUMP/$name" timeout 60 "$BIN/pretrain_gpt" "${ARGS[@]}" \
    > "$O/pretrain_$name.log" 2>&1
  rc=$?
  unset MEGATRON_MOE_GEMM_STREAMS
  grep -oE "(lm loss|grad norm): [0-9.E+-]+" "$O/pretrain_$name.log" > "$O/pretrain_$name.numbers"
  [ $rc = 0 ] || fail "pretrain_gpt $name rc=$rc ($O/pretrain_$name.log: $(grep -m1 -iE 'error|what' "$O/pretrain_$name.log"))"
  return $rc
}
same() {  # same A B: logged numbers equal (8 lm losses at least) and parameter dumps byte for byte
  [ "$(grep -c 'lm loss' "$O/pretrain_$1.numbers")" -ge 8 ] && cmp -s "$O/pretrain_$1.numbers" "$O/pretrain_$2.numbers" &&
    [ -n "$(ls "$DUMP/$1")" ] && diff -rq "$DUMP/$1" "$DUMP/$2" > /dev/null
}
if run streams1 1 && run default ""; then
  info "pretrain streams=1: $(grep -m1 'lm loss' "$O/pretrain_streams1.numbers") -> $(grep 'lm loss' "$O/pretrain_streams1.numbers" | tail -1); ms/iter streams=1 $(ms_of "$O/pretrain_streams1.log"), default $(ms_of "$O/pretrain_default.log")"
  if same streams1 default; then
    pass "pretrain_gpt MoE --deterministic-mode, MEGATRON_MOE_GEMM_STREAMS=1 vs default: every lm loss and grad norm and the trained parameters bitwise equal ($(grep -c . "$O/pretrain_default.numbers") numbers)"
  elif run streams1again 1 && same streams1 streams1again; then
    fail "pretrain_gpt MoE MEGATRON_MOE_GEMM_STREAMS=1 vs default differ (two streams=1 runs agree): diff $O/pretrain_streams1.numbers $O/pretrain_default.numbers"
  else
    fail "pretrain_gpt MoE: two MEGATRON_MOE_GEMM_STREAMS=1 --deterministic-mode runs differ from each other, so streams=1 vs default shows nothing ($O/pretrain_*.numbers)"
  fi
fi
info "total $(( $(date +%s) - T0 )) s; logs in $O"
echo "moestreams_check: status $status" | tee -a "$O/summary.txt"
exit $status
