#include "megatron/core/transformer/moe/router.h"

#include <cmath>
#include <functional>
#include <random>

#include "megatron/core/ops/ops.h"
#ifdef MEGATRON_WITH_CUDA
#include "megatron/core/ops/cuda/moe_gating_f64.h"
#endif
#include "megatron/core/parallel_state.h"
#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {

MoEGroups MoEGroups::single() {
  MoEGroups g;
  std::shared_ptr<comm::ProcessGroup> one = comm::make_single_rank_group();
  g.tp = g.tp_cp = g.tp_dp_cp = g.ep = g.expt_tp = g.tp_ep = one;
  return g;
}

MoEGroups default_moe_groups(const tensor_parallel::TPContext& tp) {
  MoEGroups g = MoEGroups::single();
  g.tp = tp.group;
  g.sequence_parallel = tp.sequence_parallel;
  if (!parallel_state::model_parallel_is_initialized()) {
    g.tp_cp = g.tp_dp_cp = g.tp_ep = g.expt_tp = tp.group;
    MEGATRON_CHECK(tp.size() == 1) << "MoE with TP " << tp.size() << " needs parallel_state";
    return g;
  }
  auto pick = [](parallel_state::GroupPtr p, const std::shared_ptr<comm::ProcessGroup>& fallback) {
    return p ? p : fallback;
  };
  g.tp_cp = pick(parallel_state::get_tensor_and_context_parallel_group(), g.tp_cp);
  g.tp_dp_cp = pick(parallel_state::get_tensor_and_data_parallel_group(true), g.tp_dp_cp);
  g.ep = pick(parallel_state::get_expert_model_parallel_group(), g.ep);
  g.expt_tp = pick(parallel_state::get_expert_tensor_parallel_group(), g.expt_tp);
  g.tp_ep = pick(parallel_state::get_expert_tensor_and_model_parallel_group(), g.tp_ep);
  return g;
}

TopKRouter::TopKRouter(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                       int64_t layer_number, const MoEGroups& groups)
    : config_(config), layer_number_(layer_number), groups_(groups), prefix_(prefix) {
  const int64_t E = *config.num_moe_experts;
  Parameter p;
  p.name = prefix + ".weight";
  p.global_shape = {E, config.hidden_size};
  p.init = InitKind::kNormal;
  p.init_std = config.init_method_std;
  // Megatron: setattr(weight, 'sequence_parallel', config.sequence_parallel): with SP each TP rank
  // sees its sequence shard, so the gradient is all-reduced over TP by finalize_model_grads.
  p.sequence_parallel = groups.sequence_parallel;
  weight_ = ParamRef(&reg, reg.add(std::move(p), {E, config.hidden_size}));
  if (config.moe_router_enable_expert_bias) {
    expert_bias_ = Tensor::zeros({E}, DType::kFloat32, Device::cpu());  // Megatron keeps it float32
    local_tokens_per_expert_.assign(static_cast<size_t>(E), 0.0);
  }
  global_tokens_per_expert_.assign(static_cast<size_t>(E), 0.0);
}

TopKOptions TopKRouter::topk_options() const {
  TopKOptions o;
  o.topk = config_.moe_router_topk;
  o.use_pre_softmax = config_.moe_router_pre_softmax;
  o.num_groups = config_.moe_router_num_groups;
  o.group_topk = config_.moe_router_group_topk;
  o.scaling_factor = config_.moe_router_topk_scaling_factor;
  o.score_function = config_.moe_router_score_function;
  return o;
}

double TopKRouter::aux_coeff(const std::string& type) const {
  const auto& types = config_.moe_router_load_balancing_type;
  for (size_t i = 0; i < types.size(); ++i)
    if (types[i] == type) return config_.moe_aux_loss_coeff[std::min(i, config_.moe_aux_loss_coeff.size() - 1)];
  return 0.0;
}

