#!/usr/bin/env bash
# GPU check of Session 13 (issue 21), one H200, < 420 s:
#   the overlapped optimizer step with a GEMM SM margin (MEGATRON_OPTIM_OVERLAP=1 plus
#   MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=N: the forward's GEMMs beside pending Adam chunks plan
#   for N fewer SMs, cuBLASLt's CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), and the GPU re-run of
#   Session 12's refactors (rope_cos_sin, the row-block norm backward tail) that were only compiled.
# Prediction and outcome: docs/performance.md "Session 13: GEMM SM margin".
#   tests/gpu/smmargin_check.sh BIN_DIR LOGDIR
# BIN_DIR: gpu_ops_test, pretrain_gpt and dev/dev_cuda_norm_bwd, dev/dev_cuda_ce_fused
# of a CUDA build, lib.tar.xz beside them where the machine lacks the non-CUDA libraries. Every
# line that matters starts with PASS/FAIL/RESULT/INFO; exit status 1 iff a FAIL:
#   1. gpu_ops_test --only rope,rope_table,ce_fused,norms,adam: float64 references, bitwise pairs.
#   2. dev_cuda_norm_bwd (row-block vs old, vs CPU, twice bitwise), dev_cuda_ce_fused (the fused
#      cross entropy alone, incl. 8192 x 128256 rows), by gc_dev_drivers: PASS/FAIL lines, timings
#      as INFO; a driver that is not built is a FAIL.
#   3. LLaMA-3-8B-shaped 4 layers, seq 8192, gbs 1, 12 iterations: serial step, overlap without
#      margin, overlap with margins MARGINS (default "8 16 32"), in that order and then reversed
#      (ABBA): RESULT ms/iter (mean of iterations 3-12) per run and per setting; the iteration-1
#      loss of every run equal to the serial one (PASS: the margin changes no parameter before the
#      first update); the last logged loss of each run as INFO (other GEMM plans may round
#      differently; mock data, so only a gross difference would mean a fault).
#   4. same at gbs 8 (6 iterations, mean of 3-6): serial, overlap + the best margin of 3.
#   5. nvidia-smi clocks.sm / power.draw sampled every 200 ms during a serial gbs-8 run (reading
#      only): INFO lines with the median SM clock and power (the sustained clock the step runs at).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # gc_args_init, gc_steptime, lm_losses, pass/fail
gc_args_init smmargin tests/gpu/smmargin_check.sh "$@"
MARGINS=${MARGINS:-"8 16 32"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | sed 's/^/INFO gpu: /'

echo "== 1. gpu_ops_test --only rope,rope_table,ce_fused,norms,adam"
timeout 150 "$BIN/gpu_ops_test" --only rope,rope_table,ce_fused,norms,adam > "$O/gpu_ops_test.log" 2>&1
rc=$?
grep -E "^FAIL|checks passed|passed" "$O/gpu_ops_test.log" | head -20
[ "$(grep -c '^PASS rowblk' "$O/gpu_ops_test.log")" -gt 0 ] || fail "gpu_ops_test ran no row-block norm case"
[ "$(grep -c 'table == per-channel angles bitwise' "$O/gpu_ops_test.log")" -gt 0 ] || fail "gpu_ops_test ran no RoPE table case"
[ $rc = 0 ] && echo "PASS gpu_ops_test --only rope,rope_table,ce_fused,norms,adam" || fail "gpu_ops_test exit $rc ($O/gpu_ops_test.log)"
echo "INFO elapsed $(( $(date +%s) - T0 )) s"

echo "== 2. dev drivers"
gc_dev_drivers norm_bwd ce_fused
echo "INFO elapsed $(( $(date +%s) - T0 )) s"

COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache_s13 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --bf16 --micro-batch-size 1 --log-throughput"
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256"
# envs_of SETTING: serial | m0 | mN -> the environment of the run.
envs_of() {
  case $1 in
    serial) echo "MEGATRON_OPTIM_OVERLAP=0" ;;
    m*) echo "MEGATRON_OPTIM_OVERLAP=1 MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=${1#m}" ;;
  esac
}
# llrun NAME SETTING GBS ITERS
llrun() {
  env $(envs_of "$2") timeout 150 "$BIN/pretrain_gpt" $LL $COMMON --global-batch-size "$3" --train-iters "$4" \
    > "$O/$1.log" 2>&1 || fail "$1 exit $? ($O/$1.log)"
  echo "RESULT $1 $(gc_steptime "$O/$1.log" 3) ms/iter"
}
last_loss() { lm_losses "$1" | tail -1; }
first_loss() { lm_losses "$1" | head -1; }

