# Common setup for the lead's device calls: binaries (bin.tar.xz) and non-CUDA libraries
# (lib.tar.xz) from this folder; CUDA libraries from the image / PyTorch wheel; helpers.
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); R=$(pwd); O=/tmp/o; mkdir -p $O; OUTD=${OUT:-/tmp/out}; mkdir -p $OUTD
T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $D/bin && tar xJf $D/bin.tar.xz -C $D/bin && mkdir -p /tmp/gl && tar xJf $D/lib.tar.xz -C /tmp/gl
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl/lib
for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2 libcudnn.so.9 libcupti.so.13; do
  if ! ldd $D/bin/pretrain_gpt | grep -q "$l => /"; then
    d=$(dirname "$(find / -xdev -name "$l" 2>/dev/null | head -1)"); [ "$d" != . ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; fi
done
B=$D/bin
pack() { find $O -name "*.log" -size -3M -o -name "*.txt" -size -1M -o -name "*.csv" -size -2M | tar czf $OUTD/logs.tgz -T - 2>/dev/null; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
# step NAME TIMEOUT CMD...: runs CMD with a timeout capped by the deadline; log in $O/NAME.log
step() {
  local n=$1 to=$2; shift 2
  local l; l=$(left); [ "$l" -lt 20 ] && { echo "skip $n (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local t1=$(date +%s)
  timeout $to "$@" > $O/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc $(( $(date +%s) - t1 ))s"; pack; return $rc
}
# run8b NAME TIMEOUT ENV...: the LLaMA-3 8B example script on both GPUs ($TOKA/$DATAA, default mock)
run8b() {
  local n=$1 to=$2; shift 2
  local l; l=$(left); [ "$l" -lt 40 ] && { echo "skip $n (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 500 > $O/$n.mem.csv 2>/dev/null & local smi=$!
  local t1=$(date +%s)
  (cd $R && env "$@" LAUNCHER=$B/megatron_launch PRETRAIN_GPT=$R/bench/gpu/llama3_8b_bench_args.sh \
    REAL_PRETRAIN_GPT=$B/pretrain_gpt MASTER_PORT=$((29700 + RANDOM % 200)) timeout $to bash examples/llama/train_llama3_8b_h100_fp8.sh /tmp/ckpt8b /tmp/tb8b ${TOKA:-MOCK} ${DATAA:-MOCK} > $O/$n.log 2>&1; echo "rc $?" >> $O/$n.log)
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  local peak; peak=$(awk -F', ' '{if ($2 > m[$1]) m[$1] = $2} END {for (g in m) printf "gpu%s=%sMiB ", g, m[g]}' $O/$n.mem.csv)
  echo "== $n $(( $(date +%s) - t1 ))s peak: $peak $(tail -1 $O/$n.log)"
  grep -E "iteration +[0-9]+/|validation loss|Successfully|saving|loading|loaded" $O/$n.log | tail -n 4 | cut -c1-330
  grep -E "time across ranks|setup|allocated" $O/$n.log | head -6 | cut -c1-200
  grep -iE "^error|error:|what\(\)|out of memory" $O/$n.log | head -3
  pack
}
{ ldd $B/pretrain_gpt | grep -E "cublas|cudart|nccl|not found"; nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv; nproc; df -h /tmp | tail -1; } > $O/env.txt 2>&1