Tensor TopKRouter::jittered_input(const Tensor& x, bool training, uint64_t seed, uint64_t offset,
                                  RouterCtx& ctx) const {
  const int64_t h = config_.hidden_size, T = x.numel() / h;
  // Input jitter (Megatron's apply_input_jitter: x * U(1 - eps, 1 + eps), a fresh draw per call).
  Tensor in = x.view({T, h});
  ctx.jitter.clear();
  if (training && config_.moe_input_jitter_eps && *config_.moe_input_jitter_eps > 0) {
    const double eps = *config_.moe_input_jitter_eps;
    std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ull + offset * 1315423911ull + static_cast<uint64_t>(layer_number_));
    std::uniform_real_distribution<double> u(1.0 - eps, 1.0 + eps);
    std::vector<double> xv = to_host_f64(in);
    ctx.jitter.resize(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) xv[i] *= (ctx.jitter[i] = u(gen));
    in = ops::cast_to(to_device_f32(xv, {T, h}, x.device()), x.dtype());
  }
  ctx.input = in;
  return in;
}

Tensor TopKRouter::gating_logits(const Tensor& in, RouterCtx& ctx) const {
  const int64_t E = *config_.num_moe_experts, T = in.size(0);
  if (config_.moe_router_dtype == "fp64") {
    // The device router's float64 gating (device_routing_supported checked the dtypes); the host
    // forward() computes its own float64 logits.
#ifdef MEGATRON_WITH_CUDA
    MEGATRON_CHECK(in.is_cuda()) << "router: float64 gating of a host tensor " << in.str();
    Tensor lg = Tensor::empty({T, E}, DType::kFloat64, in.device());
    ops::cuda::moe_gating_f64_forward(in, weight_.data(), lg);
    ctx.logits_dtype = DType::kFloat64;
    return lg;
#else
    MEGATRON_CHECK(false) << "router: float64 gating on the device in a build without CUDA";
#endif
  }
  const bool f32 = config_.moe_router_dtype == "fp32" && in.dtype() != DType::kFloat32;
  Tensor xi = f32 ? ops::cast_to(in, DType::kFloat32) : in;
  Tensor wi = f32 ? ops::cast_to(weight_.data(), DType::kFloat32) : weight_.data();
  Tensor lg = Tensor::empty({T, E}, xi.dtype(), in.device());
  ops::linear_forward(xi, wi, nullptr, lg);
  ctx.logits_dtype = xi.dtype();
  return lg;
}

std::vector<double> TopKRouter::aux_losses(
    int64_t T, int64_t seq_length, int64_t bsz, const std::function<std::vector<double>(int64_t)>& map_counts,
    const std::function<double(const std::vector<double>&, double, double)>& loss_of) {
  const int64_t E = *config_.num_moe_experts, k = config_.moe_router_topk;
  const double c_aux = aux_coeff("aux_loss"), c_seq = aux_coeff("seq_aux_loss"), c_glob = aux_coeff("global_aux_loss");
  const double scale = MoEAuxLossAutoScaler::loss_scale();
  const double tp_cp = static_cast<double>(groups_.tp_cp->size());
  const int64_t num_layers = config_.num_layers + config_.mtp_num_layers;
  std::vector<double> coef(static_cast<size_t>(bsz * E), 0.0);
  auto count = [&](comm::ProcessGroup& g, int64_t cols, std::vector<double>& tpe) {
    tpe = map_counts(cols);  // all-reduced over g
    if (g.size() > 1) {
      Tensor t = to_device_f32(tpe, {cols}, weight_.data().device());
      g.all_reduce(t);
      tpe = to_host_f64(t);
    }
  };
  const double per_token = config_.calculate_per_token_loss ? static_cast<double>(T) * tp_cp : 1.0;
  const auto n = static_cast<size_t>(bsz * E), ue = static_cast<size_t>(E);
  if (c_aux > 0) {
    std::vector<double> tpe;
    count(*groups_.tp_cp, E, tpe);
    const double total = static_cast<double>(T) * tp_cp;
    const double loss = loss_of(tpe, total, c_aux);
    const double f = static_cast<double>(E) * c_aux / (static_cast<double>(k) * total * total);
    for (size_t c = 0; c < n; ++c) coef[c] += tpe[c % ue] * f * scale * per_token;
    MoEMetricsTracker::get().record("load_balancing_loss", loss / c_aux, layer_number_, num_layers,
                                    groups_.tp_cp.get(), true);
  }
  if (c_seq > 0) {
    // scores.reshape(seq_length, -1): column b * E + e is expert e of sequence b.
    std::vector<double> tpe;
    count(*groups_.tp_cp, bsz * E, tpe);
    const double total = static_cast<double>(seq_length) * tp_cp;
    // num_experts = E (not bsz * E), as Megatron's _apply_seq_aux_loss: the sum over the
    // sequences of their own aux loss, divided by bsz.
    const double loss = loss_of(tpe, total, c_seq) / static_cast<double>(bsz);
    const double f =
        static_cast<double>(E) * c_seq / (static_cast<double>(k) * total * total) / static_cast<double>(bsz);
    const double per_token_seq = config_.calculate_per_token_loss ? static_cast<double>(seq_length * bsz) * tp_cp : 1.0;
    for (size_t c = 0; c < n; ++c) coef[c] += tpe[c] * f * scale * per_token_seq;
    MoEMetricsTracker::get().record("seq_load_balancing_loss", loss / c_seq, layer_number_, num_layers,
                                    groups_.tp_cp.get(), true);
  }
  if (c_glob > 0) {
    std::vector<double> tpe;
    count(*groups_.tp_dp_cp, E, tpe);
    for (size_t e = 0; e < ue; ++e) global_tokens_per_expert_[e] += tpe[e];
    ga_steps_ += 1;
    std::vector<double> avg(ue);
    for (size_t e = 0; e < ue; ++e) avg[e] = global_tokens_per_expert_[e] / ga_steps_;
    const double total = static_cast<double>(T) * static_cast<double>(groups_.tp_dp_cp->size());
    const double loss = loss_of(avg, total, c_glob);
    const double f = static_cast<double>(E) * c_glob / (static_cast<double>(k) * total * total);
    for (size_t c = 0; c < n; ++c) coef[c] += avg[c % ue] * f * scale * per_token;
    MoEMetricsTracker::get().record("global_load_balancing_loss", loss / c_glob, layer_number_, num_layers,
                                    groups_.tp_dp_cp.get(), false);
  }
  return coef;
}

