// TopKRouter (Megatron-Core's megatron/core/transformer/moe/router.py): gating linear
// (router.weight [E, h], no bias), optional input jitter, z-loss, top-k routing with a score
// function (softmax / sigmoid / sqrtsoftplus, pre-softmax, top-k scaling, group-limited top-k,
// expert bias for aux-loss-free balancing), capacity dropping, and the aux losses (aux_loss,
// seq_aux_loss, global_aux_loss) attached as Megatron's MoEAuxLossAutoScaler does: their gradient
// (times MoEAuxLossAutoScaler::loss_scale()) flows into the logits in backward.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor/parameter.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::transformer::moe {

/// The process groups of an MoE layer (Megatron's ProcessGroupCollection fields); never null
/// (single-rank groups when a dimension has size 1).
struct MoEGroups {
  std::shared_ptr<comm::ProcessGroup> tp;        // attention tensor parallel (shared experts)
  std::shared_ptr<comm::ProcessGroup> tp_cp;     // aux-loss token counts (tp_cp_group)
  std::shared_ptr<comm::ProcessGroup> tp_dp_cp;  // global aux loss, expert-bias counts, z-loss average
  std::shared_ptr<comm::ProcessGroup> ep;        // expert model parallel
  std::shared_ptr<comm::ProcessGroup> expt_tp;   // expert tensor parallel
  std::shared_ptr<comm::ProcessGroup> tp_ep;     // expert-TP x EP (the dispatchers' group)
  bool sequence_parallel = false;
  /// Single-rank groups for all.
  static MoEGroups single();
};

/// The MoE groups of this process: from parallel_state when it is initialized (Megatron's
/// get_default_pg_collection), else single-rank groups; tp (and sequence_parallel) from `tp`.
MoEGroups default_moe_groups(const tensor_parallel::TPContext& tp);

/// What TopKRouter::backward needs.
struct RouterCtx {
  int64_t T = 0, E = 0;
  Tensor input;                 // the gating input (after jitter) [T, h]
  std::vector<double> jitter;   // [T * h] jitter factors (empty = none)
  TopKState topk;
  std::vector<double> daux_logits;  // gradient of the aux losses and z-loss w.r.t. the logits [T, E]
  DType logits_dtype = DType::kFloat32;
  // The device router (TopKRouter::forward_device; the fields above except input / jitter /
  // logits_dtype unused): logits [T, E] on the device, the top-k choice int64 [T, k] and probs
  // float32 [T, k], the aux losses' per-column score gradient float32 [bsz E] (undefined: none)
  // and the z-loss factor for moe_router_backward.
  bool device = false;
  int64_t bsz = 1;
  Tensor logits, topk_idx, topk_probs, aux_coef;
  double z_coef = 0;
  // forward_device left the expert-bias token counts to add_dispatched_counts (capacity
  // dropping: the final routing map is the dispatcher's).
  bool count_after_dispatch = false;
};

/// MEGATRON_MOE_DEVICE_ROUTER: "1" / unset (the default since tests/gpu/moerouter_check.sh passed
/// on an H200, 2026-12-01: the device router and permutation where
/// TopKRouter::device_routing_supported holds) or "0" (the host float64 router everywhere); any
/// other value is a UserError naming the variable.
bool moe_device_router_enabled();

class TopKRouter {
 public:
  /// Registers "<prefix>.weight" [num_moe_experts, hidden_size] (N(0, init_method_std)).
  /// layer_number is Megatron's 1-based layer number (for the metrics tracker).
  TopKRouter(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config, int64_t layer_number,
             const MoEGroups& groups);
  /// x [T, h] -> routing probs [T, E] (model dtype values; 0 where not routed) and routing map
  /// [T, E] on the host. seq_length/bsz: the [s, b] split of T (for seq_aux_loss). training:
  /// aux losses, z-loss, expert-bias token counts and jitter apply (Megatron's self.training).
  /// grad_enabled false (torch.is_grad_enabled(): the first forward of a fully recomputed layer,
  /// ForwardContext::grad_enabled) skips the aux losses, z-loss, their metric records and the
  /// token counts (the replay does them once); routing and jitter are unchanged.
  void forward(const Tensor& x, int64_t seq_length, int64_t bsz, bool training, uint64_t seed, uint64_t offset,
               std::vector<double>& probs, std::vector<uint8_t>& routing_map, RouterCtx& ctx,
               bool grad_enabled = true);
  /// dprobs [T, E] (host) -> dx [T, h] (x's dtype); accumulates the router weight's gradient.
  Tensor backward(const std::vector<double>& dprobs, RouterCtx& ctx);

