// Sources of the values the FP8 tile quantize kernels quantize (fp8_cast.cu's delayed / tensorwise
// tiles, fp8_block.cu's blockwise tiles): load8(r, c, f) gives the 8 values of row r, columns
// c..c+7 (c % 8 == 0, in range) as floats. The fused sources compute what the unfused producer
// kernel would have written (rounded to its output type) from its inputs, so the FP8 bytes, amaxes
// and block scales are those of the unfused path (producer + quantize) bit for bit
// (docs/fp8.md "Fused quantization").
#pragma once

#include "megatron/core/ops/cuda/cuda_common.cuh"

namespace megatron::ops::cuda::detail {
// ---- sources (tests/gpu/host_emulation/*_run.sh cut the code between these two lines)
// silu(g) * u exactly as ops/cuda/elementwise.cu's swiglu_fwd_kernel: x [rows, 2f] = [gate | up].
__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }
template <class X, class Y>
struct SwigluSrc {
  const X* x;
  int64_t f;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&o)[8]) const {
    float g[8], u[8];
    ld8(x + r * 2 * f, c, c + 8, true, g);
    ld8(x + r * 2 * f + f, c, c + 8, true, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = to_f(from_f<Y>(silu_f(g[j]) * u[j]));
  }
};

// SwiGLU's input gradient exactly as ops/cuda/elementwise.cu's swiglu_bwd_kernel computes it (rounded
// to its dx type D): columns [0, f) d/dgate, [f, 2f) d/dup of x [rows, 2f] = [gate | up], dy [rows, f].
template <class X, class D>
struct SwigluBwdSrc {
  const X* x;
  const D* dy;
  int64_t f;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&o)[8]) const {
    const bool up = c >= f;
    const int64_t cc = up ? c - f : c;
    float g[8], u[8], d[8];
    ld8(x + r * 2 * f, cc, cc + 8, true, g);
    ld8(dy + r * f, cc, cc + 8, true, d);
    if (!up) ld8(x + r * 2 * f + f, cc, cc + 8, true, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float sg = 1.0f / (1.0f + expf(-g[j]));
      float s = g[j] * sg;
      if (up) {
        o[j] = to_f(from_f<D>(d[j] * s));
      } else {
        o[j] = to_f(from_f<D>(d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg))));
      }
    }
  }
};

// RMSNorm's output exactly as ops/cuda/norm.cu's norm_fwd_kernel<false> computes it, from x, the
// row's rstd (written by that kernel's rstd-only mode) and gamma (+ gofs for zero-centered gamma).
template <class X, class G, class Y>
struct RmsnormSrc {
  const X* x;
  const G* gamma;
  const float* rstd;
  int64_t cols;
  float gofs;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&o)[8]) const {
    float f[8], g[8];
    ld8(x + r * cols, c, c + 8, true, f);
    ld8(gamma, c, c + 8, true, g);
    const float mean = 0.0f, rs = rstd[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = to_f(from_f<Y>((f[j] - mean) * rs * (g[j] + gofs) + 0.0f));
  }
};
// x times its row's factor exactly as ops/cuda/embedding_ce.cu's scale_rows_kernel computes it
// (rounded to x's type X): the FP8 MoE experts' fc2 input act * prob (docs/moe.md "FP8 experts").
template <class X>
struct ScaleRowsSrc {
  const X* x;
  const float* p;
  int64_t cols;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&o)[8]) const {
    float f[8];
    ld8(x + r * cols, c, c + 8, true, f);
    const float a = p[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = to_f(from_f<X>(f[j] * a));
  }
};
// ---- end of sources
}  // namespace megatron::ops::cuda::detail
