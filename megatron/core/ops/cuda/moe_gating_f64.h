// The float64 gating GEMM of the device router for --moe-router-dtype fp64 (moe_router.cu;
// docs/moe.md "Kernels"): Megatron's router_gating_linear in float64, the sums in the host fp64
// router's order (transformer/moe/router.cpp TopKRouter::forward / backward), so that the device
// and the host router see the same logits. Internal CUDA entry points declared outside the op
// table (op_table.h) on purpose, as moe_capacity.h: only TopKRouter's device path reaches them,
// with CUDA tensors. Include only under MEGATRON_WITH_CUDA.
#pragma once

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda {

/// logits float64 [T, E] = x [T, h] w [E, h]^T, each entry Σ_j x[t, j] w[e, j] summed for j
/// ascending in float64 with separately rounded products and sums (no fused multiply-add), as the
/// host loop. x and w float32 or bfloat16 (one dtype). Throws (internal check) on other shapes or
/// dtypes.
void moe_gating_f64_forward(const Tensor& x, const Tensor& w, Tensor& logits);

/// The backward of moe_gating_f64_forward for dlogits float32 [T, E] (moe_router_backward's
/// output): dx [T, h] (x's dtype) = dlogits w, Σ over e ascending in float64, rounded once; and
/// dw [E, h] (float32 or bfloat16, the main grad) += (dlogits^T x) summed over t ascending in
/// float64, rounded to float32, then to dw's dtype, then added in float32 and rounded to dw's
/// dtype (the host path: a float32 tensor of the float64 sums, cast to the grad's dtype, add_).
void moe_gating_f64_backward(const Tensor& dlogits, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw);

}  // namespace megatron::ops::cuda
