#include "megatron/core/optimizer/clip_grads.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/ops/ops.h"
#ifdef MEGATRON_WITH_CUDA
#include "megatron/core/ops/cuda/cuda_ops.h"
#endif
#include "megatron/core/utils/errors.h"

namespace megatron::optimizer {
namespace {
const float* f32(const Tensor& t) {
  MEGATRON_CHECK(t.is_cpu() && t.dtype() == DType::kFloat32) << "fp32 CPU grad expected, got " << t.str();
  return t.data<float>();
}
double all_reduce_scalar(double v, comm::ProcessGroup* g, comm::ReduceOp op) {
  if (g == nullptr || g->size() == 1) return v;
  Tensor t = Tensor::empty({1}, DType::kFloat64);
  t.data<double>()[0] = v;
  g->all_reduce(t, op);
  return t.data<double>()[0];
}
}  // namespace

double get_grad_norm_fp32(const std::vector<Tensor>& grads, comm::ProcessGroup* group) {
  double local = 0.0;
  std::vector<Tensor> device_grads;  // one fp64 kernel reduction and one host sync for all of them
  for (const auto& g : grads) {
    if (!g.is_cpu()) {
      device_grads.push_back(g);
      continue;
    }
    const float* p = f32(g);
    const int64_t n = g.numel();
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    local += s;
  }
  if (!device_grads.empty()) {
#ifdef MEGATRON_WITH_CUDA
    // One reduction over all CUDA grads with a single host synchronization (per-tensor
    // sum_of_squares would synchronize once per parameter: 148 times a step for GPT-2).
    if (std::all_of(device_grads.begin(), device_grads.end(), [](const Tensor& t) { return t.is_cuda(); })) {
      local += ops::cuda::sum_of_squares_many(device_grads);
    } else
#endif
      for (const auto& g : device_grads) local += ops::sum_of_squares(g);
  }
  return std::sqrt(all_reduce_scalar(local, group, comm::ReduceOp::kSum));
}

void clip_grad_by_total_norm_fp32(const std::vector<Tensor>& grads, double max_norm, double total_norm) {
  const double coeff = max_norm / (total_norm + 1e-6);
  if (!(coeff < 1.0)) return;
  const float c = static_cast<float>(coeff);
  for (const auto& g : grads) {
    if (!g.is_cpu()) {
      Tensor t = g;
      ops::scale_(t, c);
      continue;
    }
    float* p = const_cast<float*>(f32(g));
    const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) p[i] *= c;
  }
}

int64_t count_zeros_fp32(const std::vector<Tensor>& grads, comm::ProcessGroup* group) {
  int64_t z = 0;
  std::vector<Tensor> device_grads;  // one host synchronization for all of them
  for (const auto& g : grads) {
    if (!g.is_cpu()) {
      device_grads.push_back(g);
      continue;
    }
    const float* p = f32(g);
    const int64_t n = g.numel();
    int64_t c = 0;
#pragma omp parallel for reduction(+ : c) schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) c += (p[i] == 0.0f);
    z += c;
  }
  if (!device_grads.empty()) {
#ifdef MEGATRON_WITH_CUDA
    if (std::all_of(device_grads.begin(), device_grads.end(), [](const Tensor& t) { return t.is_cuda(); })) {
      z += ops::cuda::count_zeros_many(device_grads);
    } else
#endif
      for (const auto& g : device_grads) z += ops::count_zeros(g);
  }
  return static_cast<int64_t>(all_reduce_scalar(static_cast<double>(z), group, comm::ReduceOp::kSum));
}

bool found_inf_or_nan(const std::vector<Tensor>& grads, comm::ProcessGroup* group) {
  int bad = 0;
  std::vector<Tensor> device_grads;  // one host synchronization for all of them
  for (const auto& g : grads) {
    if (!g.is_cpu()) {
      device_grads.push_back(g);
      continue;
    }
    const float* p = f32(g);
    const int64_t n = g.numel();
    int b = 0;
#pragma omp parallel for reduction(| : b) schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) b |= !std::isfinite(p[i]);
    bad |= b;
  }
  if (!device_grads.empty()) {
#ifdef MEGATRON_WITH_CUDA
    if (std::all_of(device_grads.begin(), device_grads.end(), [](const Tensor& t) { return t.is_cuda(); })) {
      bad |= ops::cuda::has_inf_or_nan_many(device_grads) ? 1 : 0;
    } else
#endif
      for (const auto& g : device_grads) bad |= ops::has_inf_or_nan(g) ? 1 : 0;
  }
  return all_reduce_scalar(bad, group, comm::ReduceOp::kMax) > 0.0;
}

}  // namespace megatron::optimizer
