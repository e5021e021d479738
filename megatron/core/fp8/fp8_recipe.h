// FP8 delayed-scaling recipe state (Transformer Engine's DelayedScaling as Megatron uses it;
// docs/megatron-reference.md#fp8-delayed-scaling; TE transformer_engine/pytorch/fp8.py and
// common/recipe/delayed_scaling.cu).
//
// Every FP8 tensor role of a GEMM (input, weight, grad-output) owns one Fp8TensorMeta: an amax
// history of length H, the scale used to quantize (x_fp8 = cast(x * scale)) and scale_inv
// used to dequantize the GEMM result. The scale used at step t comes from amaxes observed up
// to step t-1 ("delayed").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_config.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::fp8 {

/// Largest finite value: E4M3 448, E5M2 57344.
float fp8_max(DType fp8_dtype);
/// The FP8 dtype of a role: forward roles E4M3; gradients E5M2 in hybrid, E4M3 in e4m3.
DType fp8_dtype_for(Fp8Format f, bool is_gradient);

/// State of one FP8 tensor role.
///
/// Cycle per training step (TE semantics):
///   1. quantize with the current `scale` and record the tensor's amax into history[0]
///      (record_amax keeps the max if a role is quantized several times in a step, e.g. over
///      micro-batches);
///   2. after the step, the amaxes are all-reduced (MAX) across the amax group (caller);
///   3. update(): amax_used = max(history) ("max", NaN entries ignored as fmaxf does) or
//      history[0] ("most_recent");
///      new scale = fp8_max / amax_used / 2^margin if amax_used is finite and > 0, else the
///      previous scale (an infinite result is clamped to FLT_MAX); scale_inv = 1/scale; then the
///      history is rolled by -1 (history[i] <- history[i+1], history[H-1] <- old history[0])
///      and history[0] is zeroed for the next step.
struct Fp8TensorMeta {
  std::vector<float> amax_history;  // length H
  float scale = 1.0f;
  float scale_inv = 1.0f;
  DType dtype = DType::kFloat8E4M3;

  Fp8TensorMeta() = default;
  Fp8TensorMeta(int history_len, DType fp8_dtype);
  void record_amax(float amax);
  void update(const Fp8Config& cfg);
  /// Tensorwise (current) scaling: scale from this tensor's own amax, no history.
  void set_current_scale(float amax, const Fp8Config& cfg);
};

/// Quantizes x (float32/bf16 CPU tensor) to `meta.dtype` with meta.scale: q = cast(x * scale)
/// with saturation (RNE, matching CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE). Returns
/// the amax of x (before scaling). q: uint8-sized FP8 tensor of the same numel.
float quantize_cpu(const Tensor& x, const Fp8TensorMeta& meta, Tensor& q);
/// Dequantizes q into y (float32): y = float(q) * scale_inv.
void dequantize_cpu(const Tensor& q, float scale_inv, Tensor& y);

}  // namespace megatron::fp8
