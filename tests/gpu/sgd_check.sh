#!/usr/bin/env bash
# GPU check of --optimizer sgd (torch.optim.SGD composed from ops::add_/scale_/cast, the same code
# as on the CPU; compiled but never run on a GPU before this script) and of its checkpointed
# momentum buffers.
#   tests/gpu/sgd_check.sh BIN_DIR     (BIN_DIR: pretrain_gpt of a CUDA build)
# Results in ${OUT:-/tmp/out}/sgd/ (summary.txt). About 40-60 s on one H200. Steps (tiny GPT of
# gpucheck_lib.sh, 30 steps, --optimizer sgd --sgd-momentum 0.9 --lr 0.05, clip 1.0, wd 0.1):
#  1. GPU bf16 vs CPU fp32: every iteration's lm loss within 2e-2 relative (bf16), and the loss
#     falls (last < first - 0.05: the update does something).
#  2. GPU fp32 vs CPU fp32: max relative lm-loss difference <= 1e-3 (fp32 with different GEMM and
#     reduction orders; a wrong update is far off: INFO shows the CPU run with --sgd-momentum 0
#     against the same CPU reference for scale).
#  3. GPU --fp16 (dynamic loss scaling) vs CPU fp32 within 2e-2 relative, all losses finite.
#  4. GPU bf16 exact resume: 8 iterations straight vs 4 (--exit-interval 4 saves the momentum
#     buffers) + --load + 4: iterations 5..8 (lr, lm loss, grad norm as printed) identical (the
#     resumed run's second line, iteration 6, prints the mean of 5 and 6 as Megatron's does).
# Exit status 1 iff a check FAILed.
set -u
BIN="$(cd "${1:?usage: sgd_check.sh BIN_DIR}" && pwd)"
BASE="${OUT:-/tmp/out}/sgd"
mkdir -p "$BASE" && BASE="$(cd "$BASE" && pwd)"
O="$BASE"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # pass/fail/info, gc_find_libs, TINY_GPT, lm_losses
gc_find_libs sgd
status=0
: > "$O/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$O/gpu.txt" 2>&1; info "gpu: $(cat "$O/gpu.txt")"
SGD="--optimizer sgd --sgd-momentum 0.9 --lr 0.05 --min-lr 0.005"
COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path $BASE/cache"
gpu() { local log=$1; shift; timeout 30 "$BIN/pretrain_gpt" $TINY_GPT $COMMON $SGD "$@" > "$O/$log" 2>&1 || fail "GPU run $log exit $? ($O/$log)"; }
cpu() { local log=$1; shift; MEGATRON_DEVICE=cpu OMP_NUM_THREADS=8 timeout 40 "$BIN/pretrain_gpt" $TINY_GPT $COMMON $SGD "$@" > "$O/$log" 2>&1 || fail "CPU run $log exit $? ($O/$log)"; }
# cmp A B TOL LABEL: max relative lm-loss difference of logs A and B over 30 iterations <= TOL
cmp() {
  paste <(lm_losses "$O/$1") <(lm_losses "$O/$2") | awk -v tol="$3" -v label="$4" '
    $1 == "" || $2 == "" {bad=1; next}
    {d=($1-$2); if(d<0)d=-d; r=d/($2>0?$2:1); if(!($1==$1+0) || $1!=$1) bad=1; if(r>m){m=r; at=NR}; n++; last=$1" vs "$2;}
    END {ok=(n>=30 && m<=tol && !bad); printf "%s %s: max rel loss diff %.2e at iteration %d (tol %g, %d lines); last %s\n", (ok?"PASS":"FAIL"), label, m, at, tol, n, last; exit (ok?0:1)}' | tee -a "$O/summary.txt"
  grep -q '^FAIL' <(tail -1 "$O/summary.txt") && status=1
}

