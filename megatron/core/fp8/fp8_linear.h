// FP8 linear layers: the GEMMs of Transformer Engine's Linear under fp8_autocast with
// Megatron's recipe (docs/megatron-reference.md#fp8-delayed-scaling). Same contract as ops::linear_forward /
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
// Two forms of the recipe, both through the op contract: device tensors run real FP8 GEMMs with
// fused quantize/transpose/amax (the FP8 ops of ops/op_table.h: fp8_quantize, fp8_gemm_tn, ...),
// the weight and its transpose cached in FP8; host tensors run it as quantize-dequantize
// emulation around fp32 GEMMs, the weight cached dequantized. The quantized values are
// bit-identical (dtype.h's float_to_e4m3_bits / float_to_e5m2_bits match the device casts);
// only the GEMM's summation order differs. (The host form is kept rather than running the
// device form on the CPU reference ops because its numbers are pinned by the refactor invariant
// and the FP8 tests.)
#pragma once

#include "megatron/core/fp8/fp8_input.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::fp8 {

/// y[..., out] = x[..., in] @ w[out, in]^T (+ bias[out]) with FP8 operands; `base` is the
/// layer's index from Fp8State::register_linear. y in the model dtype.
/// `xq`: x already quantized by its producer (fused; x may then be undefined, xq->shape gives its
/// shape). `keep_x_t` (CUDA): also write x's FP8 transpose there in the same pass (for the wgrad
/// GEMM, passed back to linear_backward as x_t) -- left undefined where not applicable.
/// `residual` (y's shape and dtype): y = x w^T (+ bias) + residual; on CUDA without a bias added in
/// the FP8 GEMM's epilogue (one rounding of y, as the bf16 path's fused residual) where cuBLASLt
/// has the variant, else (and on the CPU) a separate add after the GEMM.
/// Blockwise recipe: xq carries its scale_inv tensors (Fp8Input::s, s_t); keep_x_t gets x's
/// columnwise copy (128 x 1 tiles, [in, rows]) and `keep_x_st` its scale_inv -- kept only when
/// both are given.
void linear_forward(Fp8State& st, int base, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                    const Fp8Input* xq = nullptr, Tensor* keep_x_t = nullptr, const Tensor* residual = nullptr,
                    Tensor* keep_x_st = nullptr);

/// Backward of linear_forward (x, w: the forward's inputs). dx overwritten (skipped if nullptr);
/// dw, dbias (+)= per `accumulate` (skipped if nullptr). `x_t`: x's FP8 transpose from the forward
/// (Fp8Input::q_t or keep_x_t), used by the FP8 wgrad GEMM instead of quantizing x again (x may
/// then be undefined when there is no bias and the wgrad is FP8).
/// `dyq`: dy already quantized (grad-output role, both layouts) by the kernel that produced it
/// (swiglu_backward_fp8; dy may then be undefined: no bias, FP8 wgrad).
/// Blockwise recipe: x_t is x's columnwise copy and `x_st` its scale_inv (used only when both are
/// defined); dyq carries its scale_inv tensors.
void linear_backward(Fp8State& st, int base, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                     Tensor* dw, Tensor* dbias, bool accumulate, const Tensor* x_t = nullptr,
                     const Fp8Input* dyq = nullptr, const Tensor* x_st = nullptr);

/// The weight cast of a training forward without its GEMM, for a grouped layer's GEMM that has no
/// rows this call (an expert without tokens): Transformer Engine's GroupedLinear casts the weight of
/// every GEMM (get_weight_workspace for each one, whatever m_splits says), so that weight's amax is
/// recorded (while st.recording()) and its cast cached exactly as a forward with rows would. The
/// blockwise recipe records nothing and caches per GEMM call, so there this does nothing.
void cast_weight(Fp8State& st, int base, const Tensor& w);

