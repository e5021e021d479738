#include "megatron/core/transformer/moe/token_dispatcher.h"

#include <numeric>

#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"
#ifdef MEGATRON_WITH_CUDA
#include "megatron/core/ops/cuda/moe_capacity.h"
#endif

namespace megatron::transformer::moe {
namespace {

// all_gather of x [n, ...] over g -> [G * n, ...] (identity for one rank).
Tensor gather(comm::ProcessGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  Shape s = x.shape();
  s[0] *= g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  g.all_gather(x, out);
  return out;
}
// reduce_scatter of x [G * n, ...] over g -> [n, ...].
Tensor reduce_scatter(comm::ProcessGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  Shape s = x.shape();
  s[0] /= g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  g.reduce_scatter(x, out);
  return out;
}
std::vector<double> permuted_probs_of(const std::vector<double>& probs, int64_t E, const std::vector<int64_t>& idx,
                                      const std::vector<int64_t>& expert) {
  std::vector<double> p(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) p[i] = probs[static_cast<size_t>(idx[i] * E + expert[i])];
  return p;
}
std::vector<int64_t> experts_of(const std::vector<int64_t>& tokens_per_expert, int64_t e0) {
  std::vector<int64_t> out;
  for (size_t e = 0; e < tokens_per_expert.size(); ++e)
    out.insert(out.end(), static_cast<size_t>(tokens_per_expert[e]), e0 + static_cast<int64_t>(e));
  return out;
}

}  // namespace

void TokenDispatcher::init_ctx(const Tensor& tokens, DispatchCtx& ctx) const {
  ctx.h = tokens.size(-1);
  ctx.T = tokens.numel() / ctx.h;
  ctx.E = *config_.num_moe_experts;
  ctx.e0 = e0_;
  ctx.L = L_;
  ctx.dtype = tokens.dtype();
}

TokenDispatcher::TokenDispatcher(const TransformerConfig& config, const MoEGroups& groups)
    : config_(config), groups_(groups) {
  const int64_t ep = groups.ep->size();
  L_ = *config.num_moe_experts / ep;
  e0_ = groups.ep->rank() * L_;
  MEGATRON_CHECK(groups.tp_ep->size() == ep * groups.expt_tp->size())
      << "tp_ep group of " << groups.tp_ep->size() << " ranks for EP " << ep << " x expert-TP " << groups.expt_tp->size();
}

// ---- device permutation (one rank) ----

Tensor TokenDispatcher::dispatch_device(const Tensor& tokens, const RouterCtx& router,
                                        std::vector<int64_t>* tokens_per_expert, Tensor* permuted_probs,
                                        DispatchCtx& ctx) {
  MEGATRON_CHECK(device_dispatch_supported() && router.device)
      << "dispatch_device with an expert-TP x EP group of " << groups_.tp_ep->size();
  init_ctx(tokens, ctx);
  MEGATRON_CHECK(L_ == ctx.E) << "dispatch_device: " << L_ << " local experts of " << ctx.E;
  int64_t N = router.topk_idx.numel();
  const Device dev = tokens.device();
  ctx.device = true;
  ctx.row_of = Tensor::empty(router.topk_idx.shape(), DType::kInt64, dev);
  Tensor counts = Tensor::empty({ctx.E}, DType::kInt64, dev);
  if (config_.moe_expert_capacity_factor) {
    // Capacity dropping / padding on the device (Megatron's apply_router_token_dropping).
#ifdef MEGATRON_WITH_CUDA
    const int64_t k = router.topk_idx.size(1);
    const int64_t cap = get_capacity(ctx.T * k, ctx.E, *config_.moe_expert_capacity_factor);
    const bool pad = config_.moe_pad_expert_input_to_capacity;
    const int64_t R = ops::cuda::moe_capacity_max_rows(ctx.T, k, ctx.E, cap, pad);
    ctx.row_token = Tensor::empty({R}, DType::kInt64, dev);
    *permuted_probs = Tensor::empty({R}, DType::kFloat32, dev);
    MEGATRON_CHECK(ops::cuda::moe_permute_capacity(router.topk_idx, router.topk_probs, ctx.E, cap,
                                                   config_.moe_token_drop_policy == "position", pad, ctx.row_token,
                                                   ctx.row_of, *permuted_probs, counts))
        << "moe_permute_capacity declined";
#else
    MEGATRON_CHECK(false) << "dispatch_device with capacity dropping in a build without CUDA";
#endif
  } else {
    ctx.row_token = Tensor::empty({N}, DType::kInt64, dev);
    *permuted_probs = Tensor::empty({N}, DType::kFloat32, dev);
    MEGATRON_CHECK(ops::moe_permute_map(router.topk_idx, router.topk_probs, ctx.E, ctx.row_token, ctx.row_of,
                                        *permuted_probs, counts))
        << "moe_permute_map declined";
  }
  Tensor ch = counts.to(Device::cpu());  // the grouped GEMM's sizes: the one sync of the dispatch
  tokens_per_expert->assign(ch.data<int64_t>(), ch.data<int64_t>() + ctx.E);
  if (config_.moe_expert_capacity_factor) {  // the rows kept (and padded): the first N of the buffers
    N = std::accumulate(tokens_per_expert->begin(), tokens_per_expert->end(), int64_t{0});
    ctx.row_token = ctx.row_token.narrow0(0, N);
    *permuted_probs = permuted_probs->narrow0(0, N);
  }
  Tensor out = Tensor::empty({N, ctx.h}, tokens.dtype(), dev);
  if (N > 0) ops::embedding_forward(ctx.row_token, tokens.view({ctx.T, ctx.h}), out);
  return out;
}

Tensor TokenDispatcher::combine_device(const Tensor& expert_output, DispatchCtx& ctx) const {
  Tensor out = Tensor::empty({ctx.T, ctx.h}, ctx.dtype, expert_output.device());
  MEGATRON_CHECK(ops::moe_unpermute(expert_output, ctx.row_of, out)) << "moe_unpermute declined";
  return out;
}

Tensor TokenDispatcher::combine_backward_device(const Tensor& dy, DispatchCtx& ctx) const {
  const int64_t N = ctx.row_token.numel();
  Tensor out = Tensor::empty({N, ctx.h}, dy.dtype(), dy.device());
  if (N > 0) ops::embedding_forward(ctx.row_token, dy.view({ctx.T, ctx.h}), out);
  return out;
}

Tensor TokenDispatcher::dispatch_backward_device(const Tensor& dx, const std::vector<double>& dpermuted_probs,
                                                 DispatchCtx& ctx) const {
  Tensor d = combine_device(dx, ctx);
  ctx.dpermuted_probs = to_device_f32(dpermuted_probs, {static_cast<int64_t>(dpermuted_probs.size())}, dx.device());
  return d;
}

// ---- allgather ----

Tensor MoEAllGatherTokenDispatcher::dispatch(const Tensor& tokens, const std::vector<double>& probs,
                                             const std::vector<uint8_t>& routing_map,
                                             std::vector<int64_t>* tokens_per_expert, Tensor* permuted_probs,
                                             DispatchCtx& ctx) {
  comm::ProcessGroup& g = *groups_.tp_ep;
  init_ctx(tokens, ctx);
  ctx.device = false;
  const int64_t T = ctx.T, E = ctx.E, G = g.size();
  Tensor all_tokens = gather(g, tokens.view({T, ctx.h}));
  // probs and the routing map travel together as float32 [T, 2E].
  std::vector<double> pm(static_cast<size_t>(T * 2 * E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      pm[static_cast<size_t>(t * 2 * E + e)] = probs[static_cast<size_t>(t * E + e)];
      pm[static_cast<size_t>(t * 2 * E + E + e)] = routing_map[static_cast<size_t>(t * E + e)];
    }
  std::vector<double> all_pm = to_host_f64(gather(g, to_device_f32(pm, {T, 2 * E}, tokens.device())));
  std::vector<double> all_probs(static_cast<size_t>(G * T * E));
  std::vector<uint8_t> all_map(static_cast<size_t>(G * T * E));
  for (int64_t t = 0; t < G * T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      all_probs[static_cast<size_t>(t * E + e)] = all_pm[static_cast<size_t>(t * 2 * E + e)];
      all_map[static_cast<size_t>(t * E + e)] = all_pm[static_cast<size_t>(t * 2 * E + E + e)] != 0 ? 1 : 0;
    }
  ctx.idx = permute_indices(all_map, G * T, E, e0_, e0_ + L_, tokens_per_expert);
  ctx.idx_expert = experts_of(*tokens_per_expert, e0_);
  const int64_t N = static_cast<int64_t>(ctx.idx.size());
  *permuted_probs = to_device_f32(permuted_probs_of(all_probs, E, ctx.idx, ctx.idx_expert), {N}, tokens.device());
  return gather_rows(all_tokens, ctx.idx);
}

Tensor MoEAllGatherTokenDispatcher::combine(const Tensor& expert_output, DispatchCtx& ctx) {
  if (ctx.device) return combine_device(expert_output, ctx);
  comm::ProcessGroup& g = *groups_.tp_ep;
  // Unpermute into all gathered tokens (fp32 sums), then reduce-scatter back to this rank's tokens.
  Tensor un = scatter_add_rows(expert_output, ctx.idx, g.size() * ctx.T, DType::kFloat32);
  Tensor mine = reduce_scatter(g, un);
  return mine.dtype() == ctx.dtype ? mine : ops::cast_to(mine, ctx.dtype);
}

Tensor MoEAllGatherTokenDispatcher::combine_backward(const Tensor& dy, DispatchCtx& ctx) {
  if (ctx.device) return combine_backward_device(dy, ctx);
  Tensor all = gather(*groups_.tp_ep, dy.view({ctx.T, ctx.h}));
  return gather_rows(all, ctx.idx);
}

Tensor MoEAllGatherTokenDispatcher::dispatch_backward(const Tensor& dx, const std::vector<double>& dpermuted_probs,
                                                      DispatchCtx& ctx, std::vector<double>* dprobs) {
  if (ctx.device) {
    dprobs->clear();  // the gradient stays on the device: ctx.dpermuted_probs
    return dispatch_backward_device(dx, dpermuted_probs, ctx);
  }
  comm::ProcessGroup& g = *groups_.tp_ep;
  const int64_t G = g.size(), T = ctx.T, E = ctx.E;
  Tensor d = reduce_scatter(g, scatter_add_rows(dx, ctx.idx, G * T, DType::kFloat32));
  std::vector<double> dp(static_cast<size_t>(G * T * E), 0.0);
  for (size_t i = 0; i < ctx.idx.size(); ++i) dp[static_cast<size_t>(ctx.idx[i] * E + ctx.idx_expert[i])] += dpermuted_probs[i];
  *dprobs = to_host_f64(reduce_scatter(g, to_device_f32(dp, {G * T, E}, dx.device())));
  return d.dtype() == ctx.dtype ? d : ops::cast_to(d, ctx.dtype);
}

// ---- alltoall ----

Tensor MoEAlltoAllTokenDispatcher::dispatch(const Tensor& tokens, const std::vector<double>& probs,
                                            const std::vector<uint8_t>& routing_map,
                                            std::vector<int64_t>* tokens_per_expert, Tensor* permuted_probs,
                                            DispatchCtx& ctx) {
  comm::ProcessGroup& g = *groups_.tp_ep;
  init_ctx(tokens, ctx);
  ctx.device = false;
  const int64_t T = ctx.T, E = ctx.E, G = g.size(), etp = groups_.expt_tp->size(), L = L_;
  // Permute local tokens by expert (Megatron's dispatch_preprocess permute()).
  std::vector<int64_t> cnt;
  ctx.idx = permute_indices(routing_map, T, E, 0, E, &cnt);
  ctx.idx_expert = experts_of(cnt, 0);
  ctx.n_local = static_cast<int64_t>(ctx.idx.size());
  Tensor rows = gather_rows(tokens.view({T, ctx.h}), ctx.idx);
  std::vector<double> pp = permuted_probs_of(probs, E, ctx.idx, ctx.idx_expert);
  // Every rank's tokens per expert (Megatron gathers num_local_tokens_per_expert over tp_ep).
  std::vector<double> cntd(cnt.begin(), cnt.end());
  const std::vector<double> all_cnt = to_host_f64(gather(g, to_device_f32(cntd, {E}, tokens.device())));
  std::vector<int64_t> first(static_cast<size_t>(E) + 1, 0);  // first local permuted row of expert e
  for (int64_t e = 0; e < E; ++e) first[static_cast<size_t>(e) + 1] = first[static_cast<size_t>(e)] + cnt[static_cast<size_t>(e)];
  // Send to group rank p = ep_p * etp + tp_p the rows of EP rank ep_p's experts.
  ctx.send_index.clear();
  ctx.in_splits.assign(static_cast<size_t>(G), 0);
  ctx.out_splits.assign(static_cast<size_t>(G), 0);
  for (int64_t p = 0; p < G; ++p) {
    const int64_t ep_p = p / etp;
    for (int64_t r = first[static_cast<size_t>(ep_p * L)]; r < first[static_cast<size_t>((ep_p + 1) * L)]; ++r)
      ctx.send_index.push_back(r);
    ctx.in_splits[static_cast<size_t>(p)] = first[static_cast<size_t>((ep_p + 1) * L)] - first[static_cast<size_t>(ep_p * L)];
    for (int64_t le = 0; le < L; ++le)
      ctx.out_splits[static_cast<size_t>(p)] += static_cast<int64_t>(all_cnt[static_cast<size_t>(p * E + e0_ + le)]);
  }
  Tensor recv = all_to_all(g, gather_rows(rows, ctx.send_index), ctx.out_splits, ctx.in_splits);
  std::vector<double> spp(ctx.send_index.size());
  for (size_t i = 0; i < spp.size(); ++i) spp[i] = pp[static_cast<size_t>(ctx.send_index[i])];
  Tensor recv_p = all_to_all(g, to_device_f32(spp, {static_cast<int64_t>(spp.size()), 1}, tokens.device()),
                             ctx.out_splits, ctx.in_splits);
  ctx.n_recv = recv.size(0);
  // Received rows: by source q, then local expert. Order them [local expert][tp][ep].
  std::vector<int64_t> q_off(static_cast<size_t>(G) + 1, 0);
  for (int64_t q = 0; q < G; ++q) q_off[static_cast<size_t>(q) + 1] = q_off[static_cast<size_t>(q)] + ctx.out_splits[static_cast<size_t>(q)];
  ctx.order.clear();
  tokens_per_expert->assign(static_cast<size_t>(L), 0);
  const int64_t ep = G / etp;
  for (int64_t le = 0; le < L; ++le)
    for (int64_t tp = 0; tp < etp; ++tp)
      for (int64_t e = 0; e < ep; ++e) {
        const int64_t q = e * etp + tp;
        int64_t start = q_off[static_cast<size_t>(q)];
        for (int64_t j = 0; j < le; ++j) start += static_cast<int64_t>(all_cnt[static_cast<size_t>(q * E + e0_ + j)]);
        const int64_t n = static_cast<int64_t>(all_cnt[static_cast<size_t>(q * E + e0_ + le)]);
        for (int64_t r = 0; r < n; ++r) ctx.order.push_back(start + r);
        (*tokens_per_expert)[static_cast<size_t>(le)] += n;
      }
  *permuted_probs = gather_rows(recv_p, ctx.order).view({static_cast<int64_t>(ctx.order.size())});
  return gather_rows(recv, ctx.order);
}

Tensor MoEAlltoAllTokenDispatcher::combine(const Tensor& expert_output, DispatchCtx& ctx) {
  if (ctx.device) return combine_device(expert_output, ctx);
  comm::ProcessGroup& g = *groups_.tp_ep;
  Tensor recv_layout = scatter_add_rows(expert_output, ctx.order, ctx.n_recv, expert_output.dtype());
  Tensor back = all_to_all(g, recv_layout, ctx.in_splits, ctx.out_splits);  // send-buffer layout
  // Sum the expert-TP partial outputs of each local permuted row, then unpermute (fp32 sums).
  Tensor rows = scatter_add_rows(back, ctx.send_index, ctx.n_local, DType::kFloat32);
  return scatter_add_rows(rows, ctx.idx, ctx.T, ctx.dtype);
}

Tensor MoEAlltoAllTokenDispatcher::combine_backward(const Tensor& dy, DispatchCtx& ctx) {
  if (ctx.device) return combine_backward_device(dy, ctx);
  Tensor rows = gather_rows(dy.view({ctx.T, ctx.h}), ctx.idx);
  Tensor recv = all_to_all(*groups_.tp_ep, gather_rows(rows, ctx.send_index), ctx.out_splits, ctx.in_splits);
  return gather_rows(recv, ctx.order);
}

Tensor MoEAlltoAllTokenDispatcher::dispatch_backward(const Tensor& dx, const std::vector<double>& dpermuted_probs,
                                                     DispatchCtx& ctx, std::vector<double>* dprobs) {
  if (ctx.device) {
    dprobs->clear();  // the gradient stays on the device: ctx.dpermuted_probs
    return dispatch_backward_device(dx, dpermuted_probs, ctx);
  }
  comm::ProcessGroup& g = *groups_.tp_ep;
  Tensor recv_layout = scatter_add_rows(dx, ctx.order, ctx.n_recv, dx.dtype());
  Tensor back = all_to_all(g, recv_layout, ctx.in_splits, ctx.out_splits);
  Tensor rows = scatter_add_rows(back, ctx.send_index, ctx.n_local, DType::kFloat32);
  Tensor d = scatter_add_rows(rows, ctx.idx, ctx.T, ctx.dtype);
  // The probs' gradient takes the same way back.
  std::vector<double> dr(static_cast<size_t>(ctx.n_recv), 0.0);
  for (size_t i = 0; i < ctx.order.size(); ++i) dr[static_cast<size_t>(ctx.order[i])] += dpermuted_probs[i];
  const std::vector<double> dback =
      to_host_f64(all_to_all(g, to_device_f32(dr, {ctx.n_recv, 1}, dx.device()), ctx.in_splits, ctx.out_splits));
  std::vector<double> dlocal(static_cast<size_t>(ctx.n_local), 0.0);
  for (size_t i = 0; i < ctx.send_index.size(); ++i) dlocal[static_cast<size_t>(ctx.send_index[i])] += dback[i];
  dprobs->assign(static_cast<size_t>(ctx.T * ctx.E), 0.0);
  for (size_t i = 0; i < ctx.idx.size(); ++i) (*dprobs)[static_cast<size_t>(ctx.idx[i] * ctx.E + ctx.idx_expert[i])] += dlocal[i];
  return d;
}

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const TransformerConfig& config, const MoEGroups& groups) {
  if (config.moe_token_dispatcher_type == "alltoall") return std::make_unique<MoEAlltoAllTokenDispatcher>(config, groups);
  return std::make_unique<MoEAllGatherTokenDispatcher>(config, groups);
}

}  // namespace megatron::transformer::moe
