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
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --train-iters 8 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput"
for S in 16384 32768; do
  run ll_s${S}_cp2 2 55 $LL $C --seq-length $S --max-position-embeddings $S --context-parallel-size 2
done
echo "#### done $(( $(date +%s) - T0 )) s"; pack