echo "== 3. ll4 gbs 1: serial, overlap, overlap + margins $MARGINS (ABBA)"
SETS="serial m0"; for m in $MARGINS; do SETS="$SETS m$m"; done
REV=$(echo $SETS | tr ' ' '\n' | tac | tr '\n' ' ')
for s in $SETS; do llrun "gbs1_${s}_a" "$s" 1 12; done
for s in $REV; do llrun "gbs1_${s}_b" "$s" 1 12; done
ref=$(first_loss "$O/gbs1_serial_a.log")
best=""; bestv=""
for s in $SETS; do
  a=$(gc_steptime "$O/gbs1_${s}_a.log" 3); b=$(gc_steptime "$O/gbs1_${s}_b.log" 3)
  m=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (a + b) / 2 }')
  echo "RESULT gbs1_$s $m ms/iter (a $a, b $b)"
  echo "INFO gbs1_$s last loss $(last_loss "$O/gbs1_${s}_a.log") / $(last_loss "$O/gbs1_${s}_b.log") (serial: $(last_loss "$O/gbs1_serial_a.log"))"
  for k in a b; do
    f=$(first_loss "$O/gbs1_${s}_$k.log")
    [ -n "$ref" ] && [ "$f" = "$ref" ] || fail "gbs1_${s}_$k iteration-1 loss '$f' vs serial '$ref'"
  done
  case $s in m0|serial) ;; *) if [ -z "$bestv" ] || awk -v x="$m" -v y="$bestv" 'BEGIN { exit !(x < y) }'; then best=$s; bestv=$m; fi ;; esac
done
grep -m1 -E 'optimizer step (overlapped|not overlapped)' "$O/gbs1_${best:-m0}_a.log" | sed 's/^/INFO /'
echo "INFO best margin at gbs 1: ${best:-none} ($bestv ms/iter); elapsed $(( $(date +%s) - T0 )) s"
[ -n "$ref" ] && echo "PASS iteration-1 loss of every gbs-1 run equal to the serial one ($ref)"

echo "== 4. ll4 gbs 8: serial vs overlap + ${best:-m16} (ABBA), clocks sampled in the first serial run"
b8=${best:-m16}
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 200 > "$O/smi_gbs8.csv" 2>/dev/null &
SMI=$!
llrun gbs8_serial_a serial 8 6
kill "$SMI" 2>/dev/null; wait "$SMI" 2>/dev/null
llrun "gbs8_${b8}_a" "$b8" 8 6
llrun "gbs8_${b8}_b" "$b8" 8 6
llrun gbs8_serial_b serial 8 6
for s in serial "$b8"; do
  echo "RESULT gbs8_$s $(awk -v a="$(gc_steptime "$O/gbs8_${s}_a.log" 3)" -v b="$(gc_steptime "$O/gbs8_${s}_b.log" 3)" 'BEGIN { printf "%.2f", (a + b) / 2 }') ms/iter"
done
if [ -s "$O/smi_gbs8.csv" ]; then
  sort -t, -k1 -n "$O/smi_gbs8.csv" | awk -F, '{c[NR]=$1; p[NR]=$2} END { if (NR) printf "INFO serial gbs-8 run: %d samples, SM clock median %s MHz (min %s, max %s)\n", NR, c[int((NR+1)/2)], c[1], c[NR] }'
  sort -t, -k2 -n "$O/smi_gbs8.csv" | awk -F, '{p[NR]=$2} END { if (NR) printf "INFO serial gbs-8 run: power median %s W (max %s W)\n", p[int((NR+1)/2)], p[NR] }'
fi
echo "INFO elapsed $(( $(date +%s) - T0 )) s"
[ $status = 0 ] && echo "PASS smmargin_check" || echo "FAIL smmargin_check"
exit $status
