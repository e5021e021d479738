#!/usr/bin/env bash
# GPU check of the "hostgap" changes (issue 7): no host synchronization in the training step
# (pinned-staged async H2D copies, the loss summed after the backward is enqueued, one sync for
# zero counts / inf checks; MEGATRON_LOG_HOST_SYNCS=1 counts the waits), the cuBLASLt epilogues
# (fc1 bias + tanh-GeLU GELU_AUX_BIAS, fc2 dgrad + GeLU backward + fc1 bias grad DGELU_BGRAD, bias
# grads by BGRADB, bias + residual in the proj/fc2 GEMM) and the residual gradient added inside the
# norm backward. If an epilogue op FAILs, MEGATRON_GEMM_EPILOGUES=0 turns the GeLU/residual/BGRADB
# fusions off in pretrain_gpt.
#   tests/gpu/hostgap_check.sh BIN_DIR      (BIN_DIR: gpu_ops_test and pretrain_gpt)
# Results go to ${OUT:-/tmp/out}/hostgap/. Budget < 150 s on one H200 (op tests ≈ 15 s, GPT-2 ≈ 15 s
# each, LLaMA ≈ 30 s incl. host init, tiny runs ≈ 15 s; every run has a timeout, the optional
# second GPT-2 run is skipped past 110 s). Every line that matters starts with
# PASS/FAIL/INFO; exit status non-zero iff a FAIL.
# Non-CUDA shared libraries: if BIN_DIR/lib.tar.xz exists (as in .device/gpue2e/run.sh) it is
# unpacked and put on LD_LIBRARY_PATH; CUDA libraries are searched like tests/gpu/run_gpu_tests.sh.
set -u
BIN="$(cd "${1:?usage: hostgap_check.sh BIN_DIR}" && pwd)"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
O="${OUT:-/tmp/out}/hostgap"; mkdir -p "$O" && O="$(cd "$O" && pwd)" && cd "$O"  # the profiler writes trace_rank0.json here
export MEGATRON_KERNEL_PROFILE_OUT="$O"
export NCCL_NVLS_ENABLE=0
export MEGATRON_LOG_HOST_SYNCS=1  # pretrain_gpt prints host synchronizations per iteration at each log line
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # gc_find_libs, gc_find_cupti, gc_steptime, lm_losses, ...
gc_find_libs hostgap  # BIN/lib.tar.xz -> /tmp/hostgap_lib, cuda_libs.sh, CUDA libraries ldd misses
# CUPTI for the kernel profiler (MEGATRON_KERNEL_PROFILE, docs/performance.md "Kernel profile"):
# GPU idle time (host gaps) of the last iteration of the GPT-2 and LLaMA runs.
for d in /usr/local/cuda/extras/CUPTI/lib64; do [ -d "$d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"; done
gc_find_cupti
kprof() {  # $1 log, $2 label: the profile's summary lines (wall/busy/idle, categories, gaps)
  grep "kernel profile |" "$1" | grep -E "wall|idle|memcpy|memset|gaps by length" | head -n 6 | sed "s/^/INFO $2 /"
  grep -A4 "longest GPU idle gaps" "$1" | head -n 5 | sed "s/^/INFO $2 /"
}
ldd "$BIN/pretrain_gpt" | grep "not found" && echo "FAIL pretrain_gpt has unresolved libraries (see above; put lib.tar.xz in BIN_DIR or set LD_LIBRARY_PATH)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | sed 's/^/INFO gpu: /'
status=0
fail() { echo "FAIL $*"; status=1; }  # this script's lines go to stdout only

# 1. Ops vs float64 host references (new: epilogues, h2d_staging, reduce_many; changed: gemm's
#    linear_backward now takes the BGRADB path for bf16).
echo "== gpu_ops_test (epilogues, h2d staging, reduce_many, gemm, norms)"
timeout 30 "$BIN/gpu_ops_test" --only epilogues,h2d_staging,reduce_many,gemm,norms > "$O/gpu_ops_test.log" 2>&1
rc=$?
grep -E "^FAIL|passed" "$O/gpu_ops_test.log"
grep -E "^PASS .*(linear_bias_gelu|linear_dgelu|linear_forward_residual|BGRADB|h2d|_many|bwd_residual dx)" "$O/gpu_ops_test.log"
[ $rc = 0 ] || fail "gpu_ops_test exit $rc ($O/gpu_ops_test.log)"

COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/hostgap_cache"
# step time = mean of the logged "elapsed time per iteration (ms)" after the first log line (the
# last interval holds the profiled iteration: two device synchronizations more, negligible).
steptime() { gc_steptime "$1" 2; }
losses() { lm_losses "$1"; }

# 2. GPT-2 124M, the bench's flags (bench/gpu/pretrain_gpt_e2e.sh), 20 iterations, with and
#    without the GeLU epilogues (MEGATRON_GEMM_EPILOGUES=0). Before (docs/performance.md,
#    3de5e63): 132.1 ms/iter, 496k tokens/s; goal 590k.
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --train-iters 20 --log-interval 5 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 64 --global-batch-size 64"
gpt2_run() {  # $1 = MEGATRON_GEMM_EPILOGUES value
  local ep=$1 rc t
  echo "== GPT-2 124M mbs 64, MEGATRON_GEMM_EPILOGUES=$ep"
  MEGATRON_KERNEL_PROFILE=20:20 MEGATRON_GEMM_EPILOGUES=$ep timeout 30 "$BIN/pretrain_gpt" $GPT2 $COMMON > "$O/gpt2_ep$ep.log" 2>&1
  rc=$?; t=$(steptime "$O/gpt2_ep$ep.log")
  grep " iteration " "$O/gpt2_ep$ep.log" | tail -n 1 | cut -c1-220 | sed 's/^/  /'
  grep "host synchronizations" "$O/gpt2_ep$ep.log" | tail -n 1 | sed 's/^ */INFO GPT-2 /'
  kprof "$O/gpt2_ep$ep.log" "GPT-2 ep=$ep"
  if [ $rc = 0 ] && [ "$t" != nan ]; then
    echo "INFO GPT-2 124M epilogues=$ep: $t ms/iter, $(tps "$t" 65536) tokens/s (before: 132.1 ms, 496k; goal 590k)"
  else fail "GPT-2 124M epilogues=$ep exit $rc ($O/gpt2_ep$ep.log)"; fi
}
gpt2_run 1

# 3. LLaMA-3-8B-shaped, 4 layers, seq 8192 (no biases: exercises the host-gap changes only).
#    Before: 145.2 ms/iter, 56.4k tokens/s; goal 66k.
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --train-iters 8 --log-interval 2 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --timing-log-level 2"
# --timing-log-level 2 prints host-side timers (batch-generator, forward/backward launch, optimizer):
# with no syncs left in the step they show where the HOST spends the step, for the gap hunt.
echo "== LLaMA-8B-shaped 4 layers, 8 iterations"
MEGATRON_KERNEL_PROFILE=8:8 timeout 50 "$BIN/pretrain_gpt" $LL $COMMON > "$O/llama8b_4l.log" 2>&1
rc=$?; t=$(steptime "$O/llama8b_4l.log")
grep " iteration " "$O/llama8b_4l.log" | tail -n 1 | cut -c1-220 | sed 's/^/  /'
tail -n 3 "$O/llama8b_4l.log" | grep -iE "error|what|terminate" | sed 's/^/  /'
grep "host synchronizations" "$O/llama8b_4l.log" | tail -n 1 | sed 's/^ */INFO LLaMA /'
kprof "$O/llama8b_4l.log" "LLaMA"
# Expected after this change: 2 per iteration (the loss copy after the backward, the grad norm).
grep -A5 "time across ranks" "$O/llama8b_4l.log" | tail -n 5 | sed 's/^ */INFO host timer (last interval, ms per iteration) /'
if [ $rc = 0 ] && [ "$t" != nan ]; then
  echo "INFO LLaMA-8B-shaped 4L: $t ms/iter, $(tps "$t") tokens/s (before: 145.2 ms, 56.4k; goal 66k)"
else fail "LLaMA exit $rc ($O/llama8b_4l.log)"; fi

# 4. Training unchanged: tiny GPT (biases, tanh GeLU: the fused path) 30 steps on the GPU in bf16
#    vs the same flags on the CPU in fp32; per-iteration lm loss within 2e-2 relative (bf16).
echo "== tiny GPT 30 steps: GPU bf16 vs CPU fp32"
tiny_gpt_gpu_vs_cpu "$COMMON"
grep -qiE "lm loss: *(nan|inf)" "$O/tiny_gpu_bf16.log" && fail "NaN/inf loss in the tiny GPU log"
# For scale: before this change the first 20 steps (same LR schedule: --lr-decay-iters 20) were
# within 5e-4 of the CPU fp32 losses (raw log in git history: 3ba2c1c:bench/results/2026-11-29-h200-e2e/,
# docs/performance.md "Results file"); this prints the new run against that old GPU log when the
# checkout has the git history (skipped otherwise).
OLD="$O/pre_change_tiny_gpt_gpu_bf16.log"
git -C "$ROOT" show 3ba2c1c:bench/results/2026-11-29-h200-e2e/tiny_gpt_gpu_bf16.log > "$OLD" 2>/dev/null || rm -f "$OLD"
[ -s "$OLD" ] && paste <(losses "$O/tiny_gpu_bf16.log" | head -n 20) <(losses "$OLD") | awk '
  {d=($1-$2); if(d<0)d=-d; r=d/$2; if(r>m)m=r; n++}
  END {printf "INFO tiny GPT GPU bf16, this build vs the pre-change GPU log: max rel loss diff %.2e over %d steps\n", m, n}'

# 5. (if time is left: < 110 s so far) GPT-2 with the GeLU/residual epilogues off, same seed and
#    data: throughput A/B, and the two runs' losses must agree within bf16 noise (2e-2 relative).
if [ $SECONDS -lt 110 ]; then
  gpt2_run 0
  # Same seed and data: the two runs' losses must agree within bf16 noise (2e-2 relative).
  paste <(losses "$O/gpt2_ep1.log") <(losses "$O/gpt2_ep0.log") | awk '
    {d=($1-$2); if(d<0)d=-d; r=d/($2>0?$2:1); if(r>m)m=r; n++}
    END {if(n==0){print "FAIL GPT-2 epilogue on/off: no losses"; exit 1}
         printf "%s GPT-2 lm loss, epilogues on vs off: max rel diff %.2e over %d log lines (tol 2e-2)\n", (m<=2e-2?"PASS":"FAIL"), m, n; exit (m<=2e-2?0:1)}' || status=1
else
  echo "INFO skipped the epilogues-off GPT-2 run (time budget: ${SECONDS} s used)"
fi
echo "INFO total ${SECONDS} s"
echo "hostgap_check: $([ $status = 0 ] && echo ALL PASS || echo SOME FAILED) (logs in $O)"
exit $status