# 1. bf16 GPU vs fp32 CPU, and the loss falls.
gpu gpu_bf16.log --bf16
cpu cpu_fp32.log
cmp gpu_bf16.log cpu_fp32.log 2e-2 "1. SGD GPU bf16 vs CPU fp32"
first=$(lm_losses "$O/gpu_bf16.log" | head -1); last=$(lm_losses "$O/gpu_bf16.log" | tail -1)
if awk -v f="$first" -v l="$last" 'BEGIN{exit !(l < f - 0.05)}'; then pass "1. SGD GPU bf16 loss falls: $first -> $last"
else fail "1. SGD GPU bf16 loss does not fall: $first -> $last"; fi

# 2. fp32 GPU vs fp32 CPU (+ the momentum-0 CPU run for scale).
gpu gpu_fp32.log
cmp gpu_fp32.log cpu_fp32.log 1e-3 "2. SGD GPU fp32 vs CPU fp32"
cpu cpu_fp32_mom0.log --sgd-momentum 0
paste <(lm_losses "$O/cpu_fp32_mom0.log") <(lm_losses "$O/cpu_fp32.log") | awk '{d=($1-$2); if(d<0)d=-d; r=d/$2; if(r>m)m=r} END {printf "INFO 2. for scale: CPU --sgd-momentum 0 vs 0.9: max rel loss diff %.2e\n", m}' | tee -a "$O/summary.txt"

# 3. fp16 with dynamic loss scaling.
gpu gpu_fp16.log --fp16 --initial-loss-scale 65536 --loss-scale-window 8 --hysteresis 2
cmp gpu_fp16.log cpu_fp32.log 2e-2 "3. SGD GPU fp16 (dynamic loss scale) vs CPU fp32"
info "3. fp16 loss scale at the end: $(grep -o 'loss scale: [0-9.E+-]*' "$O/gpu_fp16.log" | tail -1)"

# 4. exact resume on the GPU (bf16).
R="--bf16 --train-iters 8 --lr-decay-iters 8"
gpu resume_a.log $R --save "$BASE/ck_a" --save-interval 100
gpu resume_b1.log $R --save "$BASE/ck_b" --save-interval 100 --exit-interval 4
gpu resume_b2.log $R --load "$BASE/ck_b" --save "$BASE/ck_b" --save-interval 100
fields() { grep -E "\] iteration +$2/ +8 \|" "$O/$1" | sed 's/.*\(learning rate: [^|]*\).*\(lm loss: [^|]*\).*\(grad norm: [^|]*\).*/\1 \2 \3/'; }
# Iteration 6, the resumed run's second line, prints the mean of 5 and 6 (Megatron's first logged
# iteration does not reset the interval): compared with the straight run's mean within print rounding.
ok=1
python3 "$(dirname "${BASH_SOURCE[0]}")/../functional_tests/support/resumed_log.py" compare "$O/resume_a.log" \
  "$O/resume_b2.log" --iterations 5-8 --fields 'learning rate,lm loss,grad norm' --name "4. SGD GPU bf16 resume" \
  > "$O/resume_cmp.txt" 2>&1 || { ok=0; info "$(cat "$O/resume_cmp.txt")"; }
if grep -rqa 'optimizer.state.momentum_buffer.' "$BASE/ck_b/iter_0000004"; then pass "4. checkpoint holds optimizer.state.momentum_buffer.*"
else fail "4. no optimizer.state.momentum_buffer.* in $BASE/ck_b/iter_0000004"; fi
if [ $ok = 1 ]; then pass "4. SGD GPU bf16 resume: iterations 5..8 identical as printed (6: the mean of 5 and 6): $(fields resume_b2.log 8)"
else fail "4. SGD GPU bf16 resume differs (see INFO lines; $O/resume_*.log)"; fi
rm -rf "$BASE/ck_a" "$BASE/ck_b" "$BASE/cache"

info "total ${SECONDS} s; logs in $BASE"
echo "sgd_check: $([ $status = 0 ] && echo ALL PASS || echo SOME FAILED)" | tee -a "$BASE/summary.txt"
exit $status
