#include "megatron/core/transformer/moe/moe_utils.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {
namespace {

// Indices of the k largest values of v[0..n) (ties: lower index first), best first.
std::vector<int64_t> topk_indices(const double* v, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [v](int64_t a, int64_t b) { return v[a] > v[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

void softmax_row(const double* x, int64_t n, double* y) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (y[i] = std::exp(x[i] - m));
  for (int64_t i = 0; i < n; ++i) y[i] /= s;
}

// y = softmax(x): dx = y * (dy - <y, dy>).
void softmax_backward_row(const double* y, const double* dy, int64_t n, double* dx) {
  double dot = 0;
  for (int64_t i = 0; i < n; ++i) dot += y[i] * dy[i];
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - dot);
}

// The score function's value and derivative at x (sigmoid / sqrtsoftplus).
double score_of(const std::string& f, double x) { return f == "sigmoid" ? sigmoid(x) : std::sqrt(softplus(x)); }
double score_grad(const std::string& f, double x) {
  if (f == "sigmoid") {
    const double s = sigmoid(x);
    return s * (1.0 - s);
  }
  const double r = std::sqrt(softplus(x));
  return r > 0 ? sigmoid(x) / (2.0 * r) : 0.0;
}

// Top-k of one row of `scores` [E] with optional group limiting (Megatron's group_limited_topk:
// groups ranked by the sum of their top (topk / group_topk) scores).
std::vector<int64_t> compute_topk(const double* s, int64_t E, const TopKOptions& o) {
  if (o.group_topk <= 0) return topk_indices(s, E, o.topk);
  const int64_t G = o.num_groups, per = E / G, take = o.topk / o.group_topk;
  std::vector<double> gs(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    std::vector<int64_t> t = topk_indices(s + g * per, per, take);
    double sum = 0;
    for (int64_t i : t) sum += s[g * per + i];
    gs[static_cast<size_t>(g)] = sum;
  }
  std::vector<int64_t> groups = topk_indices(gs.data(), G, o.group_topk);
  std::vector<double> masked(static_cast<size_t>(E), -std::numeric_limits<double>::infinity());
  for (int64_t g : groups)
    for (int64_t i = 0; i < per; ++i) masked[static_cast<size_t>(g * per + i)] = s[g * per + i];
  return topk_indices(masked.data(), E, o.topk);
}

}  // namespace

void topk_routing_with_score_function(const std::vector<double>& logits, int64_t T, int64_t E, const TopKOptions& o,
                                      std::vector<double>& probs, std::vector<uint8_t>& routing_map, TopKState& st) {
  MEGATRON_CHECK(static_cast<int64_t>(logits.size()) == T * E && o.topk >= 1 && o.topk <= E)
      << "topk routing: " << logits.size() << " logits for " << T << "x" << E << ", topk " << o.topk;
  const int64_t k = o.topk;
  st.T = T;
  st.E = E;
  st.top_indices.assign(static_cast<size_t>(T * k), 0);
  st.scores.assign(static_cast<size_t>(T * E), 0.0);
  st.sel.assign(static_cast<size_t>(T * k), 0.0);
  probs.assign(static_cast<size_t>(T * E), 0.0);
  routing_map.assign(static_cast<size_t>(T * E), 0);
  const double scale = o.scaling_factor ? *o.scaling_factor : 1.0;
  std::vector<double> p(static_cast<size_t>(k)), buf(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const double* x = logits.data() + t * E;
    double* s = st.scores.data() + t * E;
    std::vector<int64_t> top;
    if (o.score_function == "softmax") {
      if (o.use_pre_softmax) {
        softmax_row(x, E, s);
        top = compute_topk(s, E, o);
        for (int64_t j = 0; j < k; ++j) p[static_cast<size_t>(j)] = s[top[static_cast<size_t>(j)]];
      } else {
        top = compute_topk(x, E, o);
        std::vector<double> l(static_cast<size_t>(k));
        for (int64_t j = 0; j < k; ++j) l[static_cast<size_t>(j)] = x[top[static_cast<size_t>(j)]];
        softmax_row(l.data(), k, p.data());
        for (int64_t j = 0; j < k; ++j) st.sel[static_cast<size_t>(t * k + j)] = p[static_cast<size_t>(j)];
      }
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = score_of(o.score_function, x[e]);
      if (o.expert_bias) {
        for (int64_t e = 0; e < E; ++e) buf[static_cast<size_t>(e)] = s[e] + (*o.expert_bias)[static_cast<size_t>(e)];
        top = compute_topk(buf.data(), E, o);
      } else {
        top = compute_topk(s, E, o);
      }
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += s[top[static_cast<size_t>(j)]];
      for (int64_t j = 0; j < k; ++j)
        p[static_cast<size_t>(j)] = k > 1 ? s[top[static_cast<size_t>(j)]] / (sum + 1e-20) : s[top[static_cast<size_t>(j)]];
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = top[static_cast<size_t>(j)];
      st.top_indices[static_cast<size_t>(t * k + j)] = e;
      probs[static_cast<size_t>(t * E + e)] = p[static_cast<size_t>(j)] * scale;
      routing_map[static_cast<size_t>(t * E + e)] = 1;
    }
  }
}

std::vector<double> topk_routing_backward(const std::vector<double>& dprobs, const TopKOptions& o, const TopKState& st) {
  const int64_t T = st.T, E = st.E, k = o.topk;
  const double scale = o.scaling_factor ? *o.scaling_factor : 1.0;
  std::vector<double> dlogits(static_cast<size_t>(T * E), 0.0);
  std::vector<double> dp(static_cast<size_t>(k)), tmp(static_cast<size_t>(E)), dtmp(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t* top = st.top_indices.data() + t * k;
    for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(j)] = dprobs[static_cast<size_t>(t * E + top[j])] * scale;
    double* dl = dlogits.data() + t * E;
    const double* s = st.scores.data() + t * E;
    if (o.score_function == "softmax") {
      if (o.use_pre_softmax) {
        std::fill(dtmp.begin(), dtmp.end(), 0.0);
        for (int64_t j = 0; j < k; ++j) dtmp[static_cast<size_t>(top[j])] += dp[static_cast<size_t>(j)];
        softmax_backward_row(s, dtmp.data(), E, dl);
      } else {
        std::vector<double> dsel(static_cast<size_t>(k));
        softmax_backward_row(st.sel.data() + t * k, dp.data(), k, dsel.data());
        for (int64_t j = 0; j < k; ++j) dl[top[j]] += dsel[static_cast<size_t>(j)];
      }
    } else {
      // p_j = s_j / D (k > 1, D = sum s + 1e-20) or s_j; ds then through the score function.
      double D = 1e-20, dot = 0;
      for (int64_t j = 0; j < k; ++j) D += s[top[j]];
      for (int64_t j = 0; j < k; ++j) dot += dp[static_cast<size_t>(j)] * s[top[j]];
      for (int64_t j = 0; j < k; ++j) {
        const double ds = k > 1 ? dp[static_cast<size_t>(j)] / D - dot / (D * D) : dp[static_cast<size_t>(j)];
        // d score / d logit from the score itself: sigmoid s(1 - s); sqrt(softplus(x)) has
        // sigmoid(x) = 1 - exp(-s^2), so (1 - exp(-s^2)) / (2 s).
        const double sc = s[top[j]];
        const double dsdx = o.score_function == "sigmoid" ? sc * (1.0 - sc) : (sc > 0 ? -std::expm1(-sc * sc) / (2.0 * sc) : 0.0);
        dl[top[j]] += ds * dsdx;
      }
    }
  }
  return dlogits;
}

