# Helpers shared by the GPU check scripts (tests/gpu/*_check.sh), sourced by them:
#   . "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"
# The functions read the caller's BIN (bin dir), O (results folder) and set its `status` (1 on a
# FAIL). pass/fail/info print a PASS/FAIL/INFO line and append it to $O/summary.txt; a script that
# prints its lines elsewhere defines its own after sourcing this file.

# gc_check_init NAME [GPU_FIELDS]: the opening of a tests/gpu/*_check.sh, after sourcing this file:
# results under O=${OUT:-/tmp/out}/NAME, NVLink multicast off, GPU 0 unless CUDA_VISIBLE_DEVICES
# says otherwise, the CUDA libraries (cuda_libs.sh), T0 = now, status = 0, an empty
# $O/summary.txt, and nvidia-smi's GPU_FIELDS (default name,driver_version,clocks.sm) in
# $O/gpu.txt, printed as an INFO line.
gc_check_init() {
  O="${OUT:-/tmp/out}/$1"
  mkdir -p "$O"
  export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  . "$(dirname "${BASH_SOURCE[0]}")/cuda_libs.sh"
  T0=$(date +%s)
  status=0
  : > "$O/summary.txt"
  nvidia-smi --query-gpu="${2:-name,driver_version,clocks.sm}" --format=csv,noheader > "$O/gpu.txt" 2>&1
  info "gpu: $(cat "$O/gpu.txt")"
}
# gc_args_init NAME SCRIPT "$@": the opening of a check run as `SCRIPT BIN_DIR LOGDIR`: BIN and O
# (created) from the two arguments (a usage line and exit 2 when one is missing), NVLink multicast
# off, GPU 0 unless CUDA_VISIBLE_DEVICES says otherwise, the libraries (gc_find_libs NAME), T0 =
# now, status = 0.
gc_args_init() {
  local name=$1 script=$2
  shift 2
  if [ $# -lt 2 ]; then echo "usage: $script BIN_DIR LOGDIR" >&2; exit 2; fi
  BIN=$(cd "$1" && pwd) || exit 2
  mkdir -p "$2" && O=$(cd "$2" && pwd) || exit 2
  export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  gc_find_libs "$name"
  T0=$(date +%s)
  status=0
}
pass() { echo "PASS $*" | tee -a "$O/summary.txt"; }
fail() { echo "FAIL $*" | tee -a "$O/summary.txt"; status=1; }
info() { echo "INFO $*" | tee -a "$O/summary.txt"; }

# gc_find_libs NAME: the libraries BIN/pretrain_gpt needs: BIN/lib.tar.xz (non-CUDA shared libs, as
# .device/gpue2e/run.sh ships them) unpacked to /tmp/NAME_lib, the CUDA toolkit's and the PyTorch
# wheel's (cuda_libs.sh), then any CUDA library ldd still misses, found anywhere on the disk.
gc_find_libs() {
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
  if [ -f "$BIN/lib.tar.xz" ]; then
    mkdir -p "/tmp/$1_lib" && tar xJf "$BIN/lib.tar.xz" -C "/tmp/$1_lib"
    export LD_LIBRARY_PATH="/tmp/$1_lib/lib:${LD_LIBRARY_PATH:-}"
  fi
  . "$(dirname "${BASH_SOURCE[0]}")/cuda_libs.sh"
  local l f
  for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2 libcudnn.so.9; do
    if ldd "$BIN/pretrain_gpt" | grep -q "$l => not found"; then
      f=$(find / -xdev -name "$l" 2>/dev/null | head -1); [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
    fi
  done
}

# gc_find_cupti: MEGATRON_CUPTI_LIB for the kernel profiler (MEGATRON_KERNEL_PROFILE), unless set:
# the newest-named libcupti.so.13*, else any libcupti.so*.
gc_find_cupti() {
  local f
  if [ -z "${MEGATRON_CUPTI_LIB:-}" ]; then
    f=$(find / -xdev -name 'libcupti.so.13*' 2>/dev/null | sort | head -1)
    [ -z "$f" ] && f=$(find / -xdev -name 'libcupti.so*' 2>/dev/null | sort | head -1)
    [ -n "$f" ] && export MEGATRON_CUPTI_LIB=$f
  fi
}

# ms_of LOG [FIRST [LAST]]: mean "elapsed time per iteration (ms)" of the logged iterations
# FIRST..LAST (by iteration number; default 3..end), "%.1f"; NA if none.
ms_of() {
  awk -v lo="${2:-3}" -v hi="${3:-}" -F'elapsed time per iteration \\(ms\\): ' '/ iteration +[0-9]+\// {
    split($0, a, "iteration +"); split(a[2], b, "/"); it = b[1] + 0;
    if (it >= lo && (hi == "" || it <= hi + 0)) { split($2, c, " "); s += c[1]; n++ } } END { if (n) printf "%.1f", s / n; else print "NA" }' "$1"; }

# gc_steptime LOG FIRST [SKIP...]: mean of the logged "elapsed time per iteration (ms)" values from
# the FIRST-th such log line on, leaving out the SKIP-th lines, "%.1f"; nan if none.
gc_steptime() {
  local log=$1 first=$2; shift 2
  grep -o "elapsed time per iteration (ms): [0-9.]*" "$log" | awk -v first="$first" -v skip=" $* " '{v[NR]=$NF}
    END {s=0;n=0;for(i=first;i<=NR;i++){if(index(skip, " " i " "))continue;s+=v[i];n++} if(n) printf "%.1f", s/n; else print "nan"}'; }

# lm_losses LOG: the logged "lm loss:" values, one a line.
lm_losses() { grep -o "lm loss: [0-9.E+-]*" "$1" | awk '{print $NF}'; }

# tps MS [TOKENS]: tokens/s at MS ms/iter and TOKENS tokens per iteration (default 8192: one
# sequence of 8192), "%.0f"; NA if MS is NA.
tps() { awk -v ms="$1" -v t="${2:-8192}" 'BEGIN { if (ms == "NA") print "NA"; else printf "%.0f", t / (ms / 1000) }'; }
# ratio A B: A / B, "%.3f"; NA if either is NA.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "NA" || b == "NA") print "NA"; else printf "%.3f", a / b }'; }
# cmp_losses A B: max relative difference of two loss lists (files, one value a line), "%.3g".
cmp_losses() {
  paste "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r } END { printf "%.3g", m + 0 }'; }

# fp8_llama_args: the model flags of the FP8 checks (fp8perf, fp8fuse) as arrays:
#   LL  the LLaMA-3-8B-shaped 4-layer decoder at seq 8192, mbs 1, bf16 (bench/gpu/fp8_e2e.sh's flags)
#   FP8 the FP8 recipe added to LL (hybrid, delayed scaling, history 1024, max)
#   SM  a tiny fp8 LLaMA (4 micro-batches per step, evaluation every 10 steps, 30 steps)
fp8_llama_args() {
  LL=(--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention
      --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192
      --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm
      --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1
      --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
      --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput --mock-data --tokenizer-type NullTokenizer
      --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path "$O/cache")
  FP8=(--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max)
  SM=(--num-layers 4 --hidden-size 256 --ffn-hidden-size 768 --num-attention-heads 4 --group-query-attention
      --num-query-groups 2 --kv-channels 64 --seq-length 256 --max-position-embeddings 256
      --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
      --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 4 --global-batch-size 16
      --train-iters 30 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 3 --weight-decay 0.1
      --clip-grad 1.0 --bf16 --seed 1234 --mock-data --tokenizer-type NullTokenizer --vocab-size 4096
      --data-cache-path "$O/cache" --log-interval 1 --eval-interval 10 --eval-iters 2
      --fp8-format hybrid --fp8-amax-history-len 16 --fp8-amax-compute-algo max)
}

# small_fp8_run NAME VAR=VALUE: trains SM (fp8_llama_args) with that environment variable set ->
# $O/small_NAME.log and its logged losses (training and validation) in $O/small_NAME.loss.
small_fp8_run() {
  env "$2" timeout 60 "$BIN/pretrain_gpt" "${SM[@]}" > "$O/small_$1.log" 2>&1 || fail "small $1 rc $?"
  grep -oE "lm loss( value)?: [0-9.E+-]+" "$O/small_$1.log" | awk '{print $NF}' > "$O/small_$1.loss"
}
# small_fp8_stats A A2 B: compares the small runs A, A2 (same settings: run-to-run noise) and B ->
# N (B's loss count), NOISE (A vs A2), DIFF (A vs B), FIRST / LAST (A's first and iteration-30 loss);
# returns 1 unless B has >= 33 losses (30 training + 3 validation) and A as many.
small_fp8_stats() {
  N=$(wc -l < "$O/small_$3.loss")
  NOISE=$(cmp_losses "$O/small_$1.loss" "$O/small_$2.loss")
  DIFF=$(cmp_losses "$O/small_$1.loss" "$O/small_$3.loss")
  FIRST=$(head -1 "$O/small_$1.loss"); LAST=$(grep -oE "iteration +30/.*lm loss: [0-9.E+-]+" "$O/small_$1.log" | grep -oE "[0-9.E+-]+$")
  ! { [ "$N" -lt 33 ] || [ "$(wc -l < "$O/small_$1.loss")" != "$N" ]; }
}

# The tiny GPT of gpt2perf/hostgap (biases, tanh GeLU, LayerNorm h 64, one head of 64), 30 steps.
TINY_GPT="--num-layers 2 --hidden-size 64 --num-attention-heads 1 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 8 --train-iters 30 --lr-decay-iters 20 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 --vocab-size 128 --log-interval 1"
# tiny_gpt_gpu_vs_cpu COMMON: TINY_GPT + COMMON (a flag string) on the GPU in bf16
# ($O/tiny_gpu_bf16.log) and on the CPU in fp32 ($O/tiny_cpu_fp32.log); PASS if every
# iteration's lm loss is within 2e-2 relative (bf16), else FAIL and status=1.
tiny_gpt_gpu_vs_cpu() {
  timeout 20 "$BIN/pretrain_gpt" $TINY_GPT $1 --bf16 > "$O/tiny_gpu_bf16.log" 2>&1 || fail "tiny GPU run exit $? ($O/tiny_gpu_bf16.log)"
  MEGATRON_DEVICE=cpu OMP_NUM_THREADS=8 timeout 25 "$BIN/pretrain_gpt" $TINY_GPT $1 > "$O/tiny_cpu_fp32.log" 2>&1 || fail "tiny CPU run exit $? ($O/tiny_cpu_fp32.log)"
  paste <(lm_losses "$O/tiny_gpu_bf16.log") <(lm_losses "$O/tiny_cpu_fp32.log") | awk '
    {d=($1-$2); if(d<0)d=-d; r=d/($2>0?$2:1); if(r>m){m=r; at=NR}; n++; last=$1" vs "$2}
    END {if(n<30){printf "FAIL tiny GPT: %d of 30 loss lines\n", n; exit 1}
         printf "%s tiny GPT 30 steps, GPU bf16 vs CPU fp32: max rel loss diff %.2e at iteration %d (tol 2e-2); last %s\n", (m<=2e-2?"PASS":"FAIL"), m, at, last; exit (m<=2e-2?0:1)}' || status=1
}

# The kernel-variant drivers (dev/cuda/README.md) named in "$@", from $BIN/dev/dev_cuda_<name>:
# each checks the shipped kernel and its comparison variant against the CPU reference and times
# both (median of 20). Their PASS/FAIL/TIME lines go to stdout (TIME as INFO); a failing or
# missing driver sets status=1. Logs in $O/dev_<name>.log.
gc_dev_drivers() {
  local d rc
  for d in "$@"; do
    if [ ! -x "$BIN/dev/dev_cuda_$d" ]; then echo "FAIL dev driver $BIN/dev/dev_cuda_$d not built (ninja dev_cuda)"; status=1; continue; fi
    timeout 120 "$BIN/dev/dev_cuda_$d" --reps 20 > "$O/dev_$d.log" 2>&1
    rc=$?
    grep -E "^(PASS|FAIL) " "$O/dev_$d.log" | sed "s/^\(PASS\|FAIL\) /\1 [dev $d] /"
    grep -E "^TIME " "$O/dev_$d.log" | sed "s/^TIME /INFO [dev $d] /"
    [ $rc = 0 ] || { echo "FAIL dev driver $d exit $rc ($O/dev_$d.log)"; status=1; }
  done
}

# gc_gpu_vs_cpu_losses NAME N TOL ARGS...: trains ARGS (a small fp8 model) on the GPU and in the CPU
# emulation (MEGATRON_DEVICE=cpu; GPU timeout ${GC_GPU_TIMEOUT:-40} s, CPU ${GC_CPU_TIMEOUT:-100} s) ->
# $O/small_{gpu,cpu}.log, and prints PASS iff N losses were logged and every iteration's loss is within
# TOL relative (FAIL and status=1 otherwise).
gc_gpu_vs_cpu_losses() {
  local name=$1 n=$2 tol=$3; shift 3
  timeout "${GC_GPU_TIMEOUT:-40}" "$BIN/pretrain_gpt" "$@" > "$O/small_gpu.log" 2>&1 || fail "small $name GPU run rc $? ($O/small_gpu.log)"
  MEGATRON_DEVICE=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-12} timeout "${GC_CPU_TIMEOUT:-100}" "$BIN/pretrain_gpt" "$@" \
    > "$O/small_cpu.log" 2>&1 || fail "small $name CPU-emulation run rc $? ($O/small_cpu.log)"
  lm_losses "$O/small_gpu.log" > "$O/small_gpu.loss"; lm_losses "$O/small_cpu.log" > "$O/small_cpu.loss"
  paste "$O/small_gpu.loss" "$O/small_cpu.loss" | awk -v name="$name" -v want="$n" -v tol="$tol" '
    {d=($1-$2); if(d<0)d=-d; r=d/($2>0?$2:1); if(r>m){m=r; at=NR}; k++; first=(k==1?$1" vs "$2:first); last=$1" vs "$2}
    END {if(k<want){printf "FAIL small %s: %d of %d loss lines\n", name, k, want; exit 1}
         printf "%s small %s %d steps, GPU vs CPU emulation: max rel loss diff %.2e at iteration %d (tol %s); first %s, last %s\n", (m<=tol?"PASS":"FAIL"), name, want, m, at, tol, first, last; exit (m<=tol?0:1)}' |
    tee -a "$O/summary.txt"
  [ "${PIPESTATUS[1]}" = 0 ] || status=1
}
