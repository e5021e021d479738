// SharedExpertMLP (Megatron-Core's megatron/core/transformer/moe/shared_experts.py): a dense MLP of
// --moe-shared-expert-intermediate-size on every token, tensor-parallel over the attention TP group
// like the dense MLP ("<prefix>.linear_fc1.weight", "<prefix>.linear_fc2.weight"); its output is
// added to the routed experts' output. With --moe-shared-expert-gate (Megatron's
// moe_shared_expert_gate, Qwen2-MoE's shared_expert_gate) the output is scaled per token by
// sigmoid(x @ gate_weight^T), gate_weight "<prefix>.gate_weight" [1, hidden] (registered after the
// MLP's weights, as Megatron's named_parameters; N(0, init_method_std)). With FP8 the two linears
// run in FP8 like the dense MLP's (Megatron builds them from Transformer Engine's linears, so they
// run under the FP8 autocast); the gate GEMM stays in the model dtype (Megatron's F.linear).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/core/transformer/mlp.h"

namespace megatron::transformer::moe {

/// What SharedExpertMLP::backward needs: the MLP's context and, with the gate, its input x
/// [T, h], the ungated MLP output [T, h] (both the model dtype) and the scores sigmoid(x g^T)
/// rounded to the model dtype (host float64 [T] and the same values float32 [T] on x's device).
struct SharedExpertCtx {
  MLPCtx mlp;
  Tensor input, output, score;
  std::vector<double> score_host;
};

class SharedExpertMLP {
 public:
  /// `fp8`: the model's FP8 state (nullptr: no FP8), registered for linear_fc1 / linear_fc2.
  /// Registers "<prefix>.gate_weight" when config.moe_shared_expert_gate (with --sequence-parallel
  /// its gradient is a partial sum over this rank's sequence shard: Parameter::sequence_parallel,
  /// all-reduced over TP as Megatron's `sequence_parallel` attribute; not split over TP).
  SharedExpertMLP(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                  const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// x [s, b, h] (the sequence shard with SP) -> [s, b, h] in x's dtype: mlp(x), or with the gate
  /// mlp(x) * sigmoid(x @ gate_weight^T) per token (Megatron's SharedExpertMLP.forward; the
  /// logits and scores rounded to the model dtype as there, the product rounded once).
  Tensor forward(const Tensor& x, SharedExpertCtx& ctx) const;
  /// dy [s, b, h] -> dx [s, b, h]; accumulates the MLP's and the gate's weight gradients. The
  /// gate's per-token d score = <dy, mlp(x)> (ops::row_dot_f64: only T values reach the host),
  /// d logit = d score * s (1 - s), each rounded to the model dtype as torch's autograd does.
  Tensor backward(const Tensor& dy, SharedExpertCtx& ctx) const;
  bool gated() const { return gate_.defined(); }

 private:
  std::unique_ptr<TransformerConfig> config_;  // the layer's config with ffn_hidden_size = shared size
  std::unique_ptr<MLP> mlp_;
  ParamRef gate_;  // [1, h]; undefined without --moe-shared-expert-gate
};

}  // namespace megatron::transformer::moe
