// Token dispatchers (Megatron-Core's megatron/core/transformer/moe/token_dispatcher.py) over
// comm::ProcessGroup, so MPI, TCP and NCCL all work:
//  * MoEAllGatherTokenDispatcher: all-gather tokens, probs and routing map over expert-TP x EP,
//    permute the rows of this rank's experts; combine = unpermute + reduce-scatter.
//  * MoEAlltoAllTokenDispatcher: permute local tokens by expert, variable all-to-all over
//    expert-TP x EP (each token to every expert-TP rank of its experts' EP rank: Megatron's EP
//    all-to-all followed by the expert-TP all-gather, in one exchange), rows then ordered
//    [local expert][expert-TP rank][EP rank] as Megatron's sort_chunks_by_idxs leaves them;
//    combine reverses it and sums the expert-TP partial outputs.
// Both are exact inverses in backward (the gradient of every gather is the matching scatter-add).
#pragma once

#include <memory>
#include <vector>

#include "megatron/core/transformer/moe/router.h"

namespace megatron::transformer::moe {

struct DispatchCtx {
  int64_t T = 0, E = 0, h = 0, e0 = 0, L = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> idx;          // permuted row -> token (allgather: of the gathered tokens)
  std::vector<int64_t> idx_expert;   // permuted row -> global expert
  // alltoall
  std::vector<int64_t> send_index;   // send-buffer row -> local permuted row
  std::vector<int64_t> in_splits, out_splits;
  std::vector<int64_t> order;        // expert-input row -> received row
  int64_t n_local = 0, n_recv = 0;
  // The device permutation (TokenDispatcher::dispatch_device; one rank of expert-TP x EP): the
  // token of every permuted row int64 [N], the permuted row of every choice int64 [T, k], and
  // (after dispatch_backward) the gradient of the permuted probs float32 [N]. With capacity
  // dropping row_of is -1 for a dropped choice and N the kept (and padding) rows.
  bool device = false;
  Tensor row_token, row_of, dpermuted_probs;
};

class TokenDispatcher {
 public:
  TokenDispatcher(const TransformerConfig& config, const MoEGroups& groups);
  virtual ~TokenDispatcher() = default;
  /// tokens [T, h]; probs / routing_map [T, E] (host) -> expert input [N, h] grouped by local expert,
  /// *tokens_per_expert [num_local_experts], *permuted_probs float32 [N].
  virtual Tensor dispatch(const Tensor& tokens, const std::vector<double>& probs, const std::vector<uint8_t>& routing_map,
                          std::vector<int64_t>* tokens_per_expert, Tensor* permuted_probs, DispatchCtx& ctx) = 0;
  /// Expert output [N, h] -> [T, h] in the tokens' dtype.
  virtual Tensor combine(const Tensor& expert_output, DispatchCtx& ctx) = 0;
  /// d combine output [T, h] -> d expert output [N, h].
  virtual Tensor combine_backward(const Tensor& dy, DispatchCtx& ctx) = 0;
  /// d expert input [N, h] and d permuted probs [N] -> d tokens [T, h]; *dprobs [T, E] (host).
  virtual Tensor dispatch_backward(const Tensor& dx, const std::vector<double>& dpermuted_probs, DispatchCtx& ctx,
                                   std::vector<double>* dprobs) = 0;
  /// True when dispatch_device applies: this rank is the whole expert-TP x EP group.
  bool device_dispatch_supported() const { return groups_.tp_ep->size() == 1; }
  /// dispatch() for a device router's choice (router.ctx.device): permutes on the device
  /// (ops::moe_permute_map + a row gather; Megatron's permute() order, expert-major, tokens
  /// ascending), ctx.device = true, and combine / combine_backward / dispatch_backward then run on
  /// the device (ops::moe_unpermute: each token sums its k rows in choice order). With
  /// --moe-expert-capacity-factor the permutation drops (and with
  /// --moe-pad-expert-input-to-capacity pads) on the device (ops/cuda/moe_capacity.h): dropped
  /// choices have row -1, padding rows of tokens that did not choose the expert carry prob 0 and
  /// are left out of the unpermute sum (their expert output is exactly 0). The one
  /// device -> host copy is the E row counts (*tokens_per_expert, for the grouped GEMM's sizes).
  /// Throws unless device_dispatch_supported().
  Tensor dispatch_device(const Tensor& tokens, const RouterCtx& router, std::vector<int64_t>* tokens_per_expert,
                         Tensor* permuted_probs, DispatchCtx& ctx);
  int64_t num_local_experts() const { return L_; }
  int64_t first_local_expert() const { return e0_; }

 protected:
  /// Fills the shape fields of ctx from the tokens [T, h].
  void init_ctx(const Tensor& tokens, DispatchCtx& ctx) const;
  /// The device forms of combine, combine_backward and dispatch_backward (ctx.device).
  Tensor combine_device(const Tensor& expert_output, DispatchCtx& ctx) const;
  Tensor combine_backward_device(const Tensor& dy, DispatchCtx& ctx) const;
  Tensor dispatch_backward_device(const Tensor& dx, const std::vector<double>& dpermuted_probs, DispatchCtx& ctx) const;
  const TransformerConfig& config_;
  MoEGroups groups_;
  int64_t L_ = 0, e0_ = 0;
};

class MoEAllGatherTokenDispatcher final : public TokenDispatcher {
 public:
  using TokenDispatcher::TokenDispatcher;
  Tensor dispatch(const Tensor& tokens, const std::vector<double>& probs, const std::vector<uint8_t>& routing_map,
                  std::vector<int64_t>* tokens_per_expert, Tensor* permuted_probs, DispatchCtx& ctx) override;
  Tensor combine(const Tensor& expert_output, DispatchCtx& ctx) override;
  Tensor combine_backward(const Tensor& dy, DispatchCtx& ctx) override;
  Tensor dispatch_backward(const Tensor& dx, const std::vector<double>& dpermuted_probs, DispatchCtx& ctx,
                           std::vector<double>* dprobs) override;
};

class MoEAlltoAllTokenDispatcher final : public TokenDispatcher {
 public:
  using TokenDispatcher::TokenDispatcher;
  Tensor dispatch(const Tensor& tokens, const std::vector<double>& probs, const std::vector<uint8_t>& routing_map,
                  std::vector<int64_t>* tokens_per_expert, Tensor* permuted_probs, DispatchCtx& ctx) override;
  Tensor combine(const Tensor& expert_output, DispatchCtx& ctx) override;
  Tensor combine_backward(const Tensor& dy, DispatchCtx& ctx) override;
  Tensor dispatch_backward(const Tensor& dx, const std::vector<double>& dpermuted_probs, DispatchCtx& ctx,
                           std::vector<double>* dprobs) override;
};

/// The dispatcher of --moe-token-dispatcher-type.
std::unique_ptr<TokenDispatcher> make_token_dispatcher(const TransformerConfig& config, const MoEGroups& groups);

}  // namespace megatron::transformer::moe