void TopKRouter::forward(const Tensor& x, int64_t seq_length, int64_t bsz, bool training, uint64_t seed, uint64_t offset,
                         std::vector<double>& probs, std::vector<uint8_t>& routing_map, RouterCtx& ctx,
                         bool grad_enabled) {
  const int64_t E = *config_.num_moe_experts, h = config_.hidden_size, T = x.numel() / h;
  MEGATRON_CHECK(T == seq_length * bsz) << "router: " << T << " tokens for [" << seq_length << ", " << bsz << "]";
  ctx.T = T;
  ctx.E = E;
  ctx.device = false;
  Tensor in = jittered_input(x, training, seed, offset, ctx);
  // Gating: logits = x W^T in the router dtype (Megatron's router_gating_linear).
  const std::string& rd = config_.moe_router_dtype;
  std::vector<double> logits;
  if (rd == "fp64") {
    const std::vector<double> xv = to_host_f64(in), wv = to_host_f64(weight_.data());
    logits.assign(static_cast<size_t>(T * E), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < h; ++j) acc += xv[static_cast<size_t>(t * h + j)] * wv[static_cast<size_t>(e * h + j)];
        logits[static_cast<size_t>(t * E + e)] = acc;
      }
    ctx.logits_dtype = DType::kFloat64;
  } else {
    logits = to_host_f64(gating_logits(in, ctx));
  }
  const double scale = MoEAuxLossAutoScaler::loss_scale();
  const double tp_cp = static_cast<double>(groups_.tp_cp->size());
  ctx.daux_logits.assign(static_cast<size_t>(T * E), 0.0);
  // Megatron's tracker spans the decoder and the MTP layers (router.py: num_layers + mtp_num_layers).
  const int64_t num_layers = config_.num_layers + config_.mtp_num_layers;
  // z-loss (Megatron's apply_z_loss: coefficient / tp_cp size, recorded as z_loss / coeff).
  if (training && grad_enabled && config_.moe_z_loss_coeff) {
    const double coeff = *config_.moe_z_loss_coeff / tp_cp;
    std::vector<double> dz;
    const double z = z_loss(logits, T, E, coeff, &dz);
    const double mult = scale * (config_.calculate_per_token_loss ? static_cast<double>(T) * tp_cp : 1.0);
    for (size_t i = 0; i < dz.size(); ++i) ctx.daux_logits[i] += dz[i] * mult;
    if (coeff > 0)
      MoEMetricsTracker::get().record("z_loss", z / coeff, layer_number_, num_layers, nullptr, false,
                                      groups_.tp_dp_cp.get());
  }
  TopKOptions o = topk_options();
  std::vector<double> bias;
  if (config_.moe_router_enable_expert_bias) {
    const float* b = expert_bias_.data<float>();
    bias.assign(b, b + E);
    o.expert_bias = &bias;
  }
  topk_routing_with_score_function(logits, T, E, o, probs, routing_map, ctx.topk);
  // probs.type_as(logits)
  if (ctx.logits_dtype == DType::kBFloat16)
    for (double& p : probs) p = round_bf16(static_cast<float>(p));
  else if (ctx.logits_dtype == DType::kFloat16)
    for (double& p : probs) p = round_fp16(static_cast<float>(p));
  else if (ctx.logits_dtype == DType::kFloat32)
    for (double& p : probs) p = static_cast<float>(p);
  if (config_.moe_expert_capacity_factor)
    apply_router_token_dropping(probs, routing_map, T, E, o.topk, *config_.moe_expert_capacity_factor,
                                config_.moe_token_drop_policy, config_.moe_pad_expert_input_to_capacity);
  // Aux losses (Megatron's _apply_aux_loss / _apply_seq_aux_loss / _apply_global_aux_loss) on the
  // scores and top-k map of compute_routing_scores_for_aux_loss.
  const double c_aux = aux_coeff("aux_loss"), c_seq = aux_coeff("seq_aux_loss"), c_glob = aux_coeff("global_aux_loss");
  if (training && grad_enabled && (c_aux > 0 || c_seq > 0 || c_glob > 0)) {
    std::vector<double> scores;
    std::vector<uint8_t> amap;
    compute_routing_scores_for_aux_loss(logits, T, E, o.topk, o.score_function, scores, amap);
    const std::vector<double> coef = aux_losses(
        T, seq_length, bsz,
        [&](int64_t cols) {  // routing_map.sum(0) of the [rows, cols] view
          std::vector<double> tpe(static_cast<size_t>(cols), 0.0);
          for (size_t i = 0; i < amap.size(); ++i) tpe[i % static_cast<size_t>(cols)] += amap[i];
          return tpe;
        },
        [&](const std::vector<double>& tpe, double total, double coeff) {
          return switch_load_balancing_loss(scores, tpe, total, o.topk, E, coeff);
        });
    std::vector<double> dscores(static_cast<size_t>(T * E));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) dscores[static_cast<size_t>(t * E + e)] = coef[static_cast<size_t>((t % bsz) * E + e)];
    const std::vector<double> dl = aux_scores_backward(logits, scores, dscores, T, E, o.score_function);
    for (size_t i = 0; i < dl.size(); ++i) ctx.daux_logits[i] += dl[i];
  }
  // Expert-bias token counts (Megatron's _apply_expert_bias, on the final routing map).
  if (training && grad_enabled && config_.moe_router_enable_expert_bias)
    for (size_t i = 0; i < routing_map.size(); ++i) local_tokens_per_expert_[i % static_cast<size_t>(E)] += routing_map[i];
}

