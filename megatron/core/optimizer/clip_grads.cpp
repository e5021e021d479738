#include "megatron/core/optimizer/clip_grads.h"

#include <cmath>

#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"

namespace megatron::optimizer {
namespace {
double all_reduce_scalar(double v, comm::ProcessGroup* g, comm::ReduceOp op) {
  if (g == nullptr || g->size() == 1) return v;
  Tensor t = Tensor::empty({1}, DType::kFloat64);
  t.data<double>()[0] = v;
  g->all_reduce(t, op);
  return t.data<double>()[0];
}

// The grads split by device, each list in the caller's order: the multi-tensor ops take one
// device per call (in practice every grad is on one device and the other list is empty).
struct ByDevice {
  std::vector<Tensor> host, device;
};
ByDevice by_device(const std::vector<Tensor>& grads) {
  ByDevice r;
  for (const auto& g : grads) (g.is_cpu() ? r.host : r.device).push_back(g);
  return r;
}
}  // namespace

double get_grad_norm_fp32(const std::vector<Tensor>& grads, comm::ProcessGroup* group) {
  // fp64 sums of squares; on a GPU one reduction and one host synchronization for all grads.
  const ByDevice d = by_device(grads);
  const double local = ops::sum_of_squares_many(d.host) + ops::sum_of_squares_many(d.device);
  return std::sqrt(all_reduce_scalar(local, group, comm::ReduceOp::kSum));
}

void clip_grad_by_total_norm_fp32(const std::vector<Tensor>& grads, double max_norm, double total_norm) {
  const double coeff = max_norm / (total_norm + 1e-6);
  if (!(coeff < 1.0)) return;
  const float c = static_cast<float>(coeff);
  for (const auto& g : grads) {
    Tensor t = g;
    ops::scale_(t, c);
  }
}

int64_t count_zeros_fp32(const std::vector<Tensor>& grads, comm::ProcessGroup* group) {
  const ByDevice d = by_device(grads);
  const int64_t z = ops::count_zeros_many(d.host) + ops::count_zeros_many(d.device);
  return static_cast<int64_t>(all_reduce_scalar(static_cast<double>(z), group, comm::ReduceOp::kSum));
}

bool found_inf_or_nan(const std::vector<Tensor>& grads, comm::ProcessGroup* group) {
  const ByDevice d = by_device(grads);
  const bool h = ops::has_inf_or_nan_many(d.host), g = ops::has_inf_or_nan_many(d.device);
  return all_reduce_scalar(h || g ? 1.0 : 0.0, group, comm::ReduceOp::kMax) > 0.0;
}

}  // namespace megatron::optimizer
