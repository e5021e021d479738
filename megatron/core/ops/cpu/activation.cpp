// CPU reference: GeLU (erf and tanh forms), SwiGLU and dropout, forward and backward.
#include <cmath>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

namespace {
// tanh GeLU constants as in Megatron's fused bias_gelu (megatron/core/fusions/fused_bias_gelu.py):
// 0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2))).
constexpr float kTanhC = 0.79788456f;
constexpr float kTanhA = 0.044715f;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// The tanh form is evaluated through the identity 0.5 (1 + tanh(u)) = sigmoid(2u): one exp,
// no cancellation near u = 0, and exact limits for large |u|.
float gelu(float x, bool approx) {
  if (approx) return x / (1.0f + std::exp(-2.0f * kTanhC * x * (1.0f + kTanhA * x * x)));
  return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
}
float gelu_grad(float x, bool approx) {
  if (approx) {
    // d/dx [x s(2u)] = s + x s (1 - s) 2 u', u = c x (1 + a x^2), u' = c (1 + 3 a x^2).
    const float s = 1.0f / (1.0f + std::exp(-2.0f * kTanhC * x * (1.0f + kTanhA * x * x)));
    return s + x * s * (1.0f - s) * 2.0f * kTanhC * (1.0f + 3.0f * kTanhA * x * x);
  }
  return 0.5f * (1.0f + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
}
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void gelu_forward(const Tensor& x, Tensor& y, bool approximate_tanh) {
  MEGATRON_CHECK(x.numel() == y.numel()) << "gelu_forward " << x.str() << " -> " << y.str();
  FloatIn fx(x);
  FloatOut fy(y);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) fy[i] = gelu(fx[i], approximate_tanh);
  fy.commit();
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, bool approximate_tanh) {
  MEGATRON_CHECK(x.numel() == dy.numel() && dx.numel() == x.numel()) << "gelu_backward " << x.str();
  FloatIn fx(x), fdy(dy);
  FloatOut fdx(dx);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) fdx[i] = fdy[i] * gelu_grad(fx[i], approximate_tanh);
  fdx.commit();
}

void squared_relu_forward(const Tensor& x, Tensor& y) {
  MEGATRON_CHECK(x.numel() == y.numel()) << "squared_relu_forward " << x.str() << " -> " << y.str();
  FloatIn fx(x);
  FloatOut fy(y);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float r = fx[i] > 0.0f ? fx[i] : 0.0f;
    fy[i] = r * r;
  }
  fy.commit();
}

void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  MEGATRON_CHECK(x.numel() == dy.numel() && dx.numel() == x.numel()) << "squared_relu_backward " << x.str();
  FloatIn fx(x), fdy(dy);
  FloatOut fdx(dx);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) fdx[i] = fx[i] > 0.0f ? fdy[i] * 2.0f * fx[i] : 0.0f;
  fdx.commit();
}

void swiglu_forward(const Tensor& x, Tensor& y) {
  const int64_t f = y.size(-1), n = rows_of(y);
  MEGATRON_CHECK(x.size(-1) == 2 * f && rows_of(x) == n) << "swiglu_forward " << x.str() << " -> " << y.str();
  FloatIn fx(x);
  FloatOut fy(y);
#pragma omp parallel for schedule(static) if (n * f > 16384)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const float g = fx[r * 2 * f + j], u = fx[r * 2 * f + f + j];
      fy[r * f + j] = g * sigmoid(g) * u;
    }
  fy.commit();
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const int64_t f = dy.size(-1), n = rows_of(dy);
  MEGATRON_CHECK(x.size(-1) == 2 * f && rows_of(x) == n && dx.numel() == x.numel()) << "swiglu_backward " << x.str();
  FloatIn fx(x), fdy(dy);
  FloatOut fdx(dx);
#pragma omp parallel for schedule(static) if (n * f > 16384)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const float g = fx[r * 2 * f + j], u = fx[r * 2 * f + f + j], d = fdy[r * f + j];
      const float s = sigmoid(g);
      fdx[r * 2 * f + j] = d * u * s * (1.0f + g * (1.0f - s));
      fdx[r * 2 * f + f + j] = d * g * s;
    }
  fdx.commit();
}

void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, uint64_t seed, uint64_t offset) {
  const int64_t n = x.numel();
  MEGATRON_CHECK(y.numel() == n && mask.numel() == n && mask.dtype() == DType::kUInt8 && p >= 0.0f && p < 1.0f)
      << "dropout_forward x " << x.str() << " y " << y.str() << " mask " << mask.str() << " p " << p;
  FloatIn fx(x);
  FloatOut fy(y);
  uint8_t* m = mask.data<uint8_t>();
  const float scale = 1.0f / (1.0f - p);
  const uint64_t stream = dropout_stream(seed, offset);
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = p == 0.0f || dropout_uniform(stream, static_cast<uint64_t>(i)) >= p;
    m[i] = keep;
    fy[i] = keep ? fx[i] * scale : 0.0f;
  }
  fy.commit();
}

void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) {
  const int64_t n = dy.numel();
  MEGATRON_CHECK(dx.numel() == n && mask.numel() == n && mask.dtype() == DType::kUInt8) << "dropout_backward " << dy.str();
  FloatIn fdy(dy);
  FloatOut fdx(dx);
  const uint8_t* m = mask.data<uint8_t>();
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) fdx[i] = m[i] ? fdy[i] * scale : 0.0f;
  fdx.commit();
}

}  // namespace megatron::ops::cpu