namespace {
// d input = d jittered input * jitter (Megatron's apply_input_jitter backward).
Tensor jitter_backward(const Tensor& dx, const RouterCtx& ctx) {
  if (ctx.jitter.empty()) return dx;
  std::vector<double> d = to_host_f64(dx);
  for (size_t i = 0; i < d.size(); ++i) d[i] *= ctx.jitter[i];
  return ops::cast_to(to_device_f32(d, dx.shape(), dx.device()), dx.dtype());
}
}  // namespace

// Default 0 (the host float64 router) until tests/gpu/moerouter_check.sh has passed on a GPU
// (session 9, which wrote the device router, had none); 1 selects the device router.
bool moe_device_router_enabled() { return env_switch("MEGATRON_MOE_DEVICE_ROUTER", true); }

bool TopKRouter::device_routing_supported(const Tensor& x) const {
  if (!moe_device_router_enabled() || x.is_cpu() || *config_.num_moe_experts > 1024) return false;
  if (config_.moe_router_dtype != "fp64") return true;
#ifdef MEGATRON_WITH_CUDA
  // fp64: the float64 gating kernels (ops/cuda/moe_gating_f64.h) take float32 or bfloat16 input
  // and weight of one dtype; other runs (fp16) keep the host float64 router.
  const DType wd = weight_.data().dtype();
  return x.is_cuda() && weight_.data().is_cuda() && wd == x.dtype() &&
         (wd == DType::kFloat32 || wd == DType::kBFloat16) &&
         (weight_.grad().dtype() == DType::kFloat32 || weight_.grad().dtype() == DType::kBFloat16);
#else
  return false;
#endif
}

