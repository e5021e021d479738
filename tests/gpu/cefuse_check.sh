#!/usr/bin/env bash
# GPU check of the Session 5 "cefuse" changes (issue 7, GPT-2 124M step time 112.5 -> goal 111 ms):
#   1. fused cross entropy for training without TP (ops::cross_entropy_fused_, ce_fused_kernel):
#      one read of the [65536, 50304] bf16 logits computes loss/lse and writes softmax - onehot in
#      place; backward scales the output layer's input rows and dgrad rows by dloss
#      (scale_rows_kernel) instead of the ce_bwd_kernel pass over the logits.
#      MEGATRON_CE_FUSED=0 = the old ce_stats_kernel + ce_bwd_kernel path;
#      dev/cuda/ce_fused = the fused kernel against re-reading the row from global memory (L2)
#      instead of keeping it in shared memory.
#   2. gradient norm in multi-tensor launches (reduce_stage1_multi: 3 launches for GPT-2's 148
#      fp32 main grads instead of 148 reduce_stage1 launches). dev/cuda/reduce_many = old vs new.
# Predictions (docs/performance.md "Session 5: fused cross entropy"): 112.5 -> ~110.5 ms/step.
#   tests/gpu/cefuse_check.sh BIN_DIR      (BIN_DIR: gpu_ops_test and pretrain_gpt, CUDA build)
# Results in ${OUT:-/tmp/out}/cefuse/. Budget < 120 s on one H200: op tests ~15 s, two profiled
# GPT-2 runs (fused / unfused, 16 iterations) ~13 s each, tiny GPT fused vs unfused ~10 s, the
# dev/cuda drivers ce_fused and reduce_many ~10 s. The GPT-2 arguments and run/step-time functions are gpt2perf_check.sh's (read from it,
# so both measure the same thing). Every line that matters starts with PASS/FAIL/INFO; exit
# status 1 iff a FAIL.
set -u
BIN="$(cd "${1:?usage: cefuse_check.sh BIN_DIR}" && pwd)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
O="${OUT:-/tmp/out}/cefuse"; mkdir -p "$O" && O="$(cd "$O" && pwd)" && cd "$O"
export MEGATRON_KERNEL_PROFILE_OUT="$O"
export NCCL_NVLS_ENABLE=0
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
status=0
# gpt2perf_check.sh's definitions: COMMON and GPT2 (the GPT-2 124M arguments), steptime, losses
# and gpt2 (label, iterations, profile 1/0, env assignments -> $O/gpt2_<label>.log, T_<label>).
from_gpt2perf() { sed -n "$1" "$HERE/gpt2perf_check.sh"; }
if [ -f "$HERE/gpucheck_lib.sh" ]; then  # the shared helper file, where it exists
  . "$HERE/gpucheck_lib.sh"
  gc_find_libs cefuse
  gc_find_cupti
else  # gpt2perf_check.sh's own library/CUPTI search
  eval "$(from_gpt2perf '/^export LD_LIBRARY_PATH=/,/^nvidia-smi/p' | grep -v '^nvidia-smi' | sed 's/gpt2perf_lib/cefuse_lib/g')"
fi
fail() { echo "FAIL $*"; status=1; }
eval "$(from_gpt2perf '/^COMMON=/p; /^GPT2=/p; /^steptime()/p; /^losses()/p; /^gpt2() {/,/^}/p')"
if [ -z "${GPT2:-}" ] || ! declare -F gpt2 > /dev/null; then
  echo "FAIL could not read COMMON/GPT2/gpt2() from $HERE/gpt2perf_check.sh"; exit 1
fi
COMMON="${COMMON/gpt2perf_cache/cefuse_cache}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | sed 's/^/INFO gpu: /'

# 1. The new kernels against float64 host references: ce_fused (cross_entropy_fused_ at V 1000,
#    50304 (whole row in shared memory, vector loads), 50257 (element loads), 128256 (bf16/fp16:
#    ~90% in shared memory, the rest re-read; fp32: all re-read), fp32/bf16/fp16, labels outside
#    the shard; scale_rows),
#    grad_norm (sum_of_squares_many over 150 tensors vs float64), reduce_many, embedding_ce (the
#    unfused CE kernels, still used with TP > 1 / fp16 / eval). grad_norm also checks the
#    multi-tensor and per-tensor launches bit-identical (in one process, variants.h).
echo "== gpu_ops_test --only ce_fused,grad_norm,reduce_many,embedding_ce"
timeout 40 "$BIN/gpu_ops_test" --only ce_fused,grad_norm,reduce_many,embedding_ce > "$O/gpu_ops_test.log" 2>&1
rc=$?
grep -E "^FAIL|passed" "$O/gpu_ops_test.log"
grep -E "^PASS .*(cross_entropy_fused_|scale_rows|sum_of_squares_many)" "$O/gpu_ops_test.log"
[ $rc = 0 ] || fail "gpu_ops_test exit $rc ($O/gpu_ops_test.log)"

