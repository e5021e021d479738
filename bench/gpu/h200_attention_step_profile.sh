#!/bin/bash
# One GPU-machine call: cuDNN SDPA correctness (gpu_ops_test), attention bench (ours: cuDNN graph and
# flash kernels; PyTorch SDPA peers), pretrain_gpt GPT-2 124M and LLaMA-3-8B-shaped (4 layers) with
# cuDNN and with our attention, an ncu per-kernel profile of 3 iterations of each (summarize with
# bench/gpu/ncu_step_profile.py), compute-sanitizer on the small shapes.
# Layout: put pretrain_gpt, gpu_ops_test, gpu_bench, torch_peers.py and lib.tar.xz (non-CUDA shared
# libs of the build machine: lib/*.so*) next to this script in a carried folder, e.g. .device/NAME/.
# usage: h200_attention_step_profile.sh [steps]   steps: any of t,b,e,p,s (test, bench, e2e,
# profile, sanitizer); default all. Logs under $OUT (logs.tgz, ncu_*.csv.gz). Used for the
# 2026-11-29 gpuattn figures in docs/performance.md (the second call ran `gpu_bench mem`, only the
# cuDNN e2e runs, and --lr-warmup-iters 1 for the 3-iteration GPT-2 profile).
D=$(cd "$(dirname "$0")" && pwd); O=${OUT:-/tmp/out}; L=/tmp/gl_logs; mkdir -p $O $L
STEPS=${1:-tbeps}; BUDGET=${BUDGET:-190}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_VISIBLE_DEVICES=0
mkdir -p /tmp/gl && tar xJf $D/lib.tar.xz -C /tmp/gl
NV=$(python3 -c 'import nvidia,glob,os;print(":".join(d for p in nvidia.__path__ for g in ("*/lib","*/*/lib") for d in sorted(glob.glob(os.path.join(p,g)))))' 2>/dev/null)
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl/lib
pack() { tar czf $O/logs.tgz -C $L . 2>/dev/null; }
left() { [ $SECONDS -lt $BUDGET ]; }
ldd $D/pretrain_gpt | grep -E "not found"; echo "NV=$NV"; for d in $(echo $NV | tr : ' '); do ls $d | grep -q "libcudnn.so.9" && echo "cudnn in $d"; done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee $L/gpu.txt
COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 64 --global-batch-size 64"
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --global-batch-size 1 --bf16 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput"
if [[ $STEPS == *t* ]]; then
  echo "== gpu_ops_test"; timeout 120 $D/gpu_ops_test > $L/gpu_ops_test.log 2>&1; echo "rc $?" >> $L/gpu_ops_test.log
  grep -E "FAIL|cudnn.*(s=128|s=256)|checks passed|cuDNN" $L/gpu_ops_test.log | head -40; pack
fi
if [[ $STEPS == *b* ]] && left; then
  echo "== gpu_bench attention"; timeout 60 $D/gpu_bench attention > $L/gpu_bench.log 2>&1; grep -E "attention" $L/gpu_bench.log
  echo "== torch peers"; PYTHONUNBUFFERED=1 timeout 60 python3 $D/torch_peers.py attention > $L/torch_peers.log 2>&1; grep -E "sdpa|torch" $L/torch_peers.log; pack
fi
run_e2e() {  # name backend args...
  local n=$1 be=$2; shift 2
  MEGATRON_ATTENTION_BACKEND=$be MEGATRON_CUDNN_VERBOSE=1 timeout 70 $D/pretrain_gpt "$@" $COMMON > $L/$n.log 2>&1; echo "rc $?" >> $L/$n.log
  echo "-- $n"; grep -E "iteration|rc |cuDNN|rror" $L/$n.log | sed -E 's/ \| (consumed samples|learning rate|global batch size|loss scale|number of skipped|number of nan)[^|]*//g' | tail -4; pack
}
if [[ $STEPS == *e* ]] && left; then
  echo "== e2e"
  run_e2e gpt2_cudnn auto $GPT2 --train-iters 25 --log-interval 5
  run_e2e llama_cudnn auto $LL --train-iters 12 --log-interval 4
  left && run_e2e gpt2_flash flash $GPT2 --train-iters 25 --log-interval 5
  left && run_e2e llama_flash flash $LL --train-iters 12 --log-interval 4
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [[ $STEPS == *p* ]] && left && [ -n "$NCU" ]; then
  echo "== ncu kernel times ($NCU)"
  for m in gpt2 llama; do
    left || break
    if [ $m = gpt2 ]; then A="${GPT2/--lr-warmup-iters 5/--lr-warmup-iters 1} --train-iters 3 --log-interval 1"; else A="$LL --train-iters 3 --log-interval 1"; fi
    timeout 100 $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
      --print-units base $D/pretrain_gpt $A $COMMON > $L/ncu_$m.csv 2> $L/ncu_$m.err; echo "ncu $m rc $? $(wc -l < $L/ncu_$m.csv) lines"
    grep -E "iteration" $L/ncu_$m.csv | tail -1 | cut -c1-120; tail -2 $L/ncu_$m.err; gzip -c $L/ncu_$m.csv > $O/ncu_$m.csv.gz; rm $L/ncu_$m.csv; pack
  done
fi
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ $STEPS == *s* ]] && left && [ -x "$SAN" ]; then
  echo "== compute-sanitizer (small shapes)"
  timeout 60 $SAN --tool memcheck --error-exitcode 3 $D/gpu_ops_test --small --only attention,elementwise > $L/memcheck.log 2>&1; echo "memcheck rc $?"; tail -2 $L/memcheck.log
  left && { timeout 60 $SAN --tool racecheck --error-exitcode 3 $D/gpu_ops_test --small --only attention > $L/racecheck.log 2>&1; echo "racecheck rc $?"; tail -2 $L/racecheck.log; }
  pack
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader; echo "total ${SECONDS}s"; pack