/// Whether the fused quantization is on: MEGATRON_FP8_FUSE unset or 1 (default); 0 turns it off
/// (every input quantized by a separate pass, as before; for A/B comparisons -- the FP8 bytes,
/// amaxes and losses are the same either way). Read once.
bool fusion_enabled();

/// Whether the blockwise recipe's producers are fused: MEGATRON_FP8_BLOCK_FUSED unset or 1
/// (default); 0 keeps their bf16 outputs and quantizes them in a separate pass (A/B; the FP8 bytes,
/// scales and losses are the same either way; fusion_enabled() must also hold). Other values: a
/// UserError naming the variable. Read once.
bool block_fusion_enabled();

/// Whether an input of the FP8 linear layers of `st` living where `like` lives may be quantized
/// by its producer: CUDA, the delayed recipe (the scale is known before the producer runs) or the
/// blockwise recipe with block_fusion_enabled() (every scale is its block's own), FP8 wgrad (the
/// transpose / columnwise copy replaces the bf16 input in backward), fusion_enabled().
bool fused_input_ok(const Fp8State& st, const Tensor& like);

/// RMSNorm forward fused with the quantization of its output for the linear at `base`:
/// rstd [rows] as ops::rmsnorm_forward writes it, and the Fp8Input of the normalized x (in x's
/// dtype before quantizing, as the unfused path), recording its amax while st.recording()
/// (blockwise: 1 x 128 q + s and 128 x 1 q_t + s_t, nothing recorded).
/// Returns an undefined Fp8Input (nothing computed) when not fused_input_ok or the shapes do not
/// fit the fused kernel (rows or h not multiples of 16); the caller then runs the unfused path.
Fp8Input rmsnorm_fp8(Fp8State& st, int base, const Tensor& x, const Tensor& gamma, float eps,
                     bool zero_centered_gamma, Tensor& rstd);

/// SwiGLU of fc1_out [..., 2f] fused with the quantization of its output for the linear at `base`
/// (linear_fc2): the Fp8Input of swiglu(fc1_out) (in fc1_out's dtype before quantizing); same
/// conditions and fallback as rmsnorm_fp8.
Fp8Input swiglu_fp8(Fp8State& st, int base, const Tensor& fc1_out);

/// SwiGLU's backward (d fc1_out from dact [..., f] and fc1_out [..., 2f]) fused with the quantization
/// of its result as the grad-output of the linear at `base` (linear_fc1): an Fp8Input (q, q_t in
/// the grad-output dtype, shape of fc1_out, dtype of dact) for linear_backward's `dyq`, recording
/// its amax while st.recording(); bit-identical to swiglu_backward + the unfused quantize. Same
/// conditions and fallback as rmsnorm_fp8.
Fp8Input swiglu_backward_fp8(Fp8State& st, int base, const Tensor& dact, const Tensor& fc1_out);

/// CPU emulation helper (exposed for tests): x quantized with role r's scale and dequantized
/// back to float32 (same shape). Records the amax of x into role r when `record`. The
/// tensorwise recipe first sets role r's scale from x's own amax.
Tensor quantize_dequantize_cpu(Fp8State& st, int r, const Tensor& x, bool record);

/// CPU emulation of the blockwise recipe (--fp8-recipe blockwise, TE's Float8BlockScaling;
/// docs/fp8.md "Blockwise recipe"; exposed for tests): x [..., c] (float32/bf16, viewed as
/// [rows, c]) quantized to role r's dtype with ops::fp8_block_quantize and dequantized back to
/// float32 (same shape). Weight roles: 128 x 128 blocks. Input / grad-output roles: 1 x 128 tiles
/// along c, or with `columnwise` 128 x 1 tiles along the rows (the copy the wgrad GEMM reads).
/// Records nothing (the recipe has no amax history).
Tensor block_quantize_dequantize_cpu(const Fp8State& st, int r, const Tensor& x, bool columnwise);

}  // namespace megatron::fp8