void compute_routing_scores_for_aux_loss(const std::vector<double>& logits, int64_t T, int64_t E, int64_t topk,
                                         const std::string& score_function, std::vector<double>& scores,
                                         std::vector<uint8_t>& routing_map) {
  scores.assign(static_cast<size_t>(T * E), 0.0);
  routing_map.assign(static_cast<size_t>(T * E), 0);
  for (int64_t t = 0; t < T; ++t) {
    const double* x = logits.data() + t * E;
    double* s = scores.data() + t * E;
    if (score_function == "softmax") {
      softmax_row(x, E, s);
    } else {
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = score_of(score_function, x[e]));
      for (int64_t e = 0; e < E; ++e) s[e] /= sum + 1e-20;
    }
    for (int64_t e : topk_indices(s, E, topk)) routing_map[static_cast<size_t>(t * E + e)] = 1;
  }
}

std::vector<double> aux_scores_backward(const std::vector<double>& logits, const std::vector<double>& scores,
                                        const std::vector<double>& dscores, int64_t T, int64_t E,
                                        const std::string& score_function) {
  std::vector<double> dl(static_cast<size_t>(T * E), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double* s = scores.data() + t * E;
    const double* ds = dscores.data() + t * E;
    double* d = dl.data() + t * E;
    if (score_function == "softmax") {
      softmax_backward_row(s, ds, E, d);
      continue;
    }
    // n_e = r_e / D, D = sum r + 1e-20, r = score_of(x): dr_m = dn_m / D - <dn, r> / D^2.
    const double* x = logits.data() + t * E;
    double D = 1e-20, dot = 0;
    std::vector<double> r(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) D += (r[static_cast<size_t>(e)] = score_of(score_function, x[e]));
    for (int64_t e = 0; e < E; ++e) dot += ds[e] * r[static_cast<size_t>(e)];
    for (int64_t e = 0; e < E; ++e) d[e] = (ds[e] / D - dot / (D * D)) * score_grad(score_function, x[e]);
  }
  return dl;
}

