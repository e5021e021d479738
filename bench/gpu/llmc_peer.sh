#!/usr/bin/env bash
# The llm.c peer of the GPT-2 124M benchmark (issue 21: "llm.c built from source at a fixed commit,
# measured in the same run"). Nothing of llm.c is committed here: the build step unpacks it from the
# local mirror at the pinned commit into a git-ignored folder and builds it there.
#
#   bench/gpu/llmc_peer.sh build OUTDIR
#       On the build machine (CUDA 13 toolkit with cuDNN 9 headers, no GPU needed): builds llm.c's
#       train_gpt2cu for sm_90 with cuDNN attention (USE_CUDNN=1) at LLMC_COMMIT, with the
#       cudnn-frontend headers at CUDNN_FE_COMMIT. OUTDIR (git-ignored, e.g. .device/peers/llmc)
#       receives train_gpt2cu (stripped), llmc_commit.txt and build.log; it is small enough to carry
#       to the GPU machine.
#   bench/gpu/llmc_peer.sh run LLMC_DIR DATADIR GBS STEPS LOG
#       On the GPU machine: writes (once) a random-token train and val shard in DATADIR with
#       bench/gpu/llmc_data.py, runs LLMC_DIR/train_gpt2cu for GPT-2 124M from random init, micro-batch
#       64, seq 1024, GBS sequences per step, STEPS steps, into LOG, and prints
#         PEER llmc GBS=<GBS>: ms/iter <mean of steps 3..STEPS> tokens/s <GBS*1024*1000/ms> steps <n>
#       or "PEER llmc GBS=<GBS> FAILED <reason>" (exit 1).
#   bench/gpu/llmc_peer.sh parse LOG GBS
#       Only the parsing of the run mode (for tests on sample lines).
#
# Environment: LLMC_MIRROR, CUDNN_FE_MIRROR (bare git dirs), NVCC (default /usr/local/cuda/bin/nvcc),
# LLMC_TIMEOUT (seconds, run mode, default 200), LLMC_ARGS (run mode: more train_gpt2cu flags,
# appended), CUDA_VISIBLE_DEVICES (default 0).
set -u
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)

# Pinned sources: llm.c master (PR #801 merge, 2025-05-10) and cudnn-frontend main (2026-05-08),
# the newest commits of the local mirrors when this script was written.
LLMC_COMMIT=f1e2ace651495b74ae22d45d1723443fd00ecd3a
CUDNN_FE_COMMIT=3929da2ef4c1dba1bb8acb68727b9134f26f40c0
LLMC_MIRROR=${LLMC_MIRROR:-/work/.mirror/karpathy+llm.c/repo}
CUDNN_FE_MIRROR=${CUDNN_FE_MIRROR:-/work/.mirror/NVIDIA+cudnn-frontend/repo}

# parse LOG GBS: llm.c prints one line per step,
#   "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s"
# (train_gpt2.cu). Mean of the ms of steps 3..N (steps 1-2 carry cuDNN plan building and warm-up).
parse() {
  local log=$1 gbs=$2
  awk -v gbs="$gbs" '
    /^step +[0-9]+\/[0-9]+ \|/ {
      split($2, a, "/"); s = a[1] + 0
      for (i = 3; i <= NF; i++) if ($i == "ms" && $(i-1) ~ /^[0-9.]+$/) { ms = $(i-1) + 0; break }
      if (i > NF) next
      n_all++; if (s >= 3) { sum += ms; n++; per = per sprintf(" %.2f", ms) }
    }
    END {
      if (n == 0) { printf "PEER llmc GBS=%s FAILED no step lines from step 3 on (%d step lines in all)\n", gbs, n_all; exit 1 }
      m = sum / n
      printf "PEER llmc GBS=%s: ms/iter %.2f tokens/s %.0f steps %d (steps 3..%d:%s)\n", gbs, m, gbs * 1024 * 1000.0 / m, n, s, per
    }' "$log"
}

