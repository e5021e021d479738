#include "megatron/core/optimizer/distributed_optimizer.h"

#include <algorithm>

namespace megatron::optimizer {

namespace {
OptimizerParam base(const Parameter& p) {
  OptimizerParam o;
  o.name = p.name;
  o.no_weight_decay = p.no_weight_decay || optimizer::is_no_weight_decay(p.name, p.data);
  o.is_embedding_or_output = p.is_embedding_or_output;
  o.tensor_parallel = p.tensor_parallel;
  o.shared = p.shared;
  o.expert_parallel = !p.allreduce;
  return o;
}
}  // namespace

std::vector<OptimizerParam> optimizer_params(std::vector<Parameter>& params) {
  std::vector<OptimizerParam> out;
  for (auto& p : params) {
    auto o = base(p);
    o.param = p.data;
    o.main_grad = p.main_grad;
    out.push_back(std::move(o));
  }
  return out;
}

std::vector<OptimizerParam> distributed_optimizer_params(distributed::DistributedDataParallel& ddp) {
  if (!ddp.config().use_distributed_optimizer)
    user_error("distributed_optimizer_params needs DistributedDataParallel with --use-distributed-optimizer");
  auto& params = ddp.parameters();
  std::vector<OptimizerParam> out;
  // Registration order, as Megatron's param groups list them.
  for (size_t i = 0; i < params.size(); ++i) {
    if (!ddp.holds(i)) continue;  // the other buffer's (dense / expert-parallel) parameter
    const auto& p = params[i];
    // The parameter's element range in the buffer = where its main_grad view starts.
    const int64_t ps = (static_cast<const char*>(p.main_grad.data_ptr()) -
                        static_cast<const char*>(ddp.grad_buffer().data_ptr())) /
                       static_cast<int64_t>(dtype_size(p.main_grad.dtype()));
    const int64_t pe = ps + p.main_grad.numel();
    for (const auto& b : ddp.buckets()) {
      const int64_t lo = std::max(ps, b.shard_start), hi = std::min(pe, b.shard_end);
      if (lo >= hi) continue;
      const int64_t n = hi - lo;
      const Shape shape = p.data.dim() >= 2 ? Shape{1, n} : Shape{n};
      auto o = base(p);
      o.param = ddp.buffers().model_data(lo, n).view(shape);
      o.main_grad = ddp.grad_buffer().flat_slice(lo, shape);
      // --fp8-param-gather: the FP8 weight's fp32 main shard is held by the DDP, which casts it
      // to FP8 after each step; the model-dtype copy is not written (and released).
      if (p.fp8_data.defined()) o.main_param = ddp.fp8_main_param(lo, n).view(shape);
      out.push_back(std::move(o));
    }
  }
  return out;
}

}  // namespace megatron::optimizer