double switch_load_balancing_loss(const std::vector<double>& probs, const std::vector<double>& tokens_per_expert,
                                  double total_num_tokens, int64_t topk, int64_t num_experts, double coeff) {
  const auto C = static_cast<int64_t>(tokens_per_expert.size());
  MEGATRON_CHECK(C > 0 && static_cast<int64_t>(probs.size()) % C == 0)
      << "switch_load_balancing_loss: " << probs.size() << " probs for " << C << " columns";
  const int64_t T = static_cast<int64_t>(probs.size()) / C;
  double acc = 0;
  for (int64_t c = 0; c < C; ++c) {
    double col = 0;
    for (int64_t t = 0; t < T; ++t) col += probs[static_cast<size_t>(t * C + c)];
    acc += col * tokens_per_expert[static_cast<size_t>(c)];
  }
  return acc * (static_cast<double>(num_experts) * coeff /
                (static_cast<double>(topk) * total_num_tokens * total_num_tokens));
}

double z_loss(const std::vector<double>& logits, int64_t T, int64_t E, double coeff, std::vector<double>* dlogits) {
  if (dlogits) dlogits->assign(static_cast<size_t>(T * E), 0.0);
  double acc = 0;
  std::vector<double> sm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const double* x = logits.data() + t * E;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t e = 0; e < E; ++e) m = std::max(m, x[e]);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(x[e] - m);
    const double lse = m + std::log(s);
    acc += lse * lse;
    if (dlogits) {
      softmax_row(x, E, sm.data());
      for (int64_t e = 0; e < E; ++e)
        (*dlogits)[static_cast<size_t>(t * E + e)] = coeff * 2.0 * lse * sm[static_cast<size_t>(e)] / static_cast<double>(T);
    }
  }
  return acc / static_cast<double>(T) * coeff;
}

int64_t get_capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor) {
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(num_tokens) / static_cast<double>(num_experts) * capacity_factor));
}

void apply_router_token_dropping(std::vector<double>& probs, std::vector<uint8_t>& routing_map, int64_t T, int64_t E,
                                 int64_t topk, double capacity_factor, const std::string& drop_policy,
                                 bool pad_to_capacity) {
  const int64_t cap = get_capacity(T * topk, E, capacity_factor);
  std::vector<uint8_t> mask(static_cast<size_t>(T * E), 0);
  if (cap > T) {
    std::fill(mask.begin(), mask.end(), 1);
  } else {
    std::vector<double> col(static_cast<size_t>(T));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t t = 0; t < T; ++t)
        col[static_cast<size_t>(t)] = drop_policy == "probs" ? probs[static_cast<size_t>(t * E + e)]
                                                             : static_cast<double>(routing_map[static_cast<size_t>(t * E + e)]);
      for (int64_t t : topk_indices(col.data(), T, cap)) mask[static_cast<size_t>(t * E + e)] = 1;
    }
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    routing_map[i] = pad_to_capacity ? mask[i] : static_cast<uint8_t>(routing_map[i] && mask[i]);
    probs[i] = routing_map[i] ? probs[i] : 0.0;
  }
}

std::vector<double> updated_expert_bias(const std::vector<double>& tokens_per_expert, const std::vector<double>& bias,
                                        double rate) {
  float mean = 0;
  for (double c : tokens_per_expert) mean += static_cast<float>(c);
  mean /= static_cast<float>(tokens_per_expert.size());
  std::vector<double> out(bias.size());
  for (size_t e = 0; e < bias.size(); ++e) {
    const float off = mean - static_cast<float>(tokens_per_expert[e]);
    const float sgn = off > 0 ? 1.0f : off < 0 ? -1.0f : 0.0f;
    out[e] = static_cast<float>(bias[e]) + sgn * static_cast<float>(rate);
  }
  return out;
}

