#include "megatron/core/transformer/moe/shared_experts.h"

#include <cmath>

#include "megatron/core/ops/ops.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {

namespace {

// v rounded to `d` (what a torch tensor of that dtype holds).
double round_to(double v, DType d) {
  switch (d) {
    case DType::kBFloat16: return round_bf16(static_cast<float>(v));
    case DType::kFloat16: return round_fp16(static_cast<float>(v));
    case DType::kFloat32: return static_cast<float>(v);
    default: return v;
  }
}

}  // namespace

SharedExpertMLP::SharedExpertMLP(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                                 const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8)
    : config_(std::make_unique<TransformerConfig>(config)) {
  config_->ffn_hidden_size = config.moe_shared_expert_intermediate_size;
  mlp_ = std::make_unique<MLP>(reg, prefix, *config_, tp, std::move(fp8));
  if (config.moe_shared_expert_gate) {
    Parameter p;
    p.name = prefix + ".gate_weight";
    p.global_shape = {1, config.hidden_size};
    p.init = InitKind::kNormal;  // Megatron: config.init_method(self.gate_weight)
    p.init_std = config.init_method_std;
    p.sequence_parallel = tp.sequence_parallel;  // setattr(gate_weight, 'sequence_parallel', ...)
    gate_ = ParamRef(&reg, reg.add(std::move(p), {1, config.hidden_size}));
  }
}

Tensor SharedExpertMLP::forward(const Tensor& x, SharedExpertCtx& ctx) const {
  Tensor out = mlp_->forward(x, ctx.mlp);
  if (!gated()) return out;
  const int64_t h = x.size(-1), T = x.numel() / h;
  const DType dt = x.dtype();
  // logits = F.linear(x, gate_weight) [T, 1] in the model dtype; gate_score = sigmoid(logits)
  // (torch: float32 math, rounded to the dtype); output * gate_score.
  Tensor logits = Tensor::empty({T, 1}, dt, x.device());
  ops::linear_forward(x.view({T, h}), gate_.data(), nullptr, logits);
  std::vector<double> s = to_host_f64(logits);
  for (double& v : s) v = round_to(1.0 / (1.0 + std::exp(-v)), dt);
  ctx.score = to_device_f32(s, {T}, x.device());
  ctx.score_host = std::move(s);
  ctx.input = x;
  ctx.output = out;
  Tensor y = Tensor::empty(out.shape(), out.dtype(), out.device());
  Tensor yv = y.view({T, h});
  ops::scale_rows(out.view({T, h}), ctx.score, yv);
  return y;
}

Tensor SharedExpertMLP::backward(const Tensor& dy, SharedExpertCtx& ctx) const {
  if (!gated()) return mlp_->backward(dy, ctx.mlp);
  MEGATRON_CHECK(ctx.output.defined() && dy.numel() == ctx.output.numel() && dy.dtype() == ctx.output.dtype())
      << "SharedExpertMLP::backward: dy " << dy.str() << " for output " << ctx.output.str();
  const int64_t h = dy.size(-1), T = dy.numel() / h;
  const DType dt = ctx.input.dtype();
  // d gate_score = sum_h dy * output; d logits = d gate_score * s * (1 - s) (sigmoid's backward).
  std::vector<double> dl = row_dot(dy.view({T, h}), ctx.output.view({T, h}));
  for (int64_t t = 0; t < T; ++t) {
    const double s = ctx.score_host[static_cast<size_t>(t)];
    dl[static_cast<size_t>(t)] = round_to(round_to(dl[static_cast<size_t>(t)], dt) * s * (1.0 - s), dt);
  }
  Tensor dlogits = to_device_f32(dl, {T, 1}, dy.device());
  if (dt != DType::kFloat32) dlogits = ops::cast_to(dlogits, dt);
  // d output = dy * gate_score, into the MLP's backward.
  Tensor dout = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  Tensor doutv = dout.view({T, h});
  ops::scale_rows(dy.view({T, h}), ctx.score, doutv);
  Tensor dx = mlp_->backward(dout, ctx.mlp);
  // The gate linear: d gate_weight += d logits^T x, dx += d logits gate_weight.
  Tensor dxg = Tensor::empty({T, h}, dt, dy.device());
  ops::linear_backward(dlogits, ctx.input.view({T, h}), gate_.data(), &dxg, &gate_.grad(), nullptr, true);
  ops::add_(dx, dxg);
  ctx.input = ctx.output = ctx.score = Tensor();
  ctx.score_host.clear();
  return dx;
}

}  // namespace megatron::transformer::moe
