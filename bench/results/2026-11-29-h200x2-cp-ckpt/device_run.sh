#!/bin/bash
# Lead's device run (two H200): context parallel on GPUs (correctness vs CPU fp32 CP1 and GPU CP1;
# throughput/memory at seq 16k/32k CP1 vs CP2), GPU checkpoint save/resume (1 GPU, DP2+distopt),
# then LLaMA-3 8B DP2 with what time remains. Logs -> $OUT/logs.tgz.
R=$(pwd); D=$(cd "$(dirname "$0")" && pwd); O=/tmp/o; mkdir -p $O; OUTD=${OUT:-/tmp/out}; mkdir -p $OUTD
T0=$(date +%s); DEADLINE=${DEADLINE:-480}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $D/bin && tar xJf $D/bin.tar.xz -C $D/bin && mkdir -p /tmp/gl && tar xJf $D/lib.tar.xz -C /tmp/gl
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl/lib
for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2 libcudnn.so.9; do
  if ! ldd $D/bin/pretrain_gpt | grep -q "$l => /"; then
    d=$(dirname "$(find / -xdev -name "$l" 2>/dev/null | head -1)"); export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; fi
done
{ ldd $D/bin/pretrain_gpt | grep -E "cublas|cudart|nccl|not found"; nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv; } 2>&1 | tee $O/env.txt
B=$D/bin; P=29700
pack() { tar czf $OUTD/logs.tgz -C $O . ; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
# run NAME NPROC TIMEOUT ARGS...   (NPROC 1: cuda:0 only)
run() {
  local n=$1 np=$2 to=$3; shift 3
  local l; l=$(left); [ "$l" -lt 15 ] && { echo "skip $n (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > $O/$n.mem.csv 2>/dev/null & local smi=$!
  local t1=$(date +%s)
  if [ "$np" = 1 ]; then CUDA_VISIBLE_DEVICES=0 timeout $to $B/pretrain_gpt "$@" > $O/$n.log 2>&1
  else P=$((P+1)); timeout $to $B/megatron_launch --nproc-per-node $np --master-port $P $B/pretrain_gpt "$@" > $O/$n.log 2>&1; fi
  local rc=$?; kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "rc $rc" >> $O/$n.log
  local peak; peak=$(awk -F', ' '{if ($2 > m[$1]) m[$1] = $2} END {for (g in m) printf "gpu%s=%sMiB ", g, m[g]}' $O/$n.mem.csv)
  echo "== $n rc=$rc $(( $(date +%s) - t1 ))s peak: $peak"
  grep -E "iteration +[0-9]+/" $O/$n.log | tail -n 2 | cut -c1-330
  grep -E "^error|Error|what\(\)" $O/$n.log | head -3
  pack
}
C="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
TL="--num-layers 2 --hidden-size 256 --ffn-hidden-size 512 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --kv-channels 64 --seq-length 256 --max-position-embeddings 256 --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 4 --weight-decay 0.1 --clip-grad 1.0 --vocab-size 128 --make-vocab-size-divisible-by 64 --log-interval 1"
# 1) CP correctness (bf16 on GPU; the CPU fp32 CP1 reference log travels in $D/ref)
run cp1_gpu 1 60 $TL $C --train-iters 20 --bf16
run cp2_gpu 2 60 $TL $C --train-iters 20 --bf16 --context-parallel-size 2
run cp2_a2a_gpu 2 60 $TL $C --train-iters 20 --bf16 --context-parallel-size 2 --cp-comm-type a2a
# 2) GPU checkpoints: 8 straight iterations saving at 4, then resume from 4
run ck1_a 1 60 $TL $C --train-iters 8 --bf16 --save /tmp/ck1 --save-interval 4
rm -rf /tmp/ck1/iter_0000008; echo 4 > /tmp/ck1/latest_checkpointed_iteration.txt
run ck1_b 1 60 $TL $C --train-iters 8 --bf16 --load /tmp/ck1
run ck1_ft 1 60 $TL $C --train-iters 6 --bf16 --load /tmp/ck1 --finetune
run ck2_a 2 60 $TL $C --train-iters 8 --bf16 --use-distributed-optimizer --save /tmp/ck2 --save-interval 4
rm -rf /tmp/ck2/iter_0000008; echo 4 > /tmp/ck2/latest_checkpointed_iteration.txt
run ck2_b 2 60 $TL $C --train-iters 8 --bf16 --use-distributed-optimizer --load /tmp/ck2
# 3) CP throughput and memory: LLaMA-3-8B-shaped 4 layers, seq 16k / 32k, CP1 (1 GPU) vs CP2 (2 GPUs)
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --train-iters 8 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput"
for S in 16384 32768; do
  run ll_s${S}_cp1 1 75 $LL $C --seq-length $S --max-position-embeddings $S
  run ll_s${S}_cp2 2 75 $LL $C --seq-length $S --max-position-embeddings $S --context-parallel-size 2
done
# 4) LLaMA-3 8B (32 layers), DP2 + distributed optimizer, the example script's flags, with the rest
if [ "$(left)" -gt 60 ]; then
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > $O/8b.mem.csv 2>/dev/null & smi=$!
  (cd $R && BENCH_ITERS=4 BENCH_GBS=4 NPROC_PER_NODE=2 LAUNCHER=$B/megatron_launch PRETRAIN_GPT=$R/bench/gpu/llama3_8b_bench_args.sh \
    REAL_PRETRAIN_GPT=$B/pretrain_gpt MASTER_PORT=29791 timeout $(( $(left) - 5 )) bash examples/llama/train_llama3_8b_h100_fp8.sh /tmp/ckpt8b /tmp/tb8b > $O/8b_dp2.log 2>&1; echo "rc $?" >> $O/8b_dp2.log)
  kill $smi 2>/dev/null
  grep -E "iteration +[0-9]+/|error|rc " $O/8b_dp2.log | cut -c1-400 | tail -n 6
  awk -F', ' '{if ($2 > m[$1]) m[$1] = $2} END {for (g in m) print "8b peak memory.used GPU " g ": " m[g] " MiB"}' $O/8b.mem.csv
fi
echo "#### done $(( $(date +%s) - T0 )) s"; pack