  /// True when forward_device can route x: x on CUDA, moe_device_router_enabled(), E <= 1024,
  /// and for the router dtype fp64 float32 or bfloat16 input and weight of one dtype (the float64
  /// gating kernels, ops/cuda/moe_gating_f64.h) (capacity dropping and padding then run in the dispatcher's device
  /// permutation, TokenDispatcher::dispatch_device; the op may still decline a group-limited
  /// shape whose shared memory is too large: forward_device then returns false). Otherwise
  /// (and on the CPU) the host float64 forward runs (docs/moe.md "Kernels").
  bool device_routing_supported(const Tensor& x) const;
  /// forward() on the device (ops::moe_router_forward): the same routing, aux losses, z-loss,
  /// metric records and expert-bias counts, computed in float32 (float64 with the router dtype
  /// fp64: float64 logits, scores and statistics, float32 probs) with float64 column sums; the
  /// choice stays on the device in ctx (ctx.device = true; no host probs / routing map). One
  /// device -> host copy of the statistics (2 bsz E + E + 1 doubles) when the aux losses, z-loss
  /// or expert-bias counts apply. Returns false (nothing done) where the op declines.
  bool forward_device(const Tensor& x, int64_t seq_length, int64_t bsz, bool training, uint64_t seed, uint64_t offset,
                      RouterCtx& ctx, bool grad_enabled = true);
  /// backward() of forward_device: dprobs float32 [N] (the gradient of the permuted probs, on the
  /// device; N = T k dropless, the kept and padding rows with capacity dropping), row_of int64
  /// [T, k] (the permuted row of each choice, ops::moe_permute_map; -1 = dropped, no gradient) ->
  /// dx [T, h]; accumulates the router weight's gradient.
  Tensor backward_device(const Tensor& dprobs, const Tensor& row_of, RouterCtx& ctx);
  /// After forward_device and TokenDispatcher::dispatch_device with --moe-expert-capacity-factor:
  /// adds the final rows per expert (tokens_per_expert [E], the routing map after dropping /
  /// padding, as forward() counts it) to local_tokens_per_expert when forward_device counted
  /// for the expert bias (ctx.count_after_dispatch; otherwise nothing).
  void add_dispatched_counts(const std::vector<int64_t>& tokens_per_expert, RouterCtx& ctx);

  /// Megatron's reset_global_aux_loss_tracker (once per global batch).
  void reset_global_aux_loss_tracker();
  /// Megatron's `expert_bias` buffer: float32 [E] on the host (zeros at construction; undefined
  /// without --moe-router-enable-expert-bias). Saved in checkpoints as
  /// "<prefix>.expert_bias" (training/checkpointing.cpp) and updated in place by
  /// finalize_router_state.
  Tensor& expert_bias() { return expert_bias_; }
  /// Megatron's non-persistent `local_tokens_per_expert` buffer: tokens routed to each expert by
  /// this rank's training forwards since the last finalize_router_state ([E]; empty without
  /// --moe-router-enable-expert-bias).
  std::vector<double>& local_tokens_per_expert() { return local_tokens_per_expert_; }
  /// "<prefix>" given at construction (e.g. "decoder.layers.1.mlp.router").
  const std::string& prefix() const { return prefix_; }
  const MoEGroups& groups() const { return groups_; }
  bool enable_expert_bias() const { return config_.moe_router_enable_expert_bias; }
  double bias_update_rate() const { return config_.moe_router_bias_update_rate; }
  ParamRef weight() const { return weight_; }

 private:
  double aux_coeff(const std::string& type) const;
  TopKOptions topk_options() const;  // the routing options of the config (expert_bias unset)
  /// The aux losses of forward() / forward_device() (Megatron's _apply_aux_loss,
  /// _apply_seq_aux_loss, _apply_global_aux_loss): per enabled type the aux top-k map's token
  /// counts (map_counts(cols): local column sums of the [T E / cols, cols] view; all-reduced over
  /// the type's group here), its loss loss_of(tpe, total_tokens, coeff) (recorded in the metrics
  /// tracker) and its gradient w.r.t. the aux scores, constant per column: returns coef [bsz E]
  /// with d loss / d score[t, e] = coef[(t % bsz) E + e] (times the aux-loss backward scale).
  std::vector<double> aux_losses(int64_t T, int64_t seq_length, int64_t bsz,
                                 const std::function<std::vector<double>(int64_t)>& map_counts,
                                 const std::function<double(const std::vector<double>&, double, double)>& loss_of);
  Tensor jittered_input(const Tensor& x, bool training, uint64_t seed, uint64_t offset, RouterCtx& ctx) const;
  Tensor gating_logits(const Tensor& in, RouterCtx& ctx) const;  // x W^T (fp64: the device's float64 gating)
  Tensor gating_backward(Tensor dl, RouterCtx& ctx);  // dl float32 [T, E] on the device -> dx
  const TransformerConfig& config_;
  int64_t layer_number_;
  MoEGroups groups_;
  ParamRef weight_;
  std::string prefix_;
  Tensor expert_bias_;
  std::vector<double> local_tokens_per_expert_;
  std::vector<double> global_tokens_per_expert_;
  double ga_steps_ = 0;
};

/// What Megatron's finalize_model_grads does to the routers after the last backward of a step
/// (megatron/core/distributed/finalize_model_grads.py _update_router_expert_bias and
/// reset_model_temporary_tensors), for the routers of this rank's model chunks:
///  * with --moe-router-enable-expert-bias: the routers' local_tokens_per_expert stacked
///    [num_routers, E] float32, all-reduced (sum) in one call over the routers' tp_dp_cp group
///    (TP x DP x CP of this pipeline stage), then each expert_bias = get_updated_expert_bias
///    (bias + sign(mean_e(count) - count) * --moe-router-bias-update-rate, float32) and the counts
///    zeroed;
///  * the global aux loss's accumulated token counts reset (reset_global_aux_loss_tracker).
/// Every rank of the tp_dp_cp group must call it at the same point with routers in the same
/// order (one router list per pipeline stage, layer order). No-op for an empty list.
void finalize_router_state(const std::vector<TopKRouter*>& routers);

}  // namespace megatron::transformer::moe
