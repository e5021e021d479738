// Parameter initialization on the GPU (tensor_parallel::initialize_parameter for CUDA tensors):
// the same counter-based N(0, std) draw as the host path (random.h: splitmix64 keyed by
// (seed, name), Box-Muller in double on the element's GLOBAL index), computed by one thread per
// element and rounded once to the parameter's dtype -- no host buffer, no host->device copy.
// Values equal the host path's except where CUDA's double log/cos (<= 1-2 ulp, CUDA math
// documentation) and glibc's round differently AND that moves the float result: about 1 element in
// 10^8 may differ by one fp32 ulp (before rounding to bf16). --use-cpu-initialization keeps the
// host path (bit-identical to a CPU run).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
namespace {

__device__ __forceinline__ uint64_t sm64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Layout {
  int nd;
  int64_t local[NormalInitSpec::kMaxDims];
  int64_t global[NormalInitSpec::kMaxDims];
  int partition_dim;  // -1: the local index is the global one
  int64_t stride, tp_rank;
};

__device__ __forceinline__ uint64_t global_index(const Layout& L, int64_t i) {
  if (L.partition_dim < 0) return static_cast<uint64_t>(i);
  int64_t idx[NormalInitSpec::kMaxDims];
  int64_t rem = i;
  for (int d = L.nd - 1; d >= 0; --d) {
    idx[d] = rem % L.local[d];
    rem /= L.local[d];
  }
  const int pd = L.partition_dim;
  const int64_t block = L.local[pd] / L.stride;
  const int64_t blk = idx[pd] / block, within = idx[pd] % block;
  idx[pd] = blk * (L.global[pd] / L.stride) + L.tp_rank * block + within;
  int64_t flat = 0;
  for (int d = 0; d < L.nd; ++d) flat = flat * L.global[d] + idx[d];
  return static_cast<uint64_t>(flat);
}


template <class T>
__global__ void normal_init_kernel(T* out, int64_t n, uint64_t key, float std_, Layout L) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t g = global_index(L, i);
    const uint64_t a = sm64(key ^ sm64(2 * g));
    const uint64_t b = sm64(key ^ sm64(2 * g + 1));
    const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
    const float z = static_cast<float>(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
    out[i] = detail::from_f<T>(std_ * z);
  }
}

}  // namespace

bool normal_init(Tensor& out, const NormalInitSpec& s) {
  if (!out.is_cuda() || s.nd > NormalInitSpec::kMaxDims) return false;
  Layout L{};
  L.nd = s.nd;
  for (int d = 0; d < s.nd; ++d) L.local[d] = s.local[d], L.global[d] = s.global[d];
  L.partition_dim = s.partition_dim;
  L.stride = s.stride;
  L.tp_rank = s.tp_rank;
  const int64_t n = out.numel();
  if (n == 0) return true;
  CUDA_CHECK(cudaSetDevice(out.device().index));
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535LL * 8);
  cudaStream_t st = megatron::cuda::current_stream();
  switch (out.dtype()) {
    case DType::kFloat32:
      normal_init_kernel<<<blocks, threads, 0, st>>>(out.data<float>(), n, s.key, s.std, L);
      break;
    case DType::kBFloat16:
      normal_init_kernel<<<blocks, threads, 0, st>>>(static_cast<__nv_bfloat16*>(out.data_ptr()), n, s.key, s.std, L);
      break;
    case DType::kFloat16:
      normal_init_kernel<<<blocks, threads, 0, st>>>(static_cast<__half*>(out.data_ptr()), n, s.key, s.std, L);
      break;
    default: return false;
  }
  CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace megatron::ops::cuda
