#!/usr/bin/env bash
# GPU check of --moe-shared-expert-gate (megatron/core/transformer/moe/shared_experts.cpp: the gate
# GEMM, ops::scale_rows and ops::row_dot_f64 on the device, the T-value sigmoid on the host; compiled
# for CUDA but never run on a GPU before this script) and its cost.
#   tests/gpu/qwen2moe_check.sh BIN_DIR LOGDIR     (BIN_DIR: pretrain_gpt of a CUDA build)
# About 60 s on one H200. Steps:
#  1. a tiny MoE GPT (2 MoE layers, 4 experts top-2, a shared expert of 32 with the gate), 20 steps:
#     GPU fp32 vs CPU fp32 max relative lm-loss difference <= 1e-3 (fp32 with other GEMM and reduction
#     orders, as sgd_check.sh), and GPU bf16 vs CPU fp32 <= 2e-2 (bf16).
#  2. the gate acts on the GPU: the same GPU fp32 run without --moe-shared-expert-gate differs from
#     the gated one by more than 1e-5 relative at some iteration (the printed losses have 7 digits).
#  3. RESULT lines: ms/step of a Qwen1.5-MoE-shaped 2-layer model (hidden 2048, 16 heads, 60 experts
#     of 1408 top-4, shared expert 5632, seq 2048, mbs 1, bf16, --moe-grouped-gemm) with and without
#     the gate (the gate's two host synchronizations per MoE layer and step; prediction in
#     docs/moe.md "Shared-expert gate").
# Prints PASS/FAIL per check and RESULT lines; logs only under LOGDIR. Exit status 1 iff a check FAILed.
set -u
BIN="$(cd "${1:?usage: qwen2moe_check.sh BIN_DIR LOGDIR}" && pwd)"
O="${2:?usage: qwen2moe_check.sh BIN_DIR LOGDIR}"
mkdir -p "$O" && O="$(cd "$O" && pwd)"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # pass/fail/info, gc_find_libs, lm_losses, ms_of
gc_find_libs qwen2moe
status=0
: > "$O/summary.txt"
TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
  --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0 --vocab-size 128 --log-interval 1 --swiglu
  --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --add-qkv-bias
  --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2
  --moe-shared-expert-intermediate-size 32 --mock-data --tokenizer-type NullTokenizer --attention-dropout 0
  --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path "$O/cache")
gpu() { local log=$1; shift; timeout 40 "$BIN/pretrain_gpt" "${TINY[@]}" "$@" > "$O/$log" 2>&1 || fail "GPU run $log exit $? ($O/$log)"; }
cpu() { local log=$1; shift; MEGATRON_DEVICE=cpu OMP_NUM_THREADS=8 timeout 40 "$BIN/pretrain_gpt" "${TINY[@]}" "$@" > "$O/$log" 2>&1 || fail "CPU run $log exit $? ($O/$log)"; }
# cmp A B TOL LABEL: max relative lm-loss difference of logs A and B over the 20 iterations <= TOL
cmp() {
  paste <(lm_losses "$O/$1") <(lm_losses "$O/$2") | awk -v tol="$3" -v label="$4" '
    $1 == "" || $2 == "" {bad=1; next}
    {d=($1-$2); if(d<0)d=-d; r=d/($2>0?$2:1); if(r>m){m=r; at=NR}; n++; last=$1" vs "$2}
    END {ok=(n>=20 && m<=tol && !bad); printf "%s %s: max rel loss diff %.2e at iteration %d (tol %g, %d lines); last %s\n", (ok?"PASS":"FAIL"), label, m, at, tol, n, last; exit (ok?0:1)}' | tee -a "$O/summary.txt"
  grep -q '^FAIL' <(tail -1 "$O/summary.txt") && status=1
}
gpu gpu_fp32.log --moe-shared-expert-gate
cpu cpu_fp32.log --moe-shared-expert-gate
cmp gpu_fp32.log cpu_fp32.log 1e-3 "1. gated shared expert GPU fp32 vs CPU fp32"
gpu gpu_bf16.log --moe-shared-expert-gate --bf16
cmp gpu_bf16.log cpu_fp32.log 2e-2 "1. gated shared expert GPU bf16 vs CPU fp32"
gpu gpu_fp32_nogate.log
d=$(cmp_losses <(lm_losses "$O/gpu_fp32.log") <(lm_losses "$O/gpu_fp32_nogate.log"))
if awk -v d="$d" 'BEGIN{exit !(d > 1e-5)}'; then pass "2. the gate changes the GPU losses (max rel diff $d vs the ungated run)"
else fail "2. the gated and ungated GPU runs print the same losses (max rel diff $d): the gate has no effect"; fi

# 3. cost on a Qwen1.5-MoE-shaped model (2 of its 24 layers; vocabulary 32000 instead of 151936).
Q=(--num-layers 2 --hidden-size 2048 --ffn-hidden-size 5632 --num-attention-heads 16 --seq-length 2048
  --max-position-embeddings 2048 --position-embedding-type rope --rotary-base 1000000 --swiglu --normalization RMSNorm
  --untie-embeddings-and-output-weights --disable-bias-linear --add-qkv-bias --vocab-size 32000
  --num-experts 60 --moe-router-topk 4 --moe-ffn-hidden-size 1408 --moe-shared-expert-intermediate-size 5632
  --moe-grouped-gemm --moe-router-pre-softmax --moe-aux-loss-coeff 1e-3 --micro-batch-size 1 --global-batch-size 1
  --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0
  --mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0
  --data-cache-path "$O/cache" --train-iters 8)
for g in nogate gate; do
  extra=(); [ $g = gate ] && extra=(--moe-shared-expert-gate)
  timeout 60 "$BIN/pretrain_gpt" "${Q[@]}" "${extra[@]}" > "$O/qwen15_$g.log" 2>&1 || fail "Qwen1.5-MoE-shaped $g run exit $? ($O/qwen15_$g.log)"
done
ms0=$(ms_of "$O/qwen15_nogate.log" 3); ms1=$(ms_of "$O/qwen15_gate.log" 3)
echo "RESULT qwen2moe_qwen15_2l_step_nogate $ms0 ms" | tee -a "$O/summary.txt"
echo "RESULT qwen2moe_qwen15_2l_step_gate $ms1 ms" | tee -a "$O/summary.txt"
echo "RESULT qwen2moe_gate_step_ratio $(ratio "$ms1" "$ms0") x" | tee -a "$O/summary.txt"
[ "$status" = 0 ] && echo "PASS qwen2moe_check" || echo "FAIL qwen2moe_check"
exit $status
