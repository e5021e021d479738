// SharedExpertMLP (Megatron-Core's megatron/core/transformer/moe/shared_experts.py): a dense MLP of
// --moe-shared-expert-intermediate-size on every token, tensor-parallel over the attention TP group
// like the dense MLP ("<prefix>.linear_fc1.weight", "<prefix>.linear_fc2.weight"); its output is
// added to the routed experts' output. The shared-expert gate (--moe-shared-expert-gate) is not
// implemented (the flag is refused). With FP8 its two linears run in FP8 like the dense MLP's
// (Megatron builds them from Transformer Engine's linears, so they run under the FP8 autocast).
#pragma once

#include <memory>
#include <string>

#include "megatron/core/transformer/mlp.h"

namespace megatron::transformer::moe {

class SharedExpertMLP {
 public:
  /// `fp8`: the model's FP8 state (nullptr: no FP8), registered for linear_fc1 / linear_fc2.
  SharedExpertMLP(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                  const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// x [s, b, h] (the sequence shard with SP) -> [s, b, h].
  Tensor forward(const Tensor& x, MLPCtx& ctx) const { return mlp_->forward(x, ctx); }
  Tensor backward(const Tensor& dy, MLPCtx& ctx) const { return mlp_->backward(dy, ctx); }

 private:
  std::unique_ptr<TransformerConfig> config_;  // the layer's config with ffn_hidden_size = shared size
  std::unique_ptr<MLP> mlp_;
};

}  // namespace megatron::transformer::moe