build() {
  local out=${1:?usage: llmc_peer.sh build OUTDIR}
  mkdir -p "$out"; out=$(cd "$out" && pwd)
  local src="$out.build"  # sibling build tree (also git-ignored when OUTDIR is under .device/)
  local nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
  # llm.c's Makefile looks for the frontend headers in ./cudnn-frontend/include (or $HOME's).
  rm -rf "$src"; mkdir -p "$src/llmc/cudnn-frontend"
  git --git-dir="$LLMC_MIRROR" archive "$LLMC_COMMIT" | tar x -C "$src/llmc" || { echo "llmc_peer.sh: cannot unpack llm.c $LLMC_COMMIT" >&2; return 1; }
  git --git-dir="$CUDNN_FE_MIRROR" archive "$CUDNN_FE_COMMIT" include | tar x -C "$src/llmc/cudnn-frontend" \
    || { echo "llmc_peer.sh: cannot unpack cudnn-frontend $CUDNN_FE_COMMIT" >&2; return 1; }
  cd "$src/llmc" || return 1
  # Build-time edits for CUDA 13 (the only changes to llm.c's source; applied to the unpacked copy):
  # 1. NVML: the toolkit here ships no nvml.h and no libnvidia-ml stub. llm.c's mfu.h already falls
  #    back to "no NVML" without nvml.h; make that explicit and drop -lnvidia-ml from the link line.
  #    NVML only serves its optional GPU-state logging (-lg, off by default).
  sed -i 's/^#if __has_include(<nvml.h>)$/#if 0 \/\/ NVML disabled by bench\/gpu\/llmc_peer.sh/' llmc/mfu.h
  sed -i 's/^\( *NVCC_LDFLAGS += -lnvidia-ml\)$/# \1  (removed by bench\/gpu\/llmc_peer.sh)/' Makefile
  # 2. Managed-memory fallback: CUDA 13 removed the cudaMemAdvise overload taking a device id
  #    (cudaCpuDeviceId); drop that advice call. The fallback to cudaMallocManaged on OOM stays, it
  #    only loses its "prefer host" hint; GPT-2 124M never reaches it on an H200.
  sed -i '/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/d' llmc/cuda_utils.cuh
  # 3. cudnn-frontend at the pinned commit compiles kernels with NVRTC (its experimental engines),
  #    so the link line needs -lnvrtc (libnvrtc.so.13: the PyTorch wheel's nvidia/cu13/lib or
  #    cuda_nvrtc/lib on the GPU machine).
  sed -i 's/^\( *NVCC_LDFLAGS += -lcudnn\)$/\1 -lnvrtc/' Makefile
  grep -q '^ *NVCC_LDFLAGS += -lcudnn -lnvrtc$' Makefile && grep -q 'NVML disabled by bench' llmc/mfu.h && ! grep -q 'cudaCpuDeviceId' llmc/cuda_utils.cuh \
    && ! grep -q '^ *NVCC_LDFLAGS += -lnvidia-ml' Makefile || { echo "llmc_peer.sh: a build-time edit did not apply" >&2; return 1; }
  # Make variables: sm_90 only, cuDNN attention on, no NCCL/MPI (one GPU), bf16 (its default).
  local mk=(make train_gpt2cu NVCC="$nvcc" GPU_COMPUTE_CAPABILITY=90 USE_CUDNN=1
            CUDNN_FRONTEND_PATH=cudnn-frontend/include NO_MULTI_GPU=1 NO_USE_MPI=1 PRECISION=BF16)
  echo "${mk[*]}" > "$out/build_command.txt"
  PATH="$(dirname "$nvcc"):$PATH" nice -n 10 "${mk[@]}" > "$out/build.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] || [ ! -x train_gpt2cu ]; then tail -30 "$out/build.log" >&2; echo "llmc_peer.sh: build failed (rc $rc), log $out/build.log" >&2; return 1; fi
  cp train_gpt2cu "$out/train_gpt2cu" && strip "$out/train_gpt2cu"
  { echo "llm.c $LLMC_COMMIT"; echo "cudnn-frontend $CUDNN_FE_COMMIT"; "$nvcc" --version | tail -1
    grep -h -E '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ' "$(dirname "$nvcc")/../include/cudnn_version.h" 2>/dev/null | awk '{printf "%s ", $3} END {print "(cuDNN headers)"}'
  } > "$out/llmc_commit.txt"
  echo "llmc_peer.sh: built $out/train_gpt2cu ($(du -h "$out/train_gpt2cu" | cut -f1)); $(head -1 "$out/llmc_commit.txt")"
}

