// Dispatch of ops/fp8_moe.h: CUDA tensors to ops/cuda/fp8_cast.cu in CUDA builds; elsewhere the
// fused kernel does not apply (false: the caller runs the unfused ops).
#include "megatron/core/ops/fp8_moe.h"

#ifdef MEGATRON_WITH_CUDA
namespace megatron::ops::cuda {  // ops/cuda/fp8_cast.cu
bool fp8_scale_rows_quantize(const Tensor& x, const Tensor& row_scale, const float* scale, float* amax, Tensor* q,
                             Tensor* q_t);
}  // namespace megatron::ops::cuda
#endif

namespace megatron::ops {

bool fp8_scale_rows_quantize(const Tensor& x, const Tensor& row_scale, const float* scale, float* amax, Tensor* q,
                             Tensor* q_t) {
#ifdef MEGATRON_WITH_CUDA
  if (x.is_cuda()) return cuda::fp8_scale_rows_quantize(x, row_scale, scale, amax, q, q_t);
#endif
  (void)x, (void)row_scale, (void)scale, (void)amax, (void)q, (void)q_t;
  return false;
}

}  // namespace megatron::ops
