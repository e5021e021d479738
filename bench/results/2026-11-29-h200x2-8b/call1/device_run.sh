#!/bin/bash
# Lead call 1 (session 3): GPU op tests of d2655b1, then LLaMA-3 8B (32 layers) on two H200 via
# examples/llama/train_llama3_8b_h100_fp8.sh (shortened by bench/gpu/llama3_8b_bench_args.sh).
R=$(pwd); D=$(cd "$(dirname "$0")" && pwd); O=/tmp/o; mkdir -p $O; OUTD=${OUT:-/tmp/out}; mkdir -p $OUTD
T0=$(date +%s); DEADLINE=${DEADLINE:-540}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $D/bin && tar xJf $D/bin.tar.xz -C $D/bin && mkdir -p /tmp/gl && tar xJf $D/lib.tar.xz -C /tmp/gl
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl/lib
for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2 libcudnn.so.9; do
  if ! ldd $D/bin/pretrain_gpt | grep -q "$l => /"; then
    d=$(dirname "$(find / -xdev -name "$l" 2>/dev/null | head -1)"); export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; fi
done
{ ldd $D/bin/pretrain_gpt | grep -E "cublas|cudart|nccl|not found"; nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv; nproc; free -g | head -2; df -h /tmp | tail -1; } 2>&1 | tee $O/env.txt
B=$D/bin
pack() { tar czf $OUTD/logs.tgz -C $O . ; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
# 1) op tests (GPU0 / GPU1 in parallel)
( CUDA_VISIBLE_DEVICES=0 timeout 100 $B/gpu_ops_test > $O/gpu_ops_test.log 2>&1; echo "rc $?" >> $O/gpu_ops_test.log ) &
( CUDA_VISIBLE_DEVICES=1 timeout 100 $B/fp8_gpu_test --no-timing > $O/fp8_gpu_test.log 2>&1; echo "rc $?" >> $O/fp8_gpu_test.log ) &
# real data meanwhile on the CPU: LLaMA-3 tokenizer, 32 workers
mkdir -p /tmp/data && cd /tmp/data && tar xzf $D/tok.tar.gz && gzip -dc $D/bench.jsonl.gz > bench.jsonl
( time $B/preprocess_data --input bench.jsonl --output-prefix /tmp/data/llama3 --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model /tmp/data/llama3-tok --append-eod --workers 30 --log-interval 100000000 ) > $O/preprocess.log 2>&1
ls -l /tmp/data >> $O/preprocess.log; cd $R
wait
for f in gpu_ops_test fp8_gpu_test; do echo "== $f: $(grep -cE 'PASS|OK' $O/$f.log) pass-lines, $(grep -ciE 'FAIL' $O/$f.log) fail-lines, $(tail -1 $O/$f.log)"; grep -iE "FAIL" $O/$f.log | head -5; done
tail -3 $O/preprocess.log; pack
# 2) 8B runs. run8b NAME TIMEOUT ENV...
run8b() {
  local n=$1 to=$2; shift 2
  local l; l=$(left); [ "$l" -lt 40 ] && { echo "skip $n (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 500 > $O/$n.mem.csv 2>/dev/null & local smi=$!
  local t1=$(date +%s)
  (cd $R && env "$@" NPROC_PER_NODE=2 LAUNCHER=$B/megatron_launch PRETRAIN_GPT=$R/bench/gpu/llama3_8b_bench_args.sh \
    REAL_PRETRAIN_GPT=$B/pretrain_gpt MASTER_PORT=$((29700 + RANDOM % 200)) timeout $to bash examples/llama/train_llama3_8b_h100_fp8.sh /tmp/ckpt8b /tmp/tb8b $TOKA $DATAA > $O/$n.log 2>&1; echo "rc $?" >> $O/$n.log)
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  local peak; peak=$(awk -F', ' '{if ($2 > m[$1]) m[$1] = $2} END {for (g in m) printf "gpu%s=%sMiB ", g, m[g]}' $O/$n.mem.csv)
  echo "== $n $(( $(date +%s) - t1 ))s peak: $peak $(tail -1 $O/$n.log)"
  grep -E "iteration +[0-9]+/" $O/$n.log | tail -n 3 | cut -c1-400
  grep -iE "^error|error:|what\(\)|out of memory" $O/$n.log | head -3
  pack
}
TOKA=MOCK; DATAA=MOCK
run8b bf16_dp2 130 BENCH_ITERS=6 BENCH_GBS=8 DTYPE=bf16
run8b fp8_dp2 130 BENCH_ITERS=6 BENCH_GBS=8 DTYPE=fp8
run8b bf16_tp2 130 BENCH_ITERS=6 BENCH_GBS=8 DTYPE=bf16 BENCH_TP=2
TOKA=/tmp/data/llama3-tok; DATAA=/tmp/data/llama3_text_document
run8b bf16_dp2_real 120 BENCH_ITERS=5 BENCH_GBS=8 DTYPE=bf16
TOKA=MOCK; DATAA=MOCK
run8b fp8_tp2 120 BENCH_ITERS=6 BENCH_GBS=8 DTYPE=fp8 BENCH_TP=2
echo "#### done $(( $(date +%s) - T0 )) s"; pack
