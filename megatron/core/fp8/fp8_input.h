// The FP8 copies of an FP8 linear layer's input made by the kernel that produces that input
// (RMSNorm before linear_qkv / linear_fc1, SwiGLU before linear_fc2) instead of a bf16 output and
// a separate quantize pass (docs/fp8.md, "Fused quantization"). Kept free of heavy headers so the
// layer headers can hold it.
#pragma once

#include "megatron/core/tensor/tensor.h"

namespace megatron::fp8 {

/// q [rows, in] (forward GEMM) and q_t [in, rows] (wgrad GEMM): the input quantized with the
/// consuming linear's input-role scale (E4M3), bit-identical to quantizing the bf16 tensor the
/// producer would have written; the producer also recorded that tensor's amax. `shape` is the
/// logical input shape [..., in] (no bf16 tensor of that shape exists).
/// Blockwise recipe (--fp8-recipe blockwise): q holds 1 x 128 tiles along `in` with scale_inv s
/// [ceil(in/128), round4(rows)], q_t the 128 x 1 column tiles along the rows (TE's columnwise copy)
/// with s_t [ceil(rows/128), round4(in)] (ops::fp8_block_quantize's layouts); s, s_t are undefined
/// for the other recipes (their scale is the role's).
struct Fp8Input {
  Tensor q, q_t;
  Tensor s, s_t;
  Shape shape;
  DType dtype = DType::kBFloat16;  // the dtype the unfused producer would have written
  bool defined() const { return q.defined(); }
};

}  // namespace megatron::fp8
