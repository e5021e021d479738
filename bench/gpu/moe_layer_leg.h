// The MoE layer leg of `gpu_bench moe` (docs/moe.md "Performance"), kept free of CUDA so that the
// same code runs on the CPU at a tiny shape (MoELayerLeg.* in
// tests/unit_tests/transformer/moe/moe_layer_test.cpp): one MoELayer (E experts of ffn F, SwiGLU,
// top-K, aux loss 1e-2, EP1, TP1) forward + backward on T tokens, then the Experts module alone on
// the token counts that layer's router produced. The difference of the two times is the router +
// permute + unpermute + aux-loss share. With `fp8` the routed experts' GEMMs run in FP8 (docs/moe.md
// "FP8 experts"; the layer and the Experts module each with an FP8 state of its own, no step
// boundary: every call casts the weights, as one micro-batch per step does).
#pragma once

#include <memory>

#include <cstdint>
#include <functional>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/moe/experts.h"
#include "megatron/core/transformer/moe/moe_layer.h"
#include "megatron/core/transformer/moe/moe_utils.h"

namespace megatron::bench {

/// Times of one leg in ms (as the timer returns them) and the routed rows per expert of the
/// layer's last forward (E counts summing to T K; the Experts module ran on them).
struct MoELayerLegResult {
  double layer_ms = 0;
  double experts_ms = 0;
  std::vector<int64_t> tokens_per_expert;
};

/// The leg's one-layer MoE config (validated): hidden H, E SwiGLU experts of ffn F, top-K, aux loss
/// 1e-2, no bias, no dropout, --moe-grouped-gemm naming, parameters in `dt`, FP8 experts with `fp8`.
inline transformer::TransformerConfig moe_leg_config(int64_t H, int64_t F, int64_t E, int64_t K, DType dt,
                                                     const fp8::Fp8Config* fp8 = nullptr) {
  transformer::TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = H;
  c.ffn_hidden_size = F;
  c.num_attention_heads = 1;
  c.add_bias_linear = false;
  c.gated_linear_unit = true;
  c.hidden_dropout = c.attention_dropout = 0;
  c.num_moe_experts = E;
  c.moe_ffn_hidden_size = F;
  c.moe_router_topk = K;
  c.moe_aux_loss_coeff = {1e-2};
  c.moe_grouped_gemm = true;
  c.params_dtype = dt;
  if (fp8) c.fp8 = *fp8;
  c.validate();
  return c;
}

/// Runs the leg. T tokens (sequence T, micro-batch 1), hidden H, expert ffn F, E experts, top-K;
/// params, activations and gradients of dtype `dt` on `dev`, fp32 main grads. rnd(shape, dtype,
/// std) returns a random tensor on `dev` (the caller's generator); time(fn) runs fn (warm-up and
/// repetitions as it likes) and returns its time in ms. The counts are taken from the layer's
/// forward context before backward (MoELayer::backward resets it). Throws what the layer throws.
inline MoELayerLegResult moe_layer_leg(int64_t T, int64_t H, int64_t F, int64_t E, int64_t K, DType dt, Device dev,
                                       const std::function<Tensor(const Shape&, DType, float)>& rnd,
                                       const std::function<double(const std::function<void()>&)>& time,
                                       const fp8::Fp8Config* fp8 = nullptr) {
  using namespace megatron::transformer;
  using namespace megatron::transformer::moe;
  TransformerConfig c = moe_leg_config(H, F, E, K, dt, fp8);
  tensor_parallel::TPContext tp{comm::make_single_rank_group()};
  std::shared_ptr<fp8::Fp8State> st1, st2;
  if (fp8) {
    st1 = std::make_shared<fp8::Fp8State>(*fp8, dev);
    st2 = std::make_shared<fp8::Fp8State>(*fp8, dev);
  }
  ParamRegistry reg, ereg;
  MoELayer layer(reg, "decoder.layers.0.mlp", c, 1, tp, MoEGroups::single(), st1);
  Experts experts(ereg, "decoder.layers.0.mlp.experts", c, 0, E, 0, 1, st2);
  for (ParamRegistry* r : {&reg, &ereg})
    for (size_t i = 0; i < r->params().size(); ++i) {
      Parameter& p = r->params()[i];
      p.data = rnd(r->local_shape(i), dt, 0.02f);
      p.main_grad = Tensor::zeros(r->local_shape(i), DType::kFloat32, dev);
    }
  MoEAuxLossAutoScaler::set_loss_scale(1.0);
  Tensor x = rnd({T, 1, H}, dt, 1.0f), dy = rnd({T, 1, H}, dt, 0.1f);
  MoELayerLegResult res;
  res.layer_ms = time([&] {
    ForwardContext fc;
    MoELayerCtx ctx;
    MoEMetricsTracker::get().clear();
    layer.forward(x, fc, ctx);
    // backward clears ctx.experts; FP8 on a GPU: the router's counts, not the padded ones
    res.tokens_per_expert = ctx.experts.unpadded_tokens_per_expert.empty() ? ctx.experts.tokens_per_expert
                                                                           : ctx.experts.unpadded_tokens_per_expert;
    layer.backward(dy, ctx);
  });
  int64_t R = 0;
  for (int64_t n : res.tokens_per_expert) R += n;
  Tensor xe = rnd({R, H}, dt, 1.0f), pe = rnd({R}, DType::kFloat32, 0.3f), dye = rnd({R, H}, dt, 0.1f);
  res.experts_ms = time([&] {
    ExpertsCtx ectx;
    std::vector<double> dprobs;
    experts.forward(xe, res.tokens_per_expert, pe, ectx);
    experts.backward(dye, ectx, &dprobs);
  });
  return res;
}

}  // namespace megatron::bench