run() {
  local dir=${1:?usage: llmc_peer.sh run LLMC_DIR DATADIR GBS STEPS LOG} data=${2:?} gbs=${3:?} steps=${4:?} log=${5:?}
  # GBS sequences of 1024 per step in micro-batches of 64: a positive multiple of 64; STEPS >= 3
  # (the figure is the mean of steps 3..STEPS).
  if ! [[ "$gbs" =~ ^[0-9]+$ ]] || [ "$gbs" -lt 64 ] || [ $((gbs % 64)) -ne 0 ]; then
    echo "PEER llmc GBS=$gbs FAILED GBS must be a positive multiple of 64 (the micro-batch), got '$gbs'"; return 1
  fi
  if ! [[ "$steps" =~ ^[0-9]+$ ]] || [ "$steps" -lt 3 ]; then
    echo "PEER llmc GBS=$gbs FAILED STEPS must be an integer >= 3 (the figure is the mean of steps 3..STEPS), got '$steps'"; return 1
  fi
  [ -d "$dir" ] && dir=$(cd "$dir" && pwd)  # absolute: llm.c runs in DATADIR
  local bin=$dir/train_gpt2cu
  [ -x "$bin" ] || { echo "PEER llmc GBS=$gbs FAILED no $bin (build it with: bench/gpu/llmc_peer.sh build .device/peers/llmc)"; return 1; }
  # cuBLAS/cuDNN/NVRTC as our GPU scripts find them (toolkit lib64, then the PyTorch wheel's nvidia/*/lib).
  source "$ROOT/tests/gpu/cuda_libs.sh"
  # Any library ldd still misses (libcublasLt.so.13, libcudnn.so.9, libnvrtc.so.13): found anywhere
  # on the disk, as tests/gpu/gpucheck_lib.sh does for pretrain_gpt.
  local l f missing
  for l in $(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}'); do
    f=$(find / -xdev -name "$l" 2>/dev/null | head -1); [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
  done
  missing=$(ldd "$bin" 2>/dev/null | awk '/not found/ {printf "%s ", $1}')
  [ -z "$missing" ] || { echo "PEER llmc GBS=$gbs FAILED libraries not found: $missing(LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"; return 1; }
  mkdir -p "$data" "$(dirname "$log")" && data=$(cd "$data" && pwd)  # absolute: llm.c runs in it
  # Train shard: 4096 sequences of 1024 tokens (+1): 64 micro-batches of 64, i.e. 64 steps at gbs
  # 64 or 8 at gbs 512 before llm.c's loader starts the shard again (reshuffled), so any STEPS works.
  if [ ! -f "$data/llmc_train_000000.bin" ] || [ ! -f "$data/llmc_val_000000.bin" ]; then
    python3 "$HERE/llmc_data.py" "$data/llmc_train_000000.bin" --tokens 4194305 --seed 1234 \
      && python3 "$HERE/llmc_data.py" "$data/llmc_val_000000.bin" --tokens 65537 --seed 4321 \
      || { echo "PEER llmc GBS=$gbs FAILED cannot write data shards in $data"; return 1; }
  fi
  # GPT-2 124M from random init (-e d12), micro-batch 64, seq 1024, GBS*1024 tokens per step (-d,
  # gradient accumulation GBS/64), STEPS steps (-x). Sampling, HellaSwag and checkpoints off
  # (-s 0, -h 0, -n 0, no -o). llm.c always evaluates the val loss before step 1 and after the last
  # step (outside its step timing); -v huge stops the periodic ones and -m 1 makes each one batch.
  # Everything else at llm.c's defaults: bf16, lr 3e-4 cosine, no weight decay, grad clip 1.0,
  # fp32 master weights (-w 1), recompute GELU (-r 1), GELU fusion 2 on SM90, ZeRO stage 0, tf32 on.
  local cmd=("$bin" -i "$data/llmc_train_*.bin" -j "$data/llmc_val_*.bin" -e d12 -b 64 -t 1024
             -d $((gbs * 1024)) -x "$steps" -v 1000000 -m 1 -s 0 -h 0 -n 0)
  # LLMC_ARGS: more train_gpt2cu flags, appended (e.g. "-r 0": no GELU recompute, llm.c's faster
  # setting when memory allows).
  [ -n "${LLMC_ARGS:-}" ] && read -r -a extra <<< "$LLMC_ARGS" && cmd+=("${extra[@]}")
  echo "command: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout ${LLMC_TIMEOUT:-200} ${cmd[*]}" > "$log"
  # llm.c reads gpt2_tokenizer.bin from the working directory only for sampling and warns without
  # it; run from DATADIR so no stray file is picked up.
  (cd "$data" && CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout "${LLMC_TIMEOUT:-200}" "${cmd[@]}") >> "$log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "PEER llmc GBS=$gbs FAILED rc $rc ($(grep -v '^step ' "$log" | tail -2 | tr '\n' ' ' | cut -c1-200))"; return 1
  fi
  parse "$log" "$gbs"
}

mode=${1:?usage: llmc_peer.sh build OUTDIR | run LLMC_DIR DATADIR GBS STEPS LOG | parse LOG GBS}; shift
case $mode in
  build) build "$@" ;;
  run) run "$@" ;;
  parse) parse "$@" ;;
  *) echo "llmc_peer.sh: unknown mode '$mode' (build, run, parse)" >&2; exit 2 ;;
esac
