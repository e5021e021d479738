// MoE routing math and token permutation (Megatron-Core's megatron/core/transformer/moe/moe_utils.py):
// top-k routing with a score function, group-limited top-k, capacity / token dropping, the
// load-balancing (Switch / sequence / global) and z losses with their gradients, permute /
// unpermute index maps, a variable-size all-to-all over comm::ProcessGroup, the aux-loss backward
// scale (MoEAuxLossAutoScaler) and the per-layer MoE metrics tracker.
//
// The routing math here runs on the host in float64 on [num_tokens, num_experts] matrices (small:
// the router's logits); results are rounded to the model dtype where Megatron's are (probs.type_as(
// logits)). It is the CPU path and the reference of the CUDA device router (ops moe_router_forward
// etc., used by TopKRouter::forward_device; docs/moe.md "Kernels"). Row-major [T, E] vectors throughout; token t is row t of the flattened [s * b] tokens
// (sequence-first, as Megatron's hidden_states.view(-1, h)).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::transformer::moe {

/// Options of topk_routing_with_score_function (Megatron's argument names).
struct TopKOptions {
  int64_t topk = 2;
  bool use_pre_softmax = false;
  int64_t num_groups = 0;  // 0 = no group-limited routing
  int64_t group_topk = 0;
  std::optional<double> scaling_factor;
  std::string score_function = "softmax";  // softmax | sigmoid | sqrtsoftplus
  const std::vector<double>* expert_bias = nullptr;  // [E] (sigmoid / sqrtsoftplus only)
};

/// What the backward of topk_routing_with_score_function needs.
struct TopKState {
  int64_t T = 0, E = 0;
  std::vector<int64_t> top_indices;  // [T, k] selected experts, best first
  std::vector<double> scores;        // softmax / sigmoid / sqrtsoftplus scores [T, E] (pre-softmax / sigmoid)
  std::vector<double> sel;           // [T, k]: softmax(top logits) (softmax without pre-softmax)
};

/// Megatron's topk_routing_with_score_function on logits [T, E]: routing_probs [T, E] (0 where not
/// routed) and routing_map [T, E] (1 = routed). Ties are broken toward the lower expert index.
void topk_routing_with_score_function(const std::vector<double>& logits, int64_t T, int64_t E, const TopKOptions& o,
                                      std::vector<double>& probs, std::vector<uint8_t>& routing_map, TopKState& st);
/// d(logits) [T, E] from d(routing_probs) [T, E] (entries outside the routing map are ignored:
/// they are constants of a scatter in Megatron).
std::vector<double> topk_routing_backward(const std::vector<double>& dprobs, const TopKOptions& o, const TopKState& st);

/// Megatron's compute_routing_scores_for_aux_loss: scores [T, E] (softmax, or sigmoid /
/// sqrtsoftplus normalized per token) and the top-k routing map of those scores.
void compute_routing_scores_for_aux_loss(const std::vector<double>& logits, int64_t T, int64_t E, int64_t topk,
                                         const std::string& score_function, std::vector<double>& scores,
                                         std::vector<uint8_t>& routing_map);
/// d(logits) from d(scores) for compute_routing_scores_for_aux_loss's scores.
std::vector<double> aux_scores_backward(const std::vector<double>& logits, const std::vector<double>& scores,
                                        const std::vector<double>& dscores, int64_t T, int64_t E,
                                        const std::string& score_function);

/// Megatron's switch_load_balancing_loss_func: sum_c(sum_t probs[t, c] * tokens_per_expert[c]) *
/// num_experts * coeff / (topk * total_num_tokens^2). probs [T, C], tokens_per_expert [C]; C is
/// the number of experts, or bsz * num_experts for seq_aux_loss (Megatron's _apply_seq_aux_loss
/// reshapes the scores to [seq_length, bsz * E] but still passes num_experts = E). Throws if
/// probs.size() is not a multiple of C.
double switch_load_balancing_loss(const std::vector<double>& probs, const std::vector<double>& tokens_per_expert,
                                  double total_num_tokens, int64_t topk, int64_t num_experts, double coeff);
/// Megatron's z_loss_func without padding: mean_t(logsumexp(logits[t])^2) * coeff; *dlogits (if
/// given) = its gradient [T, E].
double z_loss(const std::vector<double>& logits, int64_t T, int64_t E, double coeff, std::vector<double>* dlogits);

/// Megatron's get_capacity: ceil(num_tokens / num_experts * capacity_factor).
int64_t get_capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor);
/// Megatron's apply_router_token_dropping on probs / routing_map [T, E] in place. drop_policy
/// "probs" keeps the `capacity` highest-probability tokens of each expert, "position" the earliest
/// routed ones (ties toward the lower token index); pad_to_capacity makes the map exactly the kept
/// set (capacity tokens per expert, padding with probability 0).
void apply_router_token_dropping(std::vector<double>& probs, std::vector<uint8_t>& routing_map, int64_t T, int64_t E,
                                 int64_t topk, double capacity_factor, const std::string& drop_policy,
                                 bool pad_to_capacity);

/// Megatron's get_updated_expert_bias after the all-reduce: bias + sign(mean(count) - count) * rate,
/// in float32 as Megatron's fp32 expert_bias buffer.
std::vector<double> updated_expert_bias(const std::vector<double>& tokens_per_expert, const std::vector<double>& bias,
                                        double rate);

