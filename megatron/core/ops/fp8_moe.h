// FP8 kernels of the MoE experts (docs/moe.md "FP8 experts"), outside the op table so that adding
// them rebuilds only their own objects: the dispatch is ops/fp8_moe.cpp, the CUDA kernel
// ops/cuda/fp8_cast.cu (on the quantize + transpose tile of the other fused producers).
#pragma once

#include "megatron/core/tensor/tensor.h"

namespace megatron::ops {

/// The fc2 input of an FP8 expert quantized by its producer: q [rows, cols] and q_t [cols, rows]
/// (both of one FP8 dtype) of y[r, :] = x[r, :] * row_scale[r], where y is what ops::scale_rows
/// writes (x's dtype, float32 product rounded once), quantized with the device scalar `scale`
/// (q = sat_rne_cast(y * scale)); the amax of y is folded into the device scalar `amax` when
/// non-null. Bit-identical to scale_rows + fp8_quantize (tested by fp8_gpu_test
/// fused_scale_rows and tests/gpu/host_emulation/fp8_cast_run.sh). x: bf16 or float32 [..., cols],
/// row_scale: float32 [rows], all on one CUDA device. Returns false and writes nothing where the
/// fused kernel does not apply (CPU tensors, a build without CUDA, rows % 16 or cols % 8 not 0,
/// misaligned pointers, other dtypes): the caller then runs the unfused pair.
bool fp8_scale_rows_quantize(const Tensor& x, const Tensor& row_scale, const float* scale, float* amax, Tensor* q,
                             Tensor* q_t);

}  // namespace megatron::ops
