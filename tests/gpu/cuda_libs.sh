# Sourced by the GPU check scripts (tests/gpu/*.sh): puts the CUDA libraries a CUDA build links
# ahead on LD_LIBRARY_PATH: the toolkit's lib64 (and its CUPTI), then the PyTorch wheel's
# nvidia/*/lib folders (cuBLASLt, cuDNN, CUPTI on the GPU machine, where the toolkit lacks them).
_cuda_libs=""
for _d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/extras/CUPTI/lib64 \
    $(python3 -c 'import glob,os,nvidia;[print(d) for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p,"*","lib")))]' 2>/dev/null); do
  [ -d "$_d" ] && _cuda_libs="$_cuda_libs:$_d"
done
export LD_LIBRARY_PATH="${_cuda_libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _cuda_libs _d
