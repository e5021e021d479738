#include "megatron/core/transformer/moe/moe_layer.h"

#include <algorithm>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {

MoELayer::MoELayer(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config, int64_t layer_number,
                   const tensor_parallel::TPContext& tp, const MoEGroups& groups, std::shared_ptr<fp8::Fp8State> fp8)
    : config_(config), fp8_(std::move(fp8)) {
  MEGATRON_CHECK(config.num_moe_experts) << "MoELayer without num_moe_experts";
  if (tp.size() > 1 && !tp.sequence_parallel)
    user_error("MoE with --tensor-model-parallel-size > 1 needs --sequence-parallel (Megatron's rule for training)");
  router_ = std::make_unique<TopKRouter>(reg, prefix + ".router", config, layer_number, groups);
  dispatcher_ = make_token_dispatcher(config, groups);
  experts_ = std::make_unique<Experts>(reg, prefix + ".experts", config, dispatcher_->first_local_expert(),
                                       dispatcher_->num_local_experts(), groups.expt_tp->rank(), groups.expt_tp->size(),
                                       fp8_);
  if (config.moe_shared_expert_intermediate_size > 0)
    shared_ = std::make_unique<SharedExpertMLP>(reg, prefix + ".shared_experts", config, tp, fp8_);
}

namespace {
// Whether --recompute-granularity selective --recompute-modules includes `module`.
bool selective(const TransformerConfig& c, const char* module) {
  return c.recompute_granularity == RecomputeGranularity::kSelective &&
         std::count(c.recompute_modules.begin(), c.recompute_modules.end(), module) > 0;
}
}  // namespace

Tensor MoELayer::forward(const Tensor& x, ForwardContext& fc, MoELayerCtx& ctx) const {
  ctx.recompute = fc.training && selective(config_, "moe");
  if (!ctx.recompute) return run(x, fc, ctx);
  ctx.input = x;
  ctx.fc = fc;
  MoELayerCtx dropped;
  const bool grad_enabled = fc.grad_enabled;
  fc.grad_enabled = false;  // as a fully recomputed chunk's first forward (forward_context.h)
  Tensor out = run(x, fc, dropped);
  fc.grad_enabled = grad_enabled;
  return out;
}

Tensor MoELayer::run(const Tensor& x, ForwardContext& fc, MoELayerCtx& ctx) const {
  MEGATRON_CHECK(x.dim() == 3) << "MoELayer input " << x.str();
  ctx.shape = x.shape();
  const int64_t s = x.size(0), b = x.size(1), h = x.size(2);
  Tensor tokens = x.view({s * b, h});
  std::vector<double> probs;
  std::vector<uint8_t> map;
  const bool jitter = fc.training && config_.moe_input_jitter_eps && *config_.moe_input_jitter_eps > 0;
  const uint64_t offset = jitter ? fc.next_offset() : 0;
  std::vector<int64_t> tpe;
  Tensor pprobs, expert_in;
  // The device router and permutation where they apply (docs/moe.md "Kernels"), else the host's.
  if (dispatcher_->device_dispatch_supported() && router_->device_routing_supported(tokens) &&
      router_->forward_device(tokens, s, b, fc.training, fc.seed, offset, ctx.router, fc.grad_enabled)) {
    expert_in = dispatcher_->dispatch_device(tokens, ctx.router, &tpe, &pprobs, ctx.dispatch);
    router_->add_dispatched_counts(tpe, ctx.router);
  } else {
    router_->forward(tokens, s, b, fc.training, fc.seed, offset, probs, map, ctx.router, fc.grad_enabled);
    expert_in = dispatcher_->dispatch(tokens, probs, map, &tpe, &pprobs, ctx.dispatch);
  }
  Tensor expert_out = experts_->forward(expert_in, tpe, pprobs, ctx.experts);
  Tensor out = dispatcher_->combine(expert_out, ctx.dispatch).view(x.shape());
  if (shared_ && fc.training && selective(config_, "shared_experts")) {
    // Megatron's shared_experts_recompute (tensor_parallel.checkpoint of the shared expert): only
    // its input is kept, the MLP's activations are dropped here and rebuilt in backward.
    SharedExpertCtx dropped;
    ops::add_(out, shared_->forward(x, dropped));
    ctx.shared_input = x;
  } else if (shared_) {
    ops::add_(out, shared_->forward(x, ctx.shared));
  }
  return out;
}

Tensor MoELayer::backward(const Tensor& dy, MoELayerCtx& ctx) const {
  if (ctx.recompute) {  // replay with the saved jitter stream; its collectives run at the same point on every rank
    ForwardContext fc = ctx.fc;
    // FP8: the first forward recorded the amaxes; the replay quantizes with the same scales and
    // records none (TE's recompute phase under Megatron's te_checkpoint of the MoE layer).
    fp8::ScopedNoAmaxRecording no_amax(fp8_.get());
    run(ctx.input, fc, ctx);
    ctx.input = Tensor();
  }
  const int64_t h = ctx.shape.back(), T = dy.numel() / h;
  Tensor d_out = dy.view({T, h});
  Tensor d_expert_out = dispatcher_->combine_backward(d_out, ctx.dispatch);
  std::vector<double> dpp;
  Tensor d_expert_in = experts_->backward(d_expert_out, ctx.experts, &dpp);
  std::vector<double> dprobs;
  Tensor dx = dispatcher_->dispatch_backward(d_expert_in, dpp, ctx.dispatch, &dprobs);
  ops::add_(dx, ctx.dispatch.device ? router_->backward_device(ctx.dispatch.dpermuted_probs, ctx.dispatch.row_of, ctx.router)
                                     : router_->backward(dprobs, ctx.router));
  dx = dx.view(ctx.shape);
  if (shared_ && ctx.shared_input.defined()) {  // the same MLP forward on the same input: bitwise its activations
    fp8::ScopedNoAmaxRecording no_amax(fp8_.get());  // FP8: the step's scales, no second amax (te_checkpoint)
    shared_->forward(ctx.shared_input, ctx.shared);
    ctx.shared_input = Tensor();
  }
  if (shared_) ops::add_(dx, shared_->backward(dy, ctx.shared));
  ctx.experts = ExpertsCtx();
  return dx;
}

}  // namespace megatron::transformer::moe