namespace {
int64_t score_function_id(const std::string& f) { return f == "softmax" ? 0 : f == "sigmoid" ? 1 : 2; }
}  // namespace

bool TopKRouter::forward_device(const Tensor& x, int64_t seq_length, int64_t bsz, bool training, uint64_t seed,
                                uint64_t offset, RouterCtx& ctx, bool grad_enabled) {
  const int64_t E = *config_.num_moe_experts, h = config_.hidden_size, T = x.numel() / h;
  MEGATRON_CHECK(T == seq_length * bsz) << "router: " << T << " tokens for [" << seq_length << ", " << bsz << "]";
  const TopKOptions o = topk_options();
  const int64_t k = o.topk;
  const double c_aux = aux_coeff("aux_loss"), c_seq = aux_coeff("seq_aux_loss"), c_glob = aux_coeff("global_aux_loss");
  const bool aux = training && grad_enabled && (c_aux > 0 || c_seq > 0 || c_glob > 0);
  const bool z = training && grad_enabled && config_.moe_z_loss_coeff.has_value();
  const bool bias_counts = training && grad_enabled && config_.moe_router_enable_expert_bias;
  ctx.T = T;
  ctx.E = E;
  ctx.bsz = bsz;
  ctx.count_after_dispatch = false;
  Tensor in = jittered_input(x, training, seed, offset, ctx);
  ctx.logits = gating_logits(in, ctx);
  ctx.topk_idx = Tensor::empty({T, k}, DType::kInt64, x.device());
  ctx.topk_probs = Tensor::empty({T, k}, DType::kFloat32, x.device());
  Tensor bias;
  if (config_.moe_router_enable_expert_bias) bias = expert_bias_.to(x.device());
  Tensor stats;
  if (aux || z || bias_counts) stats = Tensor::empty({2 * bsz * E + E + 1}, DType::kFloat64, x.device());
  if (!ops::moe_router_forward(ctx.logits, bias.defined() ? &bias : nullptr, k, score_function_id(o.score_function),
                               o.use_pre_softmax, o.scaling_factor ? static_cast<float>(*o.scaling_factor) : 1.0f,
                               o.num_groups, o.group_topk, bsz, ctx.topk_idx, ctx.topk_probs,
                               stats.defined() ? &stats : nullptr))
    return false;
  ctx.device = true;
  ctx.aux_coef = Tensor();
  ctx.z_coef = 0;
  if (!stats.defined()) return true;
  Tensor sh = stats.to(Device::cpu());  // the one statistics copy of this forward
  const double* st = sh.data<double>();
  const int64_t BE = bsz * E;
  const double scale = MoEAuxLossAutoScaler::loss_scale();
  const double tp_cp = static_cast<double>(groups_.tp_cp->size());
  const int64_t num_layers = config_.num_layers + config_.mtp_num_layers;
  // z-loss as forward(): mean_t lse_t^2 * coeff; d/dlogit_e = coeff * 2 lse_t softmax_e / T * mult.
  if (z) {
    const double coeff = *config_.moe_z_loss_coeff / tp_cp;
    const double mult = scale * (config_.calculate_per_token_loss ? static_cast<double>(T) * tp_cp : 1.0);
    ctx.z_coef = coeff * 2.0 / static_cast<double>(T) * mult;
    if (coeff > 0)
      MoEMetricsTracker::get().record("z_loss", st[2 * BE + E] / static_cast<double>(T), layer_number_, num_layers,
                                      nullptr, false, groups_.tp_dp_cp.get());
  }
  if (aux) {
    // The [bsz, E] column sums of the aux scores and of their top-k map (stats), folded to the
    // [rows, cols] view each loss takes (cols = E or bsz E).
    auto fold = [&](const double* v, int64_t cols) {
      std::vector<double> r(static_cast<size_t>(cols), 0.0);
      for (int64_t c = 0; c < BE; ++c) r[static_cast<size_t>(c % cols)] += v[c];
      return r;
    };
    const std::vector<double> coef = aux_losses(
        T, seq_length, bsz, [&](int64_t cols) { return fold(st + BE, cols); },
        [&](const std::vector<double>& tpe, double total, double coeff) {
          const std::vector<double> sums = fold(st, static_cast<int64_t>(tpe.size()));
          double acc = 0;
          for (size_t i = 0; i < tpe.size(); ++i) acc += sums[i] * tpe[i];
          return acc * (static_cast<double>(E) * coeff / (static_cast<double>(k) * total * total));
        });
    ctx.aux_coef = to_device_f32(coef, {BE}, x.device());
  }
  // Expert-bias token counts (Megatron's _apply_expert_bias, on the routing map). With capacity
  // dropping the final map is the dispatcher's (add_dispatched_counts).
  if (bias_counts && config_.moe_expert_capacity_factor)
    ctx.count_after_dispatch = true;
  else if (bias_counts)
    for (int64_t e = 0; e < E; ++e) local_tokens_per_expert_[static_cast<size_t>(e)] += st[2 * BE + e];
  return true;
}

