// The Adam(W) element update shared by the CUDA optimizer kernels (elementwise.cu adam_kernel,
// adam_multi.cu multi-tensor kernel). Included by .cu files of the CUDA backend only.
#pragma once

namespace megatron::ops::cuda {

/// One Adam(W) step on 8 fp32 elements in registers: p (master param), g (grad, multiplied by
/// `gscale`, the --clip-grad coefficient, first), m, v updated in place. decoupled: AdamW (weight
/// decay on the parameter), else L2 added to the gradient. bc1/bc2: bias corrections 1 - beta^t.
/// Shared by elementwise.cu's adam_kernel and adam_multi.cu's multi-tensor kernel, so both compute
/// the same bits (torch.optim.AdamW's formula: tests/unit_tests optimizer fixtures).
__device__ __forceinline__ void adam_update8(float (&pp)[8], float (&gg)[8], float (&mm)[8], float (&vv)[8],
                                             float gscale, float lr, float b1, float b2, float eps, float wd,
                                             float bc1, float bc2, bool decoupled) {
  if (gscale != 1.0f) {
#pragma unroll
    for (int j = 0; j < 8; ++j) gg[j] *= gscale;  // clip coefficient (same fp32 product as scale_)
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float gj = decoupled ? gg[j] : gg[j] + wd * pp[j];
    mm[j] = b1 * mm[j] + (1.0f - b1) * gj;
    vv[j] = b2 * vv[j] + (1.0f - b2) * gj * gj;
    float upd = (mm[j] / bc1) / (sqrtf(vv[j] / bc2) + eps);
    if (decoupled) upd += wd * pp[j];
    pp[j] -= lr * upd;
  }
}

}  // namespace megatron::ops::cuda