std::vector<int64_t> permute_indices(const std::vector<uint8_t>& routing_map, int64_t T, int64_t E, int64_t e_begin,
                                     int64_t e_end, std::vector<int64_t>* tokens_per_expert) {
  std::vector<int64_t> idx;
  if (tokens_per_expert) tokens_per_expert->assign(static_cast<size_t>(e_end - e_begin), 0);
  for (int64_t e = e_begin; e < e_end; ++e)
    for (int64_t t = 0; t < T; ++t)
      if (routing_map[static_cast<size_t>(t * E + e)]) {
        idx.push_back(t);
        if (tokens_per_expert) ++(*tokens_per_expert)[static_cast<size_t>(e - e_begin)];
      }
  return idx;
}

Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& idx) {
  const int64_t h = x.size(-1), n = x.numel() / h;
  Tensor out = Tensor::empty({static_cast<int64_t>(idx.size()), h}, x.dtype(), x.device());
  if (idx.empty()) return out;
  Tensor ids = Tensor::from_vector_i64(idx, {static_cast<int64_t>(idx.size())});
  if (!x.is_cpu()) ids = ids.to(x.device());
  ops::embedding_forward(ids, x.view({n, h}), out);
  return out;
}

Tensor scatter_add_rows(const Tensor& rows, const std::vector<int64_t>& idx, int64_t n, DType dtype) {
  const int64_t h = rows.size(-1);
  Tensor acc = Tensor::zeros({n, h}, DType::kFloat32, rows.device());
  if (!idx.empty()) {
    Tensor ids = Tensor::from_vector_i64(idx, {static_cast<int64_t>(idx.size())});
    if (!rows.is_cpu()) ids = ids.to(rows.device());
    ops::embedding_backward(rows.view({static_cast<int64_t>(idx.size()), h}), ids, acc);
  }
  return dtype == DType::kFloat32 ? acc : ops::cast_to(acc, dtype);
}

std::vector<double> to_host_f64(const Tensor& t) {
  Tensor c = t.is_cpu() ? t : t.to(Device::cpu());
  if (c.dtype() != DType::kFloat32) c = c.to(DType::kFloat32);
  const float* p = c.data<float>();
  return std::vector<double>(p, p + c.numel());
}

std::vector<double> row_dot(const Tensor& a, const Tensor& b) {
  MEGATRON_CHECK(a.shape() == b.shape()) << "row_dot " << a.str() << " vs " << b.str();
  const int64_t h = a.dim() ? a.size(-1) : 1, n = h ? a.numel() / h : 0;
  // On the device (ops::row_dot_f64): only the n sums come to the host, not both [n, h] operands.
  Tensor out = Tensor::empty({n}, DType::kFloat64, a.device());
  if (n > 0) ops::row_dot_f64(a, b, out);
  Tensor c = out.is_cpu() ? out : out.to(Device::cpu());
  const double* p = c.data<double>();
  return std::vector<double>(p, p + n);
}

Tensor to_device_f32(const std::vector<double>& v, const Shape& shape, Device device) {
  std::vector<float> f(v.begin(), v.end());
  Tensor t = Tensor::from_vector(f, shape);
  return device.is_cpu() ? t : t.to(device);
}

Tensor all_to_all(comm::ProcessGroup& group, const Tensor& input, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits) {
  const int G = group.size(), me = group.rank();
  MEGATRON_CHECK(static_cast<int>(out_splits.size()) == G && static_cast<int>(in_splits.size()) == G)
      << "all_to_all: " << out_splits.size() << "/" << in_splits.size() << " splits for a group of " << G;
  Shape oshape = input.shape();
  const int64_t out_rows = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  oshape[0] = out_rows;
  Tensor out = Tensor::empty(oshape, input.dtype(), input.device());
  std::vector<int64_t> in_off(static_cast<size_t>(G) + 1, 0), out_off(static_cast<size_t>(G) + 1, 0);
  for (int p = 0; p < G; ++p) {
    in_off[static_cast<size_t>(p) + 1] = in_off[static_cast<size_t>(p)] + in_splits[static_cast<size_t>(p)];
    out_off[static_cast<size_t>(p) + 1] = out_off[static_cast<size_t>(p)] + out_splits[static_cast<size_t>(p)];
  }
  MEGATRON_CHECK(in_off.back() == input.size(0)) << "all_to_all: splits sum " << in_off.back() << " for " << input.str();
  std::vector<Tensor> bufs;
  bufs.reserve(static_cast<size_t>(2 * G));
  std::vector<comm::P2POp> ops_list;
  for (int p = 0; p < G; ++p) {
    const auto up = static_cast<size_t>(p);
    if (p == me) {
      if (in_splits[up] > 0) {
        Tensor dst = out.narrow0(out_off[up], out_splits[up]);
        dst.copy_(input.narrow0(in_off[up], in_splits[up]));
      }
      continue;
    }
    if (in_splits[up] > 0) {
      bufs.push_back(input.narrow0(in_off[up], in_splits[up]));
      ops_list.push_back({comm::P2POp::kSend, &bufs.back(), p});
    }
    if (out_splits[up] > 0) {
      bufs.push_back(out.narrow0(out_off[up], out_splits[up]));
      ops_list.push_back({comm::P2POp::kRecv, &bufs.back(), p});
    }
  }
  if (!ops_list.empty()) group.batch_isend_irecv(ops_list)->wait();
  return out;
}