void TopKRouter::add_dispatched_counts(const std::vector<int64_t>& tokens_per_expert, RouterCtx& ctx) {
  if (!ctx.count_after_dispatch) return;
  MEGATRON_CHECK(tokens_per_expert.size() == local_tokens_per_expert_.size())
      << prefix_ << ": " << tokens_per_expert.size() << " expert counts for " << local_tokens_per_expert_.size();
  for (size_t e = 0; e < tokens_per_expert.size(); ++e)
    local_tokens_per_expert_[e] += static_cast<double>(tokens_per_expert[e]);
  ctx.count_after_dispatch = false;
}

Tensor TopKRouter::backward_device(const Tensor& dprobs, const Tensor& row_of, RouterCtx& ctx) {
  MEGATRON_CHECK(ctx.device) << "TopKRouter::backward_device after a host forward";
  const TopKOptions o = topk_options();
  Tensor dl = Tensor::empty({ctx.T, ctx.E}, DType::kFloat32, ctx.logits.device());
  MEGATRON_CHECK(ops::moe_router_backward(ctx.logits, ctx.topk_idx, dprobs, row_of, score_function_id(o.score_function),
                                          o.use_pre_softmax,
                                          o.scaling_factor ? static_cast<float>(*o.scaling_factor) : 1.0f, ctx.bsz,
                                          ctx.aux_coef.defined() ? &ctx.aux_coef : nullptr,
                                          static_cast<float>(ctx.z_coef), dl))
      << "moe_router_backward declined after moe_router_forward ran";
  Tensor dx = gating_backward(dl, ctx);
  ctx.logits = ctx.topk_idx = ctx.topk_probs = ctx.aux_coef = Tensor();
  return dx;
}

Tensor TopKRouter::backward(const std::vector<double>& dprobs, RouterCtx& ctx) {
  TopKOptions o = topk_options();
  std::vector<double> dl = topk_routing_backward(dprobs, o, ctx.topk);
  for (size_t i = 0; i < dl.size(); ++i) dl[i] += ctx.daux_logits[i];
  const int64_t T = ctx.T, E = ctx.E, h = config_.hidden_size;
  const Tensor& in = ctx.input;
  Tensor dx;
  if (ctx.logits_dtype == DType::kFloat64) {
    // fp64 gating on the host: dx = dl W, dW += dl^T x.
    const std::vector<double> xv = to_host_f64(in), wv = to_host_f64(weight_.data());
    std::vector<double> dxv(static_cast<size_t>(T * h), 0.0), dwv(static_cast<size_t>(E * h), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        const double g = dl[static_cast<size_t>(t * E + e)];
        if (g == 0) continue;
        for (int64_t j = 0; j < h; ++j) {
          dxv[static_cast<size_t>(t * h + j)] += g * wv[static_cast<size_t>(e * h + j)];
          dwv[static_cast<size_t>(e * h + j)] += g * xv[static_cast<size_t>(t * h + j)];
        }
      }
    Tensor dw = to_device_f32(dwv, {E, h}, in.device());
    if (weight_.grad().dtype() != DType::kFloat32) dw = ops::cast_to(dw, weight_.grad().dtype());
    ops::add_(weight_.grad(), dw);
    dx = ops::cast_to(to_device_f32(dxv, {T, h}, in.device()), in.dtype());
  } else {
    return gating_backward(to_device_f32(dl, {T, E}, in.device()), ctx);
  }
  return jitter_backward(dx, ctx);
}

