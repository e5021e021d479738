// FP8 linear layers: the GEMMs of Transformer Engine's Linear under fp8_autocast with
// Megatron's recipe (reference/megatron.md §10). Same contract as ops::linear_forward /
// ops::linear_backward (megatron/core/ops/ops.h) plus the FP8 state of the layer:
//
//   forward  y  = x @ w^T          x: E4M3 (role input), w: E4M3 (role weight)
//   dgrad    dx = dy @ w           dy: E5M2 in hybrid / E4M3 in e4m3 (role grad-output)
//   wgrad    dw (+)= dy^T @ x      FP8 unless --no-fp8-wgrad (then in the model dtype)
//
// Each operand is quantized with its role's scale (q = sat_rne_cast(v * scale)); the GEMM
// accumulates in fp32 and multiplies by scale_inv_a * scale_inv_b; outputs are in the model dtype
// (bf16), weight gradients accumulate into main_grad. Quantizations during training record the
// operand's amax for the delayed recipe (input and weight in forward, grad-output in backward);
// the tensorwise recipe computes each operand's scale from its own amax first.
//
// Devices: CUDA tensors run cuBLASLt FP8 GEMMs with fused quantize/transpose/amax kernels
// (ops/cuda/fp8_*.cu). CPU tensors run the same recipe as quantize-dequantize emulation around
// fp32 GEMMs: the quantized values are bit-identical to the CUDA casts (dtype.h's
// float_to_e4m3_bits / float_to_e5m2_bits), only the GEMM's summation order differs.
#pragma once

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::fp8 {

/// y[..., out] = x[..., in] @ w[out, in]^T (+ bias[out]) with FP8 operands; `base` is the
/// layer's index from Fp8State::register_linear. y in the model dtype.
void linear_forward(Fp8State& st, int base, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);

/// Backward of linear_forward (x, w: the forward's inputs). dx overwritten (skipped if nullptr);
/// dw, dbias (+)= per `accumulate` (skipped if nullptr).
void linear_backward(Fp8State& st, int base, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                     Tensor* dw, Tensor* dbias, bool accumulate);

/// CPU emulation helper (exposed for tests): x quantized with role r's scale and dequantized
/// back to float32 (same shape). Records the amax of x into role r when `record`. The
/// tensorwise recipe first sets role r's scale from x's own amax.
Tensor quantize_dequantize_cpu(Fp8State& st, int r, const Tensor& x, bool record);

}  // namespace megatron::fp8