namespace {
double g_aux_loss_scale = 1.0;
}
void MoEAuxLossAutoScaler::set_loss_scale(double scale) { g_aux_loss_scale = scale; }
double MoEAuxLossAutoScaler::loss_scale() { return g_aux_loss_scale; }
void MoEAuxLossAutoScaler::set_step_loss_scale(double loss_scale, int64_t num_microbatches, bool per_token_loss,
                                               int64_t cp_size) {
  MEGATRON_CHECK(num_microbatches > 0 && cp_size > 0) << num_microbatches << " micro-batches, CP " << cp_size;
  g_aux_loss_scale = per_token_loss ? loss_scale
                                    : loss_scale * static_cast<double>(cp_size) / static_cast<double>(num_microbatches);
}

MoEMetricsTracker& MoEMetricsTracker::get() {
  static MoEMetricsTracker t;
  return t;
}

void MoEMetricsTracker::record(const std::string& name, double value, int64_t layer_number, int64_t num_layers,
                               comm::ProcessGroup* reduce_group, bool needs_dp_avg, comm::ProcessGroup* avg_group) {
  Entry& e = entries_[name];
  if (static_cast<int64_t>(e.values.size()) < num_layers) e.values.resize(static_cast<size_t>(num_layers), 0.0);
  MEGATRON_CHECK(layer_number >= 1 && layer_number <= num_layers) << "MoE metric " << name << " layer " << layer_number;
  e.values[static_cast<size_t>(layer_number - 1)] += value;
  e.reduce_group = reduce_group;
  e.needs_dp_avg = needs_dp_avg;
  e.avg_group = avg_group;
}

void MoEMetricsTracker::clear() {
  for (auto& [name, e] : entries_) std::fill(e.values.begin(), e.values.end(), 0.0);
}

std::vector<std::pair<std::string, double>> MoEMetricsTracker::report(double loss_scale,
                                                                      const std::vector<std::string>& names,
                                                                      int64_t num_layers, int64_t num_moe_layers,
                                                                      comm::ProcessGroup* pp_group,
                                                                      comm::ProcessGroup* dp_group, Device device,
                                                                      std::vector<std::pair<std::string, double>>* per_layer) {
  MEGATRON_CHECK(num_moe_layers >= 1) << "MoE metrics require at least one MoE layer";
  std::vector<std::pair<std::string, double>> out;
  for (const auto& name : names) {
    auto it = entries_.find(name);
    if (it == entries_.end()) it = entries_.emplace(name, Entry{std::vector<double>(static_cast<size_t>(num_layers), 0.0)}).first;
    Entry& e = it->second;
    const auto n = static_cast<int64_t>(e.values.size());
    Tensor t = to_device_f32(e.values, {n}, device);
    auto reduce = [&t](comm::ProcessGroup* g, comm::ReduceOp op) {
      if (g && g->size() > 1) g->all_reduce(t, op);
    };
    reduce(pp_group, comm::ReduceOp::kSum);
    reduce(e.reduce_group, comm::ReduceOp::kSum);
    reduce(e.avg_group, comm::ReduceOp::kAvg);
    if (e.needs_dp_avg) reduce(dp_group, comm::ReduceOp::kAvg);
    double sum = 0.0;
    const std::vector<double> layers = to_host_f64(t);
    for (size_t i = 0; i < layers.size(); ++i) {
      const double v = static_cast<double>(static_cast<float>(layers[i] * loss_scale));  // values.float() * loss_scale
      sum += v;
      if (per_layer) per_layer->emplace_back("moe/" + name + "_layer_" + std::to_string(i), v);
    }
    out.emplace_back(name, sum / static_cast<double>(num_moe_layers));
  }
  clear();
  return out;
}

}  // namespace megatron::transformer::moe
