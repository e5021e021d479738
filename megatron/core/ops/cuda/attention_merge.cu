// ops.h attention_merge_ on CUDA: the log-sum-exp merge of two partial attention results over
// disjoint key sets (online softmax, as ring attention across context-parallel ranks needs).
// One warp per query row (s, b, head): lanes stride over the head dim; fp32 math.
#include <cmath>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
template <class T>
__global__ void attention_merge_kernel(float* __restrict__ acc, float* __restrict__ acc_lse,
                                       const T* __restrict__ part, const float* __restrict__ part_lse, int64_t s,
                                       int64_t b, int64_t np, int64_t d) {
  const int64_t rows = s * b * np;
  const int lane = threadIdx.x % 32;
  for (int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; row < rows;
       row += (int64_t)gridDim.x * blockDim.x / 32) {
    // row = (i * b + bi) * np + h of [s, b, np]; lse index (bi * np + h) * s + i.
    const int64_t i = row / (b * np), bi = (row / np) % b, h = row % np;
    const int64_t li = (bi * np + h) * s + i;
    const float a = acc_lse[li], p = part_lse[li];
    const float m = fmaxf(a, p);
    if (m == -INFINITY) continue;  // no visible key on either side (uniform over the warp)
    const float ea = expf(a - m), ep = expf(p - m), sum = ea + ep;
    const float wa = ea / sum, wp = ep / sum;
    float* o = acc + row * d;
    const T* q = part + row * d;
    for (int64_t c = lane; c < d; c += 32) o[c] = o[c] * wa + to_f(q[c]) * wp;
    __syncwarp();
    if (lane == 0) acc_lse[li] = m + logf(sum);
  }
}
}  // namespace

void attention_merge_(Tensor& acc_out, Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse) {
  check_cuda(acc_out, "attention_merge_");
  check_cuda(acc_lse, "attention_merge_");
  check_cuda(part_out, "attention_merge_");
  check_cuda(part_lse, "attention_merge_");
  MEGATRON_CHECK(acc_out.dim() == 4 && acc_out.dtype() == DType::kFloat32 && part_out.shape() == acc_out.shape() &&
                 acc_lse.dtype() == DType::kFloat32 && part_lse.dtype() == DType::kFloat32 &&
                 acc_lse.numel() == acc_out.size(0) * acc_out.size(1) * acc_out.size(2) &&
                 part_lse.numel() == acc_lse.numel())
      << "attention_merge_ acc_out " << acc_out.str() << " acc_lse " << acc_lse.str() << " part_out "
      << part_out.str() << " part_lse " << part_lse.str();
  const int64_t s = acc_out.size(0), b = acc_out.size(1), np = acc_out.size(2), d = acc_out.size(3);
  if (s * b * np == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_FLOAT_SWITCH(part_out.dtype(), T,
                   attention_merge_kernel<T><<<grid_for(s * b * np * 32, 256), 256, 0, st>>>(
                       static_cast<float*>(acc_out.data_ptr()), static_cast<float*>(acc_lse.data_ptr()),
                       static_cast<const T*>(part_out.data_ptr()), static_cast<const float*>(part_lse.data_ptr()), s,
                       b, np, d));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
