// MoELayer (Megatron-Core's megatron/core/transformer/moe/moe_layer.py): router -> token dispatch ->
// experts -> combine, plus the shared expert. [s, b, h] -> [s, b, h]. Parameters
// "<prefix>.router.weight", "<prefix>.experts.…" (experts.h), "<prefix>.shared_experts.…".
#pragma once

#include <memory>
#include <string>

#include "megatron/core/transformer/forward_context.h"
#include "megatron/core/transformer/moe/experts.h"
#include "megatron/core/transformer/moe/router.h"
#include "megatron/core/transformer/moe/shared_experts.h"
#include "megatron/core/transformer/moe/token_dispatcher.h"

namespace megatron::transformer::moe {

struct MoELayerCtx {
  RouterCtx router;
  DispatchCtx dispatch;
  ExpertsCtx experts;
  SharedExpertCtx shared;
  Shape shape;
  // --recompute-granularity selective --recompute-modules moe: the layer's input and forward
  // context, the rest rebuilt in backward (Megatron's tensor_parallel.checkpoint of the layer).
  bool recompute = false;
  Tensor input;
  ForwardContext fc;
  // --recompute-modules shared_experts: the shared expert's input (`shared` then filled in backward).
  Tensor shared_input;
};

class MoELayer {
 public:
  /// layer_number: Megatron's 1-based layer number. groups: the MoE process groups (tp must be
  /// the group of `tp`). `fp8`: the model's FP8 state (nullptr: no FP8) for the routed and shared
  /// experts' GEMMs (the router stays in the model dtype, as Megatron's).
  MoELayer(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config, int64_t layer_number,
           const tensor_parallel::TPContext& tp, const MoEGroups& groups,
           std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// x [s, b, h] -> [s, b, h] (x's dtype). With --recompute-granularity selective
  /// --recompute-modules moe in training (Megatron's moe_layer_recompute) only x and fc are kept:
  /// this forward runs with fc.grad_enabled false (no aux-loss records or token counts, as under
  /// Megatron's checkpoint) and backward replays it with the saved context. With
  /// --recompute-modules shared_experts in training (Megatron's shared_experts_recompute) the
  /// shared expert keeps only its input and backward re-runs its forward; moe_act: experts.h.
  Tensor forward(const Tensor& x, ForwardContext& fc, MoELayerCtx& ctx) const;
  /// dy [s, b, h] -> dx; accumulates every parameter gradient.
  Tensor backward(const Tensor& dy, MoELayerCtx& ctx) const;
  TopKRouter& router() const { return *router_; }

 private:
  Tensor run(const Tensor& x, ForwardContext& fc, MoELayerCtx& ctx) const;  // the forward proper
  const TransformerConfig& config_;
  std::unique_ptr<TopKRouter> router_;
  std::unique_ptr<TokenDispatcher> dispatcher_;
  std::unique_ptr<Experts> experts_;
  std::unique_ptr<SharedExpertMLP> shared_;
  std::shared_ptr<fp8::Fp8State> fp8_;
};

}  // namespace megatron::transformer::moe