/// Megatron's permute() index map for a routing map [T, E] restricted to experts
/// [e_begin, e_end): the token index of every permuted row, expert-major, tokens in ascending order
/// within an expert (the stable argsort of routing_map.T), and the rows per expert.
std::vector<int64_t> permute_indices(const std::vector<uint8_t>& routing_map, int64_t T, int64_t E, int64_t e_begin,
                                     int64_t e_end, std::vector<int64_t>* tokens_per_expert);

/// rows[i] = x[idx[i]] (x [n, h] any dtype/device; idx host) -> [idx.size(), h] in x's dtype.
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& idx);
/// out[idx[i]] += rows[i], summed in fp32, returned [n, h] in `dtype` on rows' device.
Tensor scatter_add_rows(const Tensor& rows, const std::vector<int64_t>& idx, int64_t n, DType dtype);
/// sum_j a[r, j] * b[r, j] per row (float64 on the host), a, b [n, h] of one shape.
std::vector<double> row_dot(const Tensor& a, const Tensor& b);
/// A host float vector as a float32 tensor on `device`.
Tensor to_device_f32(const std::vector<double>& v, const Shape& shape, Device device);
/// A float tensor's values as float64 on the host.
std::vector<double> to_host_f64(const Tensor& t);

/// Variable-size all-to-all over `group` (torch.distributed.all_to_all_single with split sizes):
/// input rows [sum(in_splits), ...] are sent in rank order, in_splits[p] rows to group rank p;
/// returns [sum(out_splits), ...] with out_splits[p] rows from rank p, in rank order. Built from
/// batch_isend_irecv (so it runs on every backend); the rank's own chunk is copied locally.
Tensor all_to_all(comm::ProcessGroup& group, const Tensor& input, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits);

/// Megatron's MoEAuxLossAutoScaler.main_loss_backward_scale: the factor the aux losses' gradient is
/// multiplied with (the main loss's backward scale: loss_scale x CP size / num_microbatches, or
/// loss_scale with --calculate-per-token-loss; set by the pipeline schedule before each step).
struct MoEAuxLossAutoScaler {
  static void set_loss_scale(double scale);
  static double loss_scale();
  /// The scale Megatron's forward_step (megatron/core/pipeline_parallel/schedules.py) sets before
  /// each step: `loss_scale` with per-token loss, else loss_scale x cp_size / num_microbatches.
  /// The CP factor matches the main loss (which each CP rank multiplies by the CP size before the
  /// gradients are averaged over DP x CP): each CP rank's aux loss covers only its own tokens'
  /// probabilities against the CP-summed token counts, so the CP ranks' gradients sum to the
  /// whole sequence's aux-loss gradient and the average over DP x CP must not halve it.
  static void set_step_loss_scale(double loss_scale, int64_t num_microbatches, bool per_token_loss, int64_t cp_size);
};

/// Megatron's MoE metrics tracker (moe_logging.py get_moe_metrics_tracker): per name
/// ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss") a
/// value per layer, summed over the micro-batches of a step. The training log reads and clears it.
class MoEMetricsTracker {
 public:
  struct Entry {
    std::vector<double> values;  // [num_layers], indexed by layer_number - 1
    comm::ProcessGroup* reduce_group = nullptr;  // summed over this group at report time
    bool needs_dp_avg = true;
    comm::ProcessGroup* avg_group = nullptr;  // averaged over this group (z_loss)
  };
  static MoEMetricsTracker& get();
  /// Adds `value` for (name, layer_number in 1..num_layers).
  void record(const std::string& name, double value, int64_t layer_number, int64_t num_layers,
              comm::ProcessGroup* reduce_group, bool needs_dp_avg, comm::ProcessGroup* avg_group = nullptr);
  std::map<std::string, Entry>& entries() { return entries_; }
  void clear();
  /// Megatron's MoEMetricsTracker.report (megatron/core/transformer/moe/moe_logging.py) without the
  /// writers, called once per training step on every rank (it communicates): each of `names` not
  /// recorded yet is created as num_layers zeros (a pipeline stage without MoE layers), then its
  /// per-layer values are all-reduced over `pp_group` (sum), the entry's reduce_group (sum), its
  /// avg_group (average) and, when needs_dp_avg, `dp_group` (average, the DP group without CP), on
  /// `device` (float32, as Megatron's tensors). Returns (name, sum over layers × loss_scale /
  /// num_moe_layers) in `names` order and zeros the values. With `per_layer` (Megatron's
  /// --moe-per-layer-logging, MoEMetricsTracker._log_per_layer) it also receives, per name and
  /// for every layer i in [0, num_layers) (dense layers too: 0), the TensorBoard tag
  /// "moe/<name>_layer_<i>" with float32(value × loss_scale). Throws if num_moe_layers < 1.
  std::vector<std::pair<std::string, double>> report(double loss_scale, const std::vector<std::string>& names,
                                                     int64_t num_layers, int64_t num_moe_layers,
                                                     comm::ProcessGroup* pp_group, comm::ProcessGroup* dp_group,
                                                     Device device,
                                                     std::vector<std::pair<std::string, double>>* per_layer = nullptr);

 private:
  std::map<std::string, Entry> entries_;
};

}  // namespace megatron::transformer::moe
