// CPU reference: LayerNorm and RMSNorm over the last dim, forward and backward.
// Statistics in fp32 (two-pass mean/variance in double for robustness); gamma may be applied
// zero-centred (Megatron --apply-layernorm-1p: scale = 1 + gamma).
#include <algorithm>
#include <cmath>
#include <vector>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

namespace {
void check_norm(const Tensor& x, const Tensor& gamma, const Tensor& y, const Tensor& stat, const char* op) {
  MEGATRON_CHECK(x.dim() >= 1 && gamma.numel() == x.size(-1) && y.numel() == x.numel() && stat.numel() == rows_of(x) &&
                 stat.dtype() == DType::kFloat32)
      << op << " x " << x.str() << " gamma " << gamma.str() << " y " << y.str() << " stat " << stat.str();
}
/// Column sums over rows of f(r, j) for j < h, in double: rows are split into fixed chunks
/// whose partial sums are added in chunk order (deterministic for any thread count), and each
/// chunk walks its rows contiguously.
template <class F>
std::vector<double> column_sums(int64_t n, int64_t h, int width, F f) {
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<size_t>(chunks * h * width), 0.0);
#pragma omp parallel for schedule(static) if (n * h > 16384)
  for (int64_t c = 0; c < chunks; ++c) {
    double* acc = part.data() + c * h * width;
    for (int64_t r = c * kChunk; r < std::min(n, (c + 1) * kChunk); ++r) f(r, acc);
  }
  std::vector<double> total(static_cast<size_t>(h * width), 0.0);
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t j = 0; j < h * width; ++j) total[j] += part[c * h * width + j];
  return total;
}
}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool zero_centered_gamma,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  check_norm(x, gamma, y, rstd, "layernorm_forward");
  const int64_t n = rows_of(x), h = x.size(-1);
  FloatIn fx(x), g(gamma), b(beta);
  FloatOut fy(y);
  float* mu = mean.data<float>();
  float* rs = rstd.data<float>();
  const float g0 = zero_centered_gamma ? 1.0f : 0.0f;
#pragma omp parallel for schedule(static) if (n * h > 16384)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = fx.data() + r * h;
    double s = 0.0;
    for (int64_t j = 0; j < h; ++j) s += xr[j];
    const double m = s / h;
    double v = 0.0;
    for (int64_t j = 0; j < h; ++j) v += (xr[j] - m) * (xr[j] - m);
    const float rstdv = static_cast<float>(1.0 / std::sqrt(v / h + eps));
    mu[r] = static_cast<float>(m);
    rs[r] = rstdv;
    for (int64_t j = 0; j < h; ++j) fy[r * h + j] = (xr[j] - mu[r]) * rstdv * (g[j] + g0) + b[j];
  }
  fy.commit();
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  check_norm(x, gamma, dx, rstd, "layernorm_backward");
  const int64_t n = rows_of(x), h = x.size(-1);
  FloatIn fdy(dy), fx(x), g(gamma);
  FloatOut fdx(dx);
  const float* mu = mean.data<float>();
  const float* rs = rstd.data<float>();
  const float g0 = zero_centered_gamma ? 1.0f : 0.0f;
  // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * g.
#pragma omp parallel for schedule(static) if (n * h > 16384)
  for (int64_t r = 0; r < n; ++r) {
    double a = 0.0, bsum = 0.0;
    for (int64_t j = 0; j < h; ++j) {
      const float xhat = (fx[r * h + j] - mu[r]) * rs[r];
      const float dxhat = fdy[r * h + j] * (g[j] + g0);
      a += dxhat;
      bsum += dxhat * xhat;
    }
    const float ma = static_cast<float>(a / h), mb = static_cast<float>(bsum / h);
    for (int64_t j = 0; j < h; ++j) {
      const float xhat = (fx[r * h + j] - mu[r]) * rs[r];
      const float dxhat = fdy[r * h + j] * (g[j] + g0);
      fdx[r * h + j] = rs[r] * (dxhat - ma - xhat * mb);
    }
  }
  fdx.commit();
  FloatOut fdg(dgamma, accumulate), fdb(dbeta, accumulate);
  // sums[j] = sum_r dy * xhat (dgamma), sums[h + j] = sum_r dy (dbeta).
  const auto sums = column_sums(n, h, 2, [&](int64_t r, double* acc) {
    for (int64_t j = 0; j < h; ++j) {
      const float xhat = (fx[r * h + j] - mu[r]) * rs[r];
      acc[j] += fdy[r * h + j] * xhat;
      acc[h + j] += fdy[r * h + j];
    }
  });
  for (int64_t j = 0; j < h; ++j) {
    fdg[j] = static_cast<float>((accumulate ? fdg[j] : 0.0f) + sums[j]);
    fdb[j] = static_cast<float>((accumulate ? fdb[j] : 0.0f) + sums[h + j]);
  }
  fdg.commit();
  fdb.commit();
}

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, bool zero_centered_gamma, Tensor& y, Tensor& rstd) {
  check_norm(x, gamma, y, rstd, "rmsnorm_forward");
  const int64_t n = rows_of(x), h = x.size(-1);
  FloatIn fx(x), g(gamma);
  FloatOut fy(y);
  float* rs = rstd.data<float>();
  const float g0 = zero_centered_gamma ? 1.0f : 0.0f;
#pragma omp parallel for schedule(static) if (n * h > 16384)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = fx.data() + r * h;
    double s = 0.0;
    for (int64_t j = 0; j < h; ++j) s += static_cast<double>(xr[j]) * xr[j];
    const float rstdv = static_cast<float>(1.0 / std::sqrt(s / h + eps));
    rs[r] = rstdv;
    for (int64_t j = 0; j < h; ++j) fy[r * h + j] = xr[j] * rstdv * (g[j] + g0);
  }
  fy.commit();
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, bool accumulate) {
  check_norm(x, gamma, dx, rstd, "rmsnorm_backward");
  const int64_t n = rows_of(x), h = x.size(-1);
  FloatIn fdy(dy), fx(x), g(gamma);
  FloatOut fdx(dx);
  const float* rs = rstd.data<float>();
  const float g0 = zero_centered_gamma ? 1.0f : 0.0f;
  // dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), xhat = x * rstd, dxhat = dy * g.
#pragma omp parallel for schedule(static) if (n * h > 16384)
  for (int64_t r = 0; r < n; ++r) {
    double b = 0.0;
    for (int64_t j = 0; j < h; ++j) b += fdy[r * h + j] * (g[j] + g0) * fx[r * h + j] * rs[r];
    const float mb = static_cast<float>(b / h);
    for (int64_t j = 0; j < h; ++j) {
      const float xhat = fx[r * h + j] * rs[r];
      fdx[r * h + j] = rs[r] * (fdy[r * h + j] * (g[j] + g0) - xhat * mb);
    }
  }
  fdx.commit();
  FloatOut fdg(dgamma, accumulate);
  const auto sums = column_sums(n, h, 1, [&](int64_t r, double* acc) {
    for (int64_t j = 0; j < h; ++j) acc[j] += fdy[r * h + j] * fx[r * h + j] * rs[r];
  });
  for (int64_t j = 0; j < h; ++j) fdg[j] = static_cast<float>((accumulate ? fdg[j] : 0.0f) + sums[j]);
  fdg.commit();
}

}  // namespace megatron::ops::cpu