# 2. GPT-2 124M (gpt2perf's arguments: mbs 64, bf16, clip 1.0, mock data), fused CE (defaults)
#    vs MEGATRON_CE_FUSED=0, 16 iterations each, CUPTI profile of iterations 10-11.
echo "== GPT-2 124M: fused cross entropy (defaults) vs MEGATRON_CE_FUSED=0"
gpt2 fused 16 1
gpt2 unfused 16 1 MEGATRON_CE_FUSED=0
for lab in fused unfused; do
  grep "kernel profile |" "$O/gpt2_$lab.log" | grep -E "wall|^.*\| (gemm|attention|optimizer|other|memcpy|memset|idle) " | sed "s/^/INFO [$lab] /"
  echo "INFO [$lab] cross-entropy / scale / reduction kernels in the top 40 (fused: ce_fused_kernel ~3.4 ms, scale_rows_kernel 2 calls; unfused: ce_stats_kernel ~1.75 ms + ce_bwd_kernel ~3.3 ms):"
  grep -A40 "top 25 kernels\|top 40 kernels\|top kernels" "$O/gpt2_$lab.log" | grep "kernel profile" | grep -E "ce_|scale_rows|reduce_stage" | sed "s/^/INFO [$lab] /"
done
grep -A3 "longest GPU idle gaps" "$O/gpt2_fused.log" | sed 's/^/INFO [fused] /'
if [ "${T_fused:-nan}" != nan ] && [ "${T_unfused:-nan}" != nan ]; then
  echo "INFO GPT-2 step: fused $T_fused ms vs unfused $T_unfused ms: $(awk -v a=$T_fused -v b=$T_unfused 'BEGIN{printf "%+.1f ms (%.3fx)", a-b, b/a}') (predicted about -1.5 ms: the fused CE alone, the grad-norm change is on in both)"
fi
# Numerics: same seed and data; iterations 1-5 within 5e-3 relative, all 16 within 5e-2 (as
# gpt2perf: bf16 rounding differs -- g rounded to bf16 before the dloss factor instead of after --
# and mock data at lr 6e-4 amplifies noise later on).
cmp_runs() {  # $1 $2 labels, $3 iterations
  paste <(losses "$O/gpt2_$1.log") <(losses "$O/gpt2_$2.log") | head -n "$3" | awk -v a="$1" -v b="$2" -v N="$3" '
    {d=($1-$2); if(d<0)d=-d; r=d/($2>0?$2:1); if(NR<=5&&r>m5)m5=r; if(r>m){m=r;at=NR}; n++; line=line" "NR":"$1"/"$2"("sprintf("%.1e",r)")"}
    END {if(n<N){printf "FAIL GPT-2 losses %s vs %s: %d of %d loss lines\n", a, b, n, N; exit 1}
         ok=(m5<=5e-3&&m<=5e-2);
         printf "%s GPT-2 lm loss %s vs %s: max rel diff iterations 1-5 %.2e (tol 5e-3), 1-%d %.2e at %d (tol 5e-2)\n", ok?"PASS":"FAIL", a, b, m5, N, m, at;
         printf "INFO GPT-2 losses %s/%s (rel diff) per iteration:%s\n", a, b, line; exit ok?0:1}' || status=1
}
cmp_runs fused unfused 16
grep -qiE "lm loss: *(nan|inf)" "$O/gpt2_fused.log" && fail "NaN/inf loss in the fused GPT-2 log"

# 3. Tiny GPT 30 steps on the GPU in bf16, fused vs unfused CE: per-iteration lm loss within 2e-2
#    relative (the bf16 GPU-vs-CPU bound gpt2perf uses; the CPU fp32 paths agree to 1e-5, unit
#    test GPTCeFused.Fp32TrainingMatchesUnfused).
TINY="--num-layers 2 --hidden-size 64 --num-attention-heads 1 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 8 --train-iters 30 --lr-decay-iters 20 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 --vocab-size 128 --log-interval 1"
echo "== tiny GPT 30 steps, GPU bf16: fused vs unfused cross entropy"
for f in 1 0; do
  MEGATRON_CE_FUSED=$f timeout 20 "$BIN/pretrain_gpt" $TINY $COMMON --bf16 > "$O/gpt2_tiny$f.log" 2>&1 || fail "tiny GPU run MEGATRON_CE_FUSED=$f exit $? ($O/gpt2_tiny$f.log)"
done
paste <(losses "$O/gpt2_tiny1.log") <(losses "$O/gpt2_tiny0.log") | awk '
  {d=($1-$2); if(d<0)d=-d; r=d/($2>0?$2:1); if(r>m){m=r; at=NR}; n++; last=$1" vs "$2}
  END {if(n<30){printf "FAIL tiny GPT: %d of 30 loss lines\n", n; exit 1}
       printf "%s tiny GPT 30 steps bf16, fused vs unfused CE: max rel loss diff %.2e at iteration %d (tol 2e-2); last %s\n", (m<=2e-2?"PASS":"FAIL"), m, at, last; exit (m<=2e-2?0:1)}' || status=1

# 4. The two kernel variants: per-tensor grad-norm launches (predicted +0.3..1 ms per step: 145
#    launches and their gaps) and the fused CE without the shared-memory stash (second read from
#    L2/DRAM; predicted +0.3..1.5 ms), each against the shipped kernel on GPT-2's shapes, both
#    checked against the CPU reference (dev/cuda/README.md).
echo "== dev/cuda drivers: reduce_many ce_fused"
if type gc_dev_drivers > /dev/null 2>&1; then gc_dev_drivers reduce_many ce_fused
else fail "gc_dev_drivers missing: tests/gpu/gpucheck_lib.sh not found"; fi
echo "INFO total ${SECONDS}s"
[ $status = 0 ] && echo "PASS cefuse_check" || echo "FAIL cefuse_check"
exit $status
