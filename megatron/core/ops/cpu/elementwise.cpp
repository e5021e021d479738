// CPU reference: elementwise and utility ops (see ops.h for the contract).
#include <cmath>
#include <cstring>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

namespace {
// The reductions go parallel above this size (what the optimizer's gradient statistics always
// used; the fp64 sum of squares depends on the partition, so the threshold is part of the result).
constexpr int64_t kReduceParallelMin = 32768;
}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  MEGATRON_CHECK(src.numel() == dst.numel()) << "cast " << src.str() << " -> " << dst.str();
  if (src.dtype() == dst.dtype()) {
    if (src.data_ptr() != dst.data_ptr()) std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
    return;
  }
  FloatIn in(src);
  cpu_convert_from_float(in.data(), dst.data_ptr(), dst.dtype(), dst.numel());
}

void fill(Tensor& x, float value) {
  FloatOut out(x);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = value;
  out.commit();
}

void add_(Tensor& y, const Tensor& x, float alpha) {
  MEGATRON_CHECK(y.numel() == x.numel()) << "add_ " << y.str() << " += " << x.str();
  FloatIn in(x);
  FloatOut out(y, /*load=*/true);
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] += alpha * in[i];
  out.commit();
}

void scale_(Tensor& x, float alpha) {
  FloatOut out(x, /*load=*/true);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] *= alpha;
  out.commit();
}

double sum_of_squares(const Tensor& x) {
  FloatIn in(x);
  const int64_t n = x.numel();
  double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > kReduceParallelMin)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(in[i]) * in[i];
  return s;
}

int64_t count_zeros(const Tensor& x) {
  FloatIn in(x);
  const int64_t n = x.numel();
  int64_t c = 0;
#pragma omp parallel for reduction(+ : c) schedule(static) if (n > kReduceParallelMin)
  for (int64_t i = 0; i < n; ++i) c += in[i] == 0.0f;
  return c;
}

bool has_inf_or_nan(const Tensor& x) {
  FloatIn in(x);
  const int64_t n = x.numel();
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static) if (n > kReduceParallelMin)
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(in[i]);
  return bad > 0;
}

void transpose01(const Tensor& x, Tensor& y) {
  MEGATRON_CHECK(x.dim() >= 2 && y.dim() == x.dim() && x.dtype() == y.dtype() && y.size(0) == x.size(1) &&
                 y.size(1) == x.size(0) && y.numel() == x.numel())
      << "transpose01 " << x.str() << " -> " << y.str();
  const int64_t a = x.size(0), b = x.size(1);
  const size_t inner = static_cast<size_t>(x.numel() / (a * b)) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(y.data_ptr());
  MEGATRON_CHECK(src != dst || a * b == 0) << "transpose01 cannot run in place";
#pragma omp parallel for schedule(static) if (a * b * inner > 1 << 20)
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) std::memcpy(dst + (j * a + i) * inner, src + (i * b + j) * inner, inner);
}

void bias_add_(Tensor& y, const Tensor& bias) {
  const int64_t n = bias.numel();
  MEGATRON_CHECK(y.dim() >= 1 && y.size(-1) == n) << "bias_add_ " << y.str() << " + " << bias.str();
  FloatIn b(bias);
  FloatOut out(y, /*load=*/true);
  const int64_t rows = rows_of(y);
#pragma omp parallel for schedule(static) if (rows * n > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] += b[j];
  out.commit();
}


double sum_of_squares_many(const std::vector<Tensor>& xs) {
  double s = 0.0;
  for (const auto& x : xs) s += sum_of_squares(x);
  return s;
}

int64_t count_zeros_many(const std::vector<Tensor>& xs) {
  int64_t z = 0;
  for (const auto& x : xs) z += count_zeros(x);
  return z;
}

bool has_inf_or_nan_many(const std::vector<Tensor>& xs) {
  bool bad = false;
  for (const auto& x : xs) bad = has_inf_or_nan(x) || bad;  // every tensor checked, as the CUDA op
  return bad;
}

}  // namespace megatron::ops::cpu
