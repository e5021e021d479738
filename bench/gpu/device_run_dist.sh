#!/bin/bash
# Copy of .device/gpudist/run.sh (the device-side driver of the 2026-11-29 two-H200 runs), kept for
# reproducibility. Bundle layout next to it: bin.tar.xz (build/bin/{pretrain_gpt,megatron_launch,
# unit_tests}), lib.tar.xz (lib/: the non-CUDA shared libraries of `ldd build/bin/pretrain_gpt`
# missing on the GPU image: ICU, sentencepiece, simdjson, Open MPI, OpenBLAS, hwloc, libevent ...),
# ompi.tar.xz (Open MPI 4.1.4 + PMIx files of the Debian packages openmpi-bin, libopenmpi3,
# openmpi-common, libpmix2, used through OPAL_PREFIX when the image has no mpirun), repo/ (bench/gpu,
# examples/llama, tests/gpu scripts). Run: `DEADLINE=<s> bash run.sh "nccl tiny ll 8b"`.
# gpudist device run: NCCL tests, DP2/TP2 correctness (bf16 vs CPU fp32 refs made elsewhere),
# DP2 throughput (LLaMA-3-8B-shaped 4 layers), LLaMA-3 8B on two H200. Logs -> $OUT/logs.tgz.
D=$(cd "$(dirname "$0")" && pwd); O=/tmp/o; mkdir -p $O; OUTD=${OUT:-/tmp/out}; mkdir -p $OUTD
PARTS=${1:-"nccl 8b tiny"}
T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
tar xJf $D/bin.tar.xz -C $D && mkdir -p /tmp/gl && tar xJf $D/lib.tar.xz -C /tmp/gl && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gl/lib
for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2 libcudnn.so.9; do  # cuDNN is dlopen()ed (attention)
  if ! ldd $D/bin/pretrain_gpt | grep -q "$l => /"; then
    d=$(dirname "$(find / -xdev -name "$l" 2>/dev/null | head -1)"); export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; fi
done
if ! command -v mpirun >/dev/null; then
  R=/tmp/ompi; mkdir -p $R /tmp/ompibin && tar xJf $D/ompi.tar.xz -C $R && ln -sf $R/usr/bin/orterun /tmp/ompibin/mpirun
  export OPAL_PREFIX=$R/usr PMIX_INSTALL_PREFIX=$R/usr/lib/x86_64-linux-gnu/pmix2 PATH=/tmp/ompibin:$R/usr/bin:$PATH
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$R/usr/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu/openmpi/lib:$R/usr/lib/x86_64-linux-gnu/pmix2/lib
  echo "mpirun: carried Open MPI 4.1.4" | tee $O/env.txt
fi
{ ldd $D/bin/pretrain_gpt | grep -E "cublas|cudart|nccl|not found"; nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm --format=csv
  nvidia-smi topo -m; nproc; free -g | head -2; mpirun --version | head -1; } 2>&1 | tee -a $O/env.txt
# unit_tests reads fixtures from its compile-time source dir at start-up (/work/wt/cuda).
[ -e /work/wt/cuda/tests ] || { mkdir -p /work/wt && ln -sfn "$(pwd)" /work/wt/cuda; }
pack() { tar czf $OUTD/logs.tgz -C $O . ; }
cd $D/repo
for p in $PARTS; do
  echo "#### $p $(( $(date +%s) - T0 )) s"
  case $p in
    nccl) timeout $(( ${DEADLINE:-400} - ($(date +%s) - T0) > 10 ? ${DEADLINE:-400} - ($(date +%s) - T0) : 10 )) bash tests/gpu/run_nccl_tests.sh $D 2>&1 | tee $O/nccl_tests.txt ;;
    *) export BENCH_TIMEOUT=$(( ${DEADLINE:-400} - ($(date +%s) - T0) ))
       bash bench/gpu/pretrain_gpt_dist.sh $D/bin $O/$p gpu $p 2>&1 | tee $O/$p.txt ;;
  esac
  pack
done
echo "#### done $(( $(date +%s) - T0 )) s"
pack
