#include "megatron/core/transformer/moe/experts.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/ops/ops.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {
namespace {

ParamRef add_expert_param(ParamRegistry& reg, const std::string& name, Shape global, int partition_dim, int stride,
                          int etp_rank, int etp_size, float std) {
  Parameter p;
  p.name = name;
  p.global_shape = global;
  p.tensor_parallel = partition_dim >= 0 && etp_size > 1;
  p.partition_dim = etp_size > 1 ? partition_dim : -1;
  p.partition_stride = stride;
  p.tp_rank = etp_rank;
  p.tp_size = etp_size;
  p.init = InitKind::kNormal;
  p.init_std = std;
  Shape local = global;
  if (etp_size > 1) {
    if (global[static_cast<size_t>(partition_dim)] % (etp_size * stride) != 0)
      user_error(name, ": dimension ", global[static_cast<size_t>(partition_dim)],
                 " is not divisible by --expert-tensor-parallel-size ", etp_size, stride > 1 ? " times 2 (SwiGLU halves)" : "");
    local[static_cast<size_t>(partition_dim)] /= etp_size;
  }
  return ParamRef(&reg, reg.add(std::move(p), local));
}

}  // namespace

Experts::Experts(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config, int64_t first_expert,
                 int64_t num_local_experts, int etp_rank, int etp_size)
    : config_(config), ffn_local_(config.moe_ffn_hidden_size / etp_size),
      recompute_act_(config.moe_grouped_gemm && config.recompute_granularity == RecomputeGranularity::kSelective &&
                     std::count(config.recompute_modules.begin(), config.recompute_modules.end(), "moe_act") > 0) {
  MEGATRON_CHECK(!config.add_bias_linear) << "MoE experts with bias";
  const int64_t fc1_rows = config.gated_linear_unit ? 2 * config.moe_ffn_hidden_size : config.moe_ffn_hidden_size;
  const float out_std = config.init_method_std / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  for (int64_t i = 0; i < num_local_experts; ++i) {
    const std::string e = std::to_string(first_expert + i);
    const std::string n1 = config.moe_grouped_gemm ? prefix + ".linear_fc1.weight" + e
                                                   : prefix + ".local_experts." + e + ".linear_fc1.weight";
    const std::string n2 = config.moe_grouped_gemm ? prefix + ".linear_fc2.weight" + e
                                                   : prefix + ".local_experts." + e + ".linear_fc2.weight";
    fc1_.push_back(add_expert_param(reg, n1, {fc1_rows, config.hidden_size}, 0, config.gated_linear_unit ? 2 : 1,
                                    etp_rank, etp_size, config.init_method_std));
    fc2_.push_back(add_expert_param(reg, n2, {config.hidden_size, config.moe_ffn_hidden_size}, 1, 1, etp_rank, etp_size,
                                    out_std));
  }
  // Megatron's use_expert_pgs: the experts' weights then take the expert-parallel gradient path.
  const int64_t tp = config.tensor_model_parallel_size;
  const bool expert_pgs = config.expert_model_parallel_size > 1 ||
                          (config.expert_tensor_parallel_size > 0 ? config.expert_tensor_parallel_size : tp) != tp;
  for (auto* refs : {&fc1_, &fc2_})
    for (size_t i = 0; i < refs->size(); ++i) {
      Parameter& p = (*refs)[i].param();
      p.allreduce = !expert_pgs;
      p.expert_index = first_expert + static_cast<int64_t>(i);  // checkpoint expert axis
      p.num_experts = config.num_moe_experts.value_or(0);
    }
}

namespace {
std::vector<Tensor> weights_of(const std::vector<ParamRef>& refs) {
  std::vector<Tensor> w;
  w.reserve(refs.size());
  for (const ParamRef& r : refs) w.push_back(r.data());
  return w;
}
std::vector<Tensor> grads_of(const std::vector<ParamRef>& refs) {
  std::vector<Tensor> g;
  g.reserve(refs.size());
  for (const ParamRef& r : refs) g.push_back(r.grad());  // shares the main_grad storage
  return g;
}
}  // namespace

