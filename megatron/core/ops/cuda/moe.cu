// MoE helper kernels (op_table.h, moegemm block; docs/moe.md "Kernels").
// row_dot_f64: the experts' d probs, one block per row; each thread sums its strided share of the
// float-widened products in float64, then a warp-shuffle + shared-memory tree in float64.
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
using namespace detail;
namespace {

template <class T>
__global__ void row_dot_f64_kernel(const T* __restrict__ a, const T* __restrict__ b, int64_t h,
                                   double* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const T* pa = a + r * h;
  const T* pb = b + r * h;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) s += (double)to_f(pa[j]) * (double)to_f(pb[j]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
  __shared__ double warp[32];
  const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
  if (lane == 0) warp[wid] = s;
  __syncthreads();
  if (wid == 0) {
    s = lane < (int)(blockDim.x / 32) ? warp[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) out[r] = s;
  }
}

}  // namespace

void row_dot_f64(const Tensor& a, const Tensor& b, Tensor& out) {
  check_cuda(a, "row_dot_f64");
  check_cuda(out, "row_dot_f64");
  const int64_t h = a.dim() ? a.size(-1) : 1, n = h ? a.numel() / h : 0;
  MEGATRON_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype() && b.is_cuda() && out.dtype() == DType::kFloat64 &&
                 out.numel() == n)
      << "row_dot_f64 " << a.str() << " vs " << b.str() << " -> " << out.str();
  if (n == 0) return;
  MEGATRON_CHECK(n <= 0x7fffffffLL) << "row_dot_f64: " << n << " rows";
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_FLOAT_SWITCH(a.dtype(), T,
                   row_dot_f64_kernel<T><<<(unsigned)n, 256, 0, st>>>(static_cast<const T*>(a.data_ptr()),
                                                                      static_cast<const T*>(b.data_ptr()), h,
                                                                      static_cast<double*>(out.data_ptr())));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