Tensor TopKRouter::gating_backward(Tensor dlt, RouterCtx& ctx) {
  const int64_t T = ctx.T, h = config_.hidden_size;
  const Tensor& in = ctx.input;
  const DType ld = ctx.logits_dtype;
  if (ld == DType::kFloat64) {  // the device router's float64 gating (backward_device)
#ifdef MEGATRON_WITH_CUDA
    Tensor dx = Tensor::empty({T, h}, in.dtype(), in.device());
    ops::cuda::moe_gating_f64_backward(dlt, in, weight_.data(), dx, weight_.grad());
    return jitter_backward(dx, ctx);
#else
    MEGATRON_CHECK(false) << "router: float64 gating backward on the device in a build without CUDA";
#endif
  }
  if (ld != DType::kFloat32) dlt = ops::cast_to(dlt, ld);
  Tensor xi = in.dtype() == ld ? in : ops::cast_to(in, ld);
  Tensor wi = weight_.data().dtype() == ld ? weight_.data() : ops::cast_to(weight_.data(), ld);
  Tensor dxi = Tensor::empty({T, h}, ld, in.device());
  ops::linear_backward(dlt, xi, wi, &dxi, &weight_.grad(), nullptr, true);
  return jitter_backward(ld == in.dtype() ? dxi : ops::cast_to(dxi, in.dtype()), ctx);
}

void TopKRouter::reset_global_aux_loss_tracker() {
  std::fill(global_tokens_per_expert_.begin(), global_tokens_per_expert_.end(), 0.0);
  ga_steps_ = 0;
}

void finalize_router_state(const std::vector<TopKRouter*>& routers) {
  if (routers.empty()) return;
  std::vector<TopKRouter*> biased;
  for (TopKRouter* r : routers)
    if (r->enable_expert_bias()) biased.push_back(r);
  if (!biased.empty()) {
    const auto E = static_cast<int64_t>(biased.front()->local_tokens_per_expert().size());
    const auto R = static_cast<int64_t>(biased.size());
    std::vector<double> stacked;
    stacked.reserve(static_cast<size_t>(R * E));
    for (TopKRouter* r : biased) {
      MEGATRON_CHECK(static_cast<int64_t>(r->local_tokens_per_expert().size()) == E)
          << r->prefix() << ": " << r->local_tokens_per_expert().size() << " experts, expected " << E;
      stacked.insert(stacked.end(), r->local_tokens_per_expert().begin(), r->local_tokens_per_expert().end());
    }
    comm::ProcessGroup& g = *biased.front()->groups().tp_dp_cp;
    if (g.size() > 1) {
      // float32 as Megatron's buffers (integer counts: exact below 2^24), on the weights' device.
      Tensor t = to_device_f32(stacked, {R, E}, biased.front()->weight().data().device());
      g.all_reduce(t);
      stacked = to_host_f64(t);
    }
    for (int64_t k = 0; k < R; ++k) {
      TopKRouter& r = *biased[static_cast<size_t>(k)];
      float* b = r.expert_bias().data<float>();
      const std::vector<double> counts(stacked.begin() + k * E, stacked.begin() + (k + 1) * E);
      const std::vector<double> updated = updated_expert_bias(counts, std::vector<double>(b, b + E), r.bias_update_rate());
      for (int64_t e = 0; e < E; ++e) b[e] = static_cast<float>(updated[static_cast<size_t>(e)]);
      std::fill(r.local_tokens_per_expert().begin(), r.local_tokens_per_expert().end(), 0.0);
    }
  }
  for (TopKRouter* r : routers) r->reset_global_aux_loss_tracker();
}

}  // namespace megatron::transformer::moe