Tensor Experts::forward(const Tensor& x, const std::vector<int64_t>& tokens_per_expert, const Tensor& probs,
                        ExpertsCtx& ctx) const {
  const int64_t L = num_local_experts(), h = config_.hidden_size;
  MEGATRON_CHECK(static_cast<int64_t>(tokens_per_expert.size()) == L) << "experts: " << tokens_per_expert.size() << " counts";
  int64_t total = 0;
  for (int64_t n : tokens_per_expert) total += n;
  const int64_t N = x.size(0);
  MEGATRON_CHECK(total == N) << "experts: " << total << " of " << N << " rows assigned";
  ctx.tokens_per_expert = tokens_per_expert;
  ctx.input = x;
  ctx.probs = probs;
  Tensor y = Tensor::empty({N, h}, x.dtype(), x.device());
  if (N == 0) return y;
  const int64_t fc1_local = config_.gated_linear_unit ? 2 * ffn_local_ : ffn_local_;
  // GroupedMLP: fc1 of every expert in one grouped GEMM, the activation on all rows (elementwise,
  // so per row the same as per expert), the probs scale, fc2 grouped.
  Tensor f1 = Tensor::empty({N, fc1_local}, x.dtype(), x.device());
  ops::grouped_linear_forward(x, weights_of(fc1_), tokens_per_expert, f1);
  Tensor act = activation(f1);
  Tensor scaled = Tensor::empty(act.shape(), act.dtype(), act.device());
  ops::scale_rows(act, probs, scaled);
  ops::grouped_linear_forward(scaled, weights_of(fc2_), tokens_per_expert, y);
  ctx.fc1_out = f1;
  if (!recompute_act_) ctx.act = act;  // --recompute-modules moe_act: rebuilt from f1 in backward
  return y;
}

Tensor Experts::activation(const Tensor& f1) const {
  Tensor act = Tensor::empty({f1.size(0), ffn_local_}, f1.dtype(), f1.device());
  if (config_.gated_linear_unit) {
    ops::swiglu_forward(f1, act);
  } else if (config_.squared_relu) {
    ops::squared_relu_forward(f1, act);
  } else {
    ops::gelu_forward(f1, act, false);
  }
  return act;
}

Tensor Experts::backward(const Tensor& dy, ExpertsCtx& ctx, std::vector<double>* dprobs) const {
  const int64_t N = dy.size(0), h = config_.hidden_size;
  dprobs->assign(static_cast<size_t>(N), 0.0);
  if (N == 0) return Tensor::zeros({N, h}, dy.dtype(), dy.device());
  Tensor dx = Tensor::empty({N, h}, dy.dtype(), dy.device());  // every row written by the dgrad
  const Tensor& f1 = ctx.fc1_out;
  // moe_act: the same activation op on the same fc1 output as the forward, so bitwise its act.
  const Tensor act = ctx.act.defined() ? ctx.act : activation(f1);
  Tensor scaled = Tensor::empty(act.shape(), act.dtype(), act.device());
  ops::scale_rows(act, ctx.probs, scaled);  // recomputed (cheaper to keep than the fc2 input)
  Tensor dscaled = Tensor::empty(act.shape(), dy.dtype(), dy.device());
  std::vector<Tensor> dw2 = grads_of(fc2_), dw1 = grads_of(fc1_);
  ops::grouped_linear_backward(dy, scaled, weights_of(fc2_), ctx.tokens_per_expert, &dscaled, &dw2, true);
  // d probs[r] = <dscaled[r], act[r]>; d act = dscaled * probs.
  *dprobs = row_dot(dscaled, act);
  Tensor dact = Tensor::empty(act.shape(), dy.dtype(), dy.device());
  ops::scale_rows(dscaled, ctx.probs, dact);
  Tensor df1 = Tensor::empty(f1.shape(), dy.dtype(), dy.device());
  if (config_.gated_linear_unit) {
    ops::swiglu_backward(dact, f1, df1);
  } else if (config_.squared_relu) {
    ops::squared_relu_backward(dact, f1, df1);
  } else {
    ops::gelu_backward(dact, f1, df1, false);
  }
  ops::grouped_linear_backward(df1, ctx.input, weights_of(fc1_), ctx.tokens_per_expert, &dx, &dw1, true);
  return dx;
}

}  // namespace megatron::transformer::moe
