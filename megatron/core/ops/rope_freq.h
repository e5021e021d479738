// RoPE angle arithmetic shared by the CPU reference (ops/cpu/rope.cpp) and the CUDA kernels
// (ops/cuda/rope.cu): one inline definition compiled for host and device, so the CPU tests check
// the arithmetic the GPU runs (powf/sincosf themselves still come from each side's math library).
//
// Megatron-Core's RotaryEmbedding (megatron/core/models/common/embeddings/rotary_pos_embedding.py):
//   inv_freq[i] = 1 / base^(2i / rot_dim)                      (float32 tensors)
//   --use-rope-scaling: RotaryEmbedding._apply_scaling (Llama-3.1; factor = --rope-scaling-factor,
//     low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192)
//   --rotary-seq-len-interpolation-factor F: positions multiplied by 1/F before the outer product.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MEGATRON_HD __host__ __device__
#else
#define MEGATRON_HD
#endif

namespace megatron::ops {

/// Llama-3.1 RoPE frequency scaling (Megatron's --use-rope-scaling; Hugging Face rope_type
/// "llama3"). Megatron's flags set only `factor`; the other three are fixed there at these values.
struct RopeScaling {
  bool enabled = false;
  float factor = 8.0f;                              // --rope-scaling-factor
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  float original_max_position_embeddings = 8192.0f;
};

/// a * b rounded once, never fused with a following add into an FMA (nvcc contracts a*b+c by
/// default; the x86-64 host build has no FMA): keeps host and device on torch's unfused rounding.
MEGATRON_HD inline float rope_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// Inverse frequency (radians per position) of rotary pair fi (0 <= fi < rot/2) for a rotary
/// dimension rot, in float32 as Megatron computes it: 1 / base^(2 fi / rot). With sc.enabled, the
/// Llama-3.1 adjustment of RotaryEmbedding._apply_scaling, with wavelen = 2*pi / inv_freq:
///   wavelen < original / high_freq_factor  -> inv_freq (unchanged)
///   wavelen > original / low_freq_factor   -> inv_freq / factor
///   otherwise, smooth = (original / wavelen - low) / (high - low):
///     (1 - smooth) * inv_freq / factor + smooth * inv_freq
/// Every step is one float32 operation in Megatron's order (2*pi rounded to float32 first). With
/// scaling off the expression is exactly the one the kernels used before scaling existed.
MEGATRON_HD inline float rope_inv_freq(float base, int fi, int rot, const RopeScaling& sc) {
  const float f = 1.0f / powf(base, static_cast<float>(2 * fi) / static_cast<float>(rot));
  if (!sc.enabled) return f;
  constexpr float kTwoPi = static_cast<float>(2.0 * 3.14159265358979323846);
  const float wavelen = kTwoPi / f;
  const float high_freq_wavelen = sc.original_max_position_embeddings / sc.high_freq_factor;
  const float low_freq_wavelen = sc.original_max_position_embeddings / sc.low_freq_factor;
  if (wavelen < high_freq_wavelen) return f;
  if (wavelen > low_freq_wavelen) return f / sc.factor;
  const float smooth =
      (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
  return rope_mul_rn(1.0f - smooth, f) / sc.factor + rope_mul_rn(smooth, f);
}

/// The rotation angle of pair fi at position pos: (pos * pos_scale) * inv_freq, float32.
/// pos_scale = rope_position_scale(--rotary-seq-len-interpolation-factor), 1 when the flag is not
/// given (x * 1.0f == x, so the angle is then bit-identical to pos * inv_freq).
MEGATRON_HD inline float rope_angle(float pos, float pos_scale, float inv_freq) {
  return rope_mul_rn(pos, pos_scale) * inv_freq;
}

/// float32(1 / factor) as Megatron's `seq *= 1 / seq_len_interpolation_factor` applies it (the
/// Python double reciprocal, rounded to the float32 tensor's type); 1 for factor <= 0 (None).
inline float rope_position_scale(double seq_len_interpolation_factor) {
  return seq_len_interpolation_factor > 0.0 ? static_cast<float>(1.0 / seq_len_interpolation_factor) : 1.0f;
}

}  // namespace megatron::ops
