// MoE (megatron/core/transformer/moe/): --moe-layer-freq parsing, routing math against closed forms
// and finite differences, the MoE layer against the dense MLP it must equal when all experts are
// the same MLP, and (under mpirun: tests/functional_tests/dist_moe.sh) expert parallelism: every
// gradient of EP2 / EP2 x expert-TP2 with both dispatchers equals the single-rank layer run on each
// rank's tokens. Tolerances are stated per test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "test_utils/dist_test_util.h"
#include "bench/gpu/moe_layer_leg.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/transformer/mlp.h"
#include "megatron/core/transformer/moe/moe_config.h"
#include "megatron/core/transformer/moe/moe_layer.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {
namespace {

TEST(MoELayerFreq, IntegerAndListPatterns) {
  EXPECT_EQ(parse_moe_layer_freq("1", 3), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));  // i % 2 == 0
  EXPECT_EQ(parse_moe_layer_freq("([0]*3+[1]*5)", 8), (std::vector<int>{0, 0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("([1]*3+[0]*1)*3", 12), (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(parse_moe_layer_freq("[1,0,1,]", 3), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_freq("2*[0]+[1]", 3), (std::vector<int>{0, 0, 1}));
}

TEST(MoELayerFreq, BadInputNamesTheFlag) {
  for (const char* bad : {"[1]*3+", "[1,0", "__import__('os')", "[[1]]", "[1]*[2]", "0", "[2,1]", "1.5", "[1]+2"}) {
    try {
      parse_moe_layer_freq(bad, 3);
      ADD_FAILURE() << bad << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--moe-layer-freq"), std::string::npos) << e.what();
    }
  }
  try {
    parse_moe_layer_freq("[1]*4", 3);
    ADD_FAILURE() << "wrong length accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("expected 3"), std::string::npos) << e.what();
  }
}

// Uniform routing has aux loss = coeff exactly (f_i = 1/E, P_i = 1/E: E * sum_i f_i P_i = 1);
// all tokens on one expert with prob 1 gives E * coeff.
TEST(MoERouting, SwitchAuxLossClosedForms) {
  const int64_t T = 8, E = 4, k = 2;
  std::vector<double> probs(T * E, 1.0 / E), tpe(E, double(T * k) / E);
  EXPECT_NEAR(switch_load_balancing_loss(probs, tpe, T, k, E, 0.01), 0.01, 1e-15);
  std::vector<double> p1(T * E, 0.0), t1(E, 0.0);
  for (int64_t t = 0; t < T; ++t) p1[t * E] = 1.0;
  t1[0] = double(T * k);
  EXPECT_NEAR(switch_load_balancing_loss(p1, t1, T, k, E, 0.01), E * 0.01, 1e-15);
  // z-loss of zero logits: logsumexp = log E.
  std::vector<double> z(T * E, 0.0);
  EXPECT_NEAR(z_loss(z, T, E, 1.0, nullptr), std::log(double(E)) * std::log(double(E)), 1e-14);
}

TEST(MoERouting, CapacityAndDropPolicies) {
  // 4 tokens, 2 experts, top-1, capacity factor 1: capacity = ceil(4 / 2 * 1) = 2. All tokens pick
  // expert 0 with probs .9 .6 .8 .7: "probs" keeps tokens 0 and 2, "position" tokens 0 and 1.
  const int64_t T = 4, E = 2;
  std::vector<double> probs = {.9, 0, .6, 0, .8, 0, .7, 0};
  std::vector<uint8_t> map = {1, 0, 1, 0, 1, 0, 1, 0};
  auto p = probs;
  auto m = map;
  apply_router_token_dropping(p, m, T, E, 1, 1.0, "probs", false);
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(p[2], 0.0);
  p = probs;
  m = map;
  apply_router_token_dropping(p, m, T, E, 1, 1.0, "position", false);
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 0, 1, 0, 0, 0, 0, 0}));
  // Padding to capacity: every expert gets exactly 2 tokens.
  p = probs;
  m = map;
  apply_router_token_dropping(p, m, T, E, 1, 1.0, "probs", true);
  int64_t per[2] = {0, 0};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) per[e] += m[t * E + e];
  EXPECT_EQ(per[0], 2);
  EXPECT_EQ(per[1], 2);
  EXPECT_EQ(get_capacity(4 * 2, 3, 1.25), 4);  // ceil(8 / 3 * 1.25) = ceil(3.33)
}

// The analytic gradient of every routing variant equals central differences of its forward
// (float64; step 1e-6, tolerance 1e-6 relative to the largest gradient: truncation O(h^2)).
TEST(MoERouting, TopKRoutingBackwardMatchesFiniteDifferences) {
  const int64_t T = 5, E = 8;
  std::mt19937 gen(3);
  std::normal_distribution<double> n01;
  std::vector<double> logits(T * E), w(T * E), bias(E);
  for (auto& v : logits) v = n01(gen);
  for (auto& v : w) v = n01(gen);
  for (auto& v : bias) v = 0.1 * n01(gen);
  struct Case {
    const char* score;
    bool pre;
    int64_t k, groups, gtopk;
    bool with_bias;
    double scale;
  };
  const Case cases[] = {{"softmax", false, 2, 0, 0, false, 0},   {"softmax", true, 2, 0, 0, false, 2.5},
                        {"softmax", true, 1, 0, 0, false, 0},    {"sigmoid", false, 2, 0, 0, true, 0},
                        {"sigmoid", false, 1, 0, 0, false, 0},   {"sqrtsoftplus", false, 3, 0, 0, true, 1.5},
                        {"softmax", true, 4, 4, 2, false, 0},    {"sigmoid", false, 4, 4, 2, true, 0}};
  for (const Case& c : cases) {
    TopKOptions o;
    o.topk = c.k;
    o.use_pre_softmax = c.pre;
    o.num_groups = c.groups;
    o.group_topk = c.gtopk;
    o.score_function = c.score;
    if (c.scale > 0) o.scaling_factor = c.scale;
    o.expert_bias = c.with_bias ? &bias : nullptr;
    auto loss = [&](const std::vector<double>& l) {
      std::vector<double> p;
      std::vector<uint8_t> m;
      TopKState st;
      topk_routing_with_score_function(l, T, E, o, p, m, st);
      double s = 0;
      for (int64_t i = 0; i < T * E; ++i) s += w[i] * p[i];
      return s;
    };
    std::vector<double> p;
    std::vector<uint8_t> m;
    TopKState st;
    topk_routing_with_score_function(logits, T, E, o, p, m, st);
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      int64_t cnt = 0;
      for (int64_t e = 0; e < E; ++e) {
        sum += p[t * E + e];
        cnt += m[t * E + e];
      }
      EXPECT_EQ(cnt, c.k) << c.score;
      // softmax without pre-softmax and normalized sigmoid (k > 1) sum to the scaling factor.
      if ((std::string(c.score) == "softmax" && !c.pre) || (std::string(c.score) != "softmax" && c.k > 1))
        EXPECT_NEAR(sum, c.scale > 0 ? c.scale : 1.0, 1e-12) << c.score;
    }
    const std::vector<double> g = topk_routing_backward(w, o, st);
    double gmax = 0;
    for (double v : g) gmax = std::max(gmax, std::abs(v));
    ASSERT_GT(gmax, 0) << c.score;
    for (int64_t i = 0; i < T * E; ++i) {
      auto lp = logits, lm = logits;
      lp[i] += 1e-6;
      lm[i] -= 1e-6;
      EXPECT_NEAR(g[i], (loss(lp) - loss(lm)) / 2e-6, 1e-6 * gmax) << c.score << " k " << c.k << " i " << i;
    }
  }
}

TEST(MoERouting, AuxScoresBackwardMatchesFiniteDifferences) {
  const int64_t T = 4, E = 6;
  std::mt19937 gen(5);
  std::normal_distribution<double> n01;
  std::vector<double> logits(T * E), w(T * E);
  for (auto& v : logits) v = n01(gen);
  for (auto& v : w) v = n01(gen);
  for (const char* f : {"softmax", "sigmoid", "sqrtsoftplus"}) {
    auto loss = [&](const std::vector<double>& l) {
      std::vector<double> s;
      std::vector<uint8_t> m;
      compute_routing_scores_for_aux_loss(l, T, E, 2, f, s, m);
      double acc = 0;
      for (int64_t i = 0; i < T * E; ++i) acc += w[i] * s[i];
      return acc;
    };
    std::vector<double> s;
    std::vector<uint8_t> m;
    compute_routing_scores_for_aux_loss(logits, T, E, 2, f, s, m);
    const std::vector<double> g = aux_scores_backward(logits, s, w, T, E, f);
    for (int64_t i = 0; i < T * E; ++i) {
      auto lp = logits, lm = logits;
      lp[i] += 1e-6;
      lm[i] -= 1e-6;
      EXPECT_NEAR(g[i], (loss(lp) - loss(lm)) / 2e-6, 1e-7) << f << " " << i;
    }
  }
  std::vector<double> dz;
  z_loss(logits, T, E, 0.3, &dz);
  for (int64_t i = 0; i < T * E; ++i) {
    auto lp = logits, lm = logits;
    lp[i] += 1e-6;
    lm[i] -= 1e-6;
    EXPECT_NEAR(dz[i], (z_loss(lp, T, E, 0.3, nullptr) - z_loss(lm, T, E, 0.3, nullptr)) / 2e-6, 1e-7);
  }
}

TEST(MoERouting, PermuteOrderIsExpertMajorTokenAscending) {
  // Megatron's permute(): stable argsort of routing_map.T -> expert-major, tokens ascending.
  const std::vector<uint8_t> map = {1, 0, 1,   // token 0 -> experts 0, 2
                                    0, 1, 1,   // token 1 -> 1, 2
                                    1, 1, 0};  // token 2 -> 0, 1
  std::vector<int64_t> tpe;
  EXPECT_EQ(permute_indices(map, 3, 3, 0, 3, &tpe), (std::vector<int64_t>{0, 2, 1, 2, 0, 1}));
  EXPECT_EQ(tpe, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(permute_indices(map, 3, 3, 1, 3, &tpe), (std::vector<int64_t>{1, 2, 0, 1}));
}

TransformerConfig moe_config(int64_t E, int64_t k, bool swiglu) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 2;
  c.add_bias_linear = false;
  c.gated_linear_unit = swiglu;
  c.hidden_dropout = c.attention_dropout = 0;
  c.num_moe_experts = E;
  c.moe_router_topk = k;
  c.moe_aux_loss_coeff = {0.0};
  c.validate();
  return c;
}

void allocate(ParamRegistry& reg, uint64_t seed) {
  for (size_t i = 0; i < reg.params().size(); ++i) {
    Parameter& p = reg.params()[i];
    p.data = Tensor::empty(reg.local_shape(i), DType::kFloat32);
    p.main_grad = Tensor::zeros(reg.local_shape(i), DType::kFloat32);
    tensor_parallel::initialize_parameter(p, seed);
  }
}

Tensor randn(const Shape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> n01;
  int64_t n = 1;
  for (auto d : s) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = n01(gen);
  return Tensor::from_vector(v, s);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = to_host_f64(a), y = to_host_f64(b);
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}
double max_abs(const Tensor& a) {
  double m = 0;
  for (double v : to_host_f64(a)) m = std::max(m, std::abs(v));
  return m;
}

// With every expert a copy of one MLP and softmax top-k probs (summing to 1), the MoE output is
// sum_k p_k MLP(x) = MLP(x): it must equal the dense MLP's output, the input gradient the MLP's,
// the sum of the experts' weight gradients the MLP's weight gradient, and the router gradient 0
// (the probs' sum does not depend on the logits). fp32 throughout; 1e-5 relative to the largest
// value (different summation orders only).
TEST(MoEDeviceRouter, EnvironmentSwitchAndCpuKeepsTheHostPath) {
  // MEGATRON_MOE_DEVICE_ROUTER: unset / "1" on (the default since the GPU check passed), "0" off,
  // anything else refused by name.
  const char* old = std::getenv("MEGATRON_MOE_DEVICE_ROUTER");
  const std::string saved = old ? old : "";
  unsetenv("MEGATRON_MOE_DEVICE_ROUTER");
  EXPECT_TRUE(moe_device_router_enabled());
  setenv("MEGATRON_MOE_DEVICE_ROUTER", "1", 1);
  EXPECT_TRUE(moe_device_router_enabled());
  setenv("MEGATRON_MOE_DEVICE_ROUTER", "0", 1);
  EXPECT_FALSE(moe_device_router_enabled());
  setenv("MEGATRON_MOE_DEVICE_ROUTER", "yes", 1);
  try {
    moe_device_router_enabled();
    ADD_FAILURE() << "MEGATRON_MOE_DEVICE_ROUTER=yes accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("MEGATRON_MOE_DEVICE_ROUTER"), std::string::npos) << e.what();
  }
  setenv("MEGATRON_MOE_DEVICE_ROUTER", "1", 1);
  // On the CPU the host float64 router runs whatever the switch says (the ops decline there too).
  TransformerConfig c = moe_config(4, 2, true);
  tensor_parallel::TPContext tp{comm::make_single_rank_group()};
  ParamRegistry reg;
  MoELayer layer(reg, "decoder.layers.0.mlp", c, 1, tp, MoEGroups::single());
  allocate(reg, 3);
  Tensor x = Tensor::from_vector(std::vector<float>(static_cast<size_t>(6 * c.hidden_size), 0.5f), {6, c.hidden_size});
  EXPECT_FALSE(layer.router().device_routing_supported(x));
  Tensor idx = Tensor::empty({6, 2}, DType::kInt64), probs = Tensor::empty({6, 2}, DType::kFloat32);
  EXPECT_FALSE(ops::moe_router_forward(x, nullptr, 2, 0, false, 1.0f, 0, 0, 1, idx, probs, nullptr));
  if (old) setenv("MEGATRON_MOE_DEVICE_ROUTER", saved.c_str(), 1); else unsetenv("MEGATRON_MOE_DEVICE_ROUTER");
}

TEST(MoELayerTest, EqualsDenseMlpWhenExpertsAreIdentical) {
  for (bool swiglu : {false, true})
    for (const char* disp : {"allgather", "alltoall"}) {
      TransformerConfig c = moe_config(4, 2, swiglu);
      c.moe_token_dispatcher_type = disp;
      TransformerConfig dense = c;
      dense.num_moe_experts.reset();
      dense.ffn_hidden_size = c.moe_ffn_hidden_size;
      tensor_parallel::TPContext tp{comm::make_single_rank_group()};
      ParamRegistry reg, dreg;
      MoELayer layer(reg, "decoder.layers.0.mlp", c, 1, tp, MoEGroups::single());
      MLP mlp(dreg, "decoder.layers.0.mlp", dense, tp);
      allocate(reg, 7);
      allocate(dreg, 7);
      // Copy the dense weights into every expert.
      for (auto& p : reg.params()) {
        const bool fc1 = p.name.find("linear_fc1") != std::string::npos, fc2 = p.name.find("linear_fc2") != std::string::npos;
        if (fc1) p.data.copy_(dreg.params()[0].data);
        if (fc2) p.data.copy_(dreg.params()[1].data);
      }
      const int64_t s = 6, b = 2, h = c.hidden_size;
      Tensor x = randn({s, b, h}, 11), dy = randn({s, b, h}, 12);
      ForwardContext fc;
      MoELayerCtx ctx;
      Tensor y = layer.forward(x, fc, ctx);
      MLPCtx mctx;
      Tensor yd = mlp.forward(x, mctx);
      EXPECT_LE(max_abs_diff(y, yd), 1e-5 * max_abs(yd)) << disp << " swiglu " << swiglu;
      Tensor dx = layer.backward(dy, ctx);
      Tensor dxd = mlp.backward(dy, mctx);
      EXPECT_LE(max_abs_diff(dx, dxd), 1e-5 * max_abs(dxd)) << disp;
      Tensor fc1_sum = Tensor::zeros(dreg.params()[0].main_grad.shape(), DType::kFloat32);
      Tensor fc2_sum = Tensor::zeros(dreg.params()[1].main_grad.shape(), DType::kFloat32);
      for (auto& p : reg.params()) {
        if (p.name.find("linear_fc1") != std::string::npos) ops::add_(fc1_sum, p.main_grad);
        if (p.name.find("linear_fc2") != std::string::npos) ops::add_(fc2_sum, p.main_grad);
        if (p.name.find("router") != std::string::npos) EXPECT_LE(max_abs(p.main_grad), 1e-5);
      }
      EXPECT_LE(max_abs_diff(fc1_sum, dreg.params()[0].main_grad), 1e-5 * max_abs(dreg.params()[0].main_grad));
      EXPECT_LE(max_abs_diff(fc2_sum, dreg.params()[1].main_grad), 1e-5 * max_abs(dreg.params()[1].main_grad));
      EXPECT_EQ(reg.params()[0].name, "decoder.layers.0.mlp.router.weight");
      EXPECT_EQ(reg.params()[1].name, "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight");
    }
}

// Finite differences of the whole layer (router, experts, shared expert, aux + z loss): the loss
// L = <dy, y> + aux (with MoEAuxLossAutoScaler scale 1). fp32 forward, central differences with
// step 1e-3 (weights are ~0.02, so larger steps flip top-k choices: routing is only piecewise
// smooth); fp32 rounding of L (~1e-7 |L| / 1e-3) and the O(step^2) truncation stay well below the
// tolerance of 2e-3 relative to the parameter's largest gradient.
TEST(MoELayerTest, GradientsMatchFiniteDifferences) {
  TransformerConfig c = moe_config(4, 2, true);
  c.moe_aux_loss_coeff = {0.1};
  c.moe_z_loss_coeff = 0.05;
  c.moe_shared_expert_intermediate_size = 8;
  c.moe_router_pre_softmax = true;
  tensor_parallel::TPContext tp{comm::make_single_rank_group()};
  ParamRegistry reg;
  MoELayer layer(reg, "decoder.layers.0.mlp", c, 1, tp, MoEGroups::single());
  allocate(reg, 3);
  const int64_t s = 3, b = 2, h = c.hidden_size;
  Tensor x = randn({s, b, h}, 21), dy = randn({s, b, h}, 22);
  MoEAuxLossAutoScaler::set_loss_scale(1.0);
  auto loss = [&](double* aux) {
    ForwardContext fc;
    MoELayerCtx ctx;
    MoEMetricsTracker::get().clear();
    Tensor y = layer.forward(x, fc, ctx);
    double l = 0;
    const auto yv = to_host_f64(y), dv = to_host_f64(dy);
    for (size_t i = 0; i < yv.size(); ++i) l += yv[i] * dv[i];
    auto& e = MoEMetricsTracker::get().entries();
    *aux = e["load_balancing_loss"].values.empty() ? 0 : e["load_balancing_loss"].values[0] * c.moe_aux_loss_coeff[0];
    if (!e["z_loss"].values.empty()) *aux += e["z_loss"].values[0] * *c.moe_z_loss_coeff;
    return l + *aux;
  };
  ForwardContext fc;
  MoELayerCtx ctx;
  layer.forward(x, fc, ctx);
  Tensor dx = layer.backward(dy, ctx);
  const float EPS = 1e-3f;
  auto check = [&](Tensor& t, const Tensor& grad, const char* what) {
    float* d = t.data<float>();
    const auto g = to_host_f64(grad);
    double gmax = 0;
    for (double v : g) gmax = std::max(gmax, std::abs(v));
    for (int64_t i = 0; i < t.numel(); i += std::max<int64_t>(1, t.numel() / 24)) {
      const float orig = d[i];
      double a0;
      d[i] = orig + EPS;
      const double lp = loss(&a0);
      d[i] = orig - EPS;
      const double lm = loss(&a0);
      d[i] = orig;
      EXPECT_NEAR(g[static_cast<size_t>(i)], (lp - lm) / (2 * EPS), 2e-3 * gmax) << what << " " << i;
    }
  };
  check(x, dx, "input");
  for (auto& p : reg.params()) check(p.data, p.main_grad, p.name.c_str());
}

// ---- expert parallelism under mpirun (tests/functional_tests/dist_moe.sh) ----

// Each rank routes its own tokens (EP ranks are data-parallel for the router). Reference: the
// single-rank layer run on every rank's tokens in turn, gradients accumulated. The EP run's expert
// gradients must equal the reference's for this rank's experts (expert-TP: its shard), the
// router gradient all-reduced over the ranks must equal the reference's, and each rank's input
// gradient the reference's for its tokens. fp32; 1e-5 relative to the largest value (the
// dispatchers change only the order of the sums).
void check_expert_parallel(int ep, int etp, const char* dispatcher, bool capacity) {
  auto w = testing::dist_world();
  const int n = w->size();
  parallel_state::ParallelConfig pc;
  pc.tensor_model_parallel_size = etp;
  pc.expert_model_parallel_size = ep;
  pc.expert_tensor_parallel_size = etp;
  parallel_state::initialize_model_parallel(w, pc);
  TransformerConfig c = moe_config(8, 2, false);
  c.moe_token_dispatcher_type = dispatcher;
  c.expert_model_parallel_size = ep;
  c.expert_tensor_parallel_size = etp;
  c.tensor_model_parallel_size = etp;
  c.moe_aux_loss_coeff = {etp > 1 ? 0.0 : 0.01};  // the aux loss's token counts span TP with etp > 1
  c.moe_z_loss_coeff = etp > 1 ? std::optional<double>() : std::optional<double>(0.001);
  if (capacity) c.moe_expert_capacity_factor = 1.0;
  c.validate();
  MoEAuxLossAutoScaler::set_loss_scale(1.0);
  tensor_parallel::TPContext tp{parallel_state::get_tensor_model_parallel_group(), etp > 1};
  ParamRegistry reg;
  MoELayer layer(reg, "decoder.layers.0.mlp", c, 1, tp, default_moe_groups(tp));
  allocate(reg, 5);
  const int64_t s = 4, b = 2, h = c.hidden_size;
  std::vector<Tensor> xs, dys;
  for (int r = 0; r < n; ++r) {
    xs.push_back(randn({s, b, h}, 100 + r));
    dys.push_back(randn({s, b, h}, 200 + r));
  }
  ForwardContext fc;
  MoELayerCtx ctx;
  layer.forward(xs[w->rank()], fc, ctx);
  Tensor dx = layer.backward(dys[w->rank()], ctx);
  // Reference on one rank's worth of everything.
  TransformerConfig rc = c;
  rc.expert_model_parallel_size = 1;
  rc.expert_tensor_parallel_size = 1;
  rc.tensor_model_parallel_size = 1;
  rc.validate();
  tensor_parallel::TPContext tp1{comm::make_single_rank_group()};
  ParamRegistry rreg;
  MoELayer ref(rreg, "decoder.layers.0.mlp", rc, 1, tp1, MoEGroups::single());
  allocate(rreg, 5);
  Tensor dx_ref;
  for (int r = 0; r < n; ++r) {
    MoELayerCtx rctx;
    ref.forward(xs[r], fc, rctx);
    Tensor d = ref.backward(dys[r], rctx);
    if (r == w->rank()) dx_ref = d;
  }
  EXPECT_LE(max_abs_diff(dx, dx_ref), 1e-5 * max_abs(dx_ref)) << "input gradient";
  for (auto& p : reg.params()) {
    const Parameter* q = nullptr;
    for (auto& rp : rreg.params())
      if (rp.name == p.name) q = &rp;
    ASSERT_NE(q, nullptr) << p.name;
    Tensor g = p.main_grad.clone();
    if (p.name.find("router") != std::string::npos) w->all_reduce(g);
    Tensor want = q->main_grad;
    if (p.tp_size > 1) {
      // This rank's expert-TP shard of the reference gradient.
      const std::vector<double> full = to_host_f64(want);
      const int64_t rows = q->main_grad.size(0), cols = q->main_grad.size(1);
      std::vector<double> part;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const bool in = p.partition_dim == 0 ? i / (rows / p.tp_size) == p.tp_rank : j / (cols / p.tp_size) == p.tp_rank;
          if (in) part.push_back(full[static_cast<size_t>(i * cols + j)]);
        }
      want = to_device_f32(part, g.shape(), Device::cpu());
    }
    EXPECT_LE(max_abs_diff(g, want), 1e-5 * std::max(max_abs(want), 1e-12)) << p.name << " " << dispatcher;
  }
  parallel_state::destroy_model_parallel();
}

// --moe-router-enable-expert-bias (aux-loss-free balancing, DeepSeek-V3): a training forward adds
// the final routing map's column sums to local_tokens_per_expert (an eval forward does not), and
// finalize_router_state applies Megatron's get_updated_expert_bias to every router at once:
// bias += sign(mean(count) - count) * rate in float32, counts zeroed. Expected values by hand
// (counts chosen so the signs are known): exact, float32 on both sides.
TEST(MoERouterExpertBias, CountsAndFinalizeUpdateAsMegatron) {
  TransformerConfig c = moe_config(4, 2, false);
  c.moe_router_score_function = "sigmoid";
  c.moe_router_enable_expert_bias = true;
  c.moe_router_bias_update_rate = 1e-3;
  c.validate();
  ParamRegistry reg;
  TopKRouter r1(reg, "decoder.layers.0.mlp.router", c, 1, MoEGroups::single());
  TopKRouter r2(reg, "decoder.layers.1.mlp.router", c, 2, MoEGroups::single());
  allocate(reg, 3);
  ASSERT_EQ(r1.expert_bias().numel(), 4);
  EXPECT_EQ(r1.expert_bias().dtype(), DType::kFloat32);
  // Counting: a training forward on 6 tokens adds the map's column sums (2 experts per token).
  Tensor x = randn({6, c.hidden_size}, 5);
  std::vector<double> probs;
  std::vector<uint8_t> map;
  RouterCtx ctx;
  r1.forward(x, 3, 2, /*training=*/false, 0, 0, probs, map, ctx);
  EXPECT_EQ(r1.local_tokens_per_expert(), std::vector<double>(4, 0.0)) << "eval forward counted tokens";
  r1.forward(x, 3, 2, /*training=*/true, 0, 0, probs, map, ctx);
  std::vector<double> cols(4, 0.0);
  for (size_t i = 0; i < map.size(); ++i) cols[i % 4] += map[i];
  EXPECT_EQ(r1.local_tokens_per_expert(), cols);
  EXPECT_EQ(std::accumulate(cols.begin(), cols.end(), 0.0), 12.0);
  // The update: counts {5, 1, 3, 3} (mean 3) -> signs {-, +, 0, 0}; {0, 0, 0, 8} (mean 2) -> {+, +, +, -}.
  r1.local_tokens_per_expert() = {5, 1, 3, 3};
  r2.local_tokens_per_expert() = {0, 0, 0, 8};
  finalize_router_state({&r1, &r2});
  const float q = 1e-3f;
  EXPECT_EQ(r1.expert_bias().to_float_vector(), (std::vector<float>{-q, q, 0.0f, 0.0f}));
  EXPECT_EQ(r2.expert_bias().to_float_vector(), (std::vector<float>{q, q, q, -q}));
  EXPECT_EQ(r1.local_tokens_per_expert(), std::vector<double>(4, 0.0));
  EXPECT_EQ(r2.local_tokens_per_expert(), std::vector<double>(4, 0.0));
  // A second step accumulates in float32: {2, 2, 2, 2} keeps r1; {9, 0, 0, 3} (mean 3) moves r2 by {-, +, +, 0}.
  r1.local_tokens_per_expert() = {2, 2, 2, 2};
  r2.local_tokens_per_expert() = {9, 0, 0, 3};
  finalize_router_state({&r1, &r2});
  EXPECT_EQ(r1.expert_bias().to_float_vector(), (std::vector<float>{-q, q, 0.0f, 0.0f}));
  EXPECT_EQ(r2.expert_bias().to_float_vector(), (std::vector<float>{q - q, q + q, q + q, -q}));
  // The bias steers the top-k choice (scores + bias) but not the probabilities: a bias of +1 on
  // expert 3 puts it in every token's top 2.
  r1.expert_bias().data<float>()[3] = 1.0f;
  r1.forward(x, 3, 2, /*training=*/false, 0, 0, probs, map, ctx);
  for (int64_t t = 0; t < 6; ++t) EXPECT_EQ(map[t * 4 + 3], 1) << "token " << t;
}

// --moe-per-layer-logging: MoEMetricsTracker::report also yields Megatron's per-layer TensorBoard
// scalars "moe/<name>_layer_<i>" (i = 0-based layer index, every layer, dense ones 0) equal to
// float32(value * loss_scale), and the aggregate is their sum / num_moe_layers. Values by hand.
TEST(MoEMetricsTracker, PerLayerTagsAsMegatron) {
  MoEMetricsTracker& tr = MoEMetricsTracker::get();
  tr.entries().clear();
  tr.record("load_balancing_loss", 1.25, 2, 3, nullptr, true);
  tr.record("load_balancing_loss", 0.75, 2, 3, nullptr, true);  // a second micro-batch
  tr.record("load_balancing_loss", 3.0, 3, 3, nullptr, true);
  tr.record("z_loss", 4.0, 3, 3, nullptr, false);
  std::vector<std::pair<std::string, double>> per_layer;
  const auto agg = tr.report(0.5, {"load_balancing_loss", "z_loss"}, 3, 2, nullptr, nullptr, Device::cpu(), &per_layer);
  const std::vector<std::pair<std::string, double>> want_layers = {
      {"moe/load_balancing_loss_layer_0", 0.0}, {"moe/load_balancing_loss_layer_1", 1.0},
      {"moe/load_balancing_loss_layer_2", 1.5}, {"moe/z_loss_layer_0", 0.0},
      {"moe/z_loss_layer_1", 0.0},              {"moe/z_loss_layer_2", 2.0}};
  EXPECT_EQ(per_layer, want_layers);
  const std::vector<std::pair<std::string, double>> want_agg = {{"load_balancing_loss", 1.25}, {"z_loss", 1.0}};
  EXPECT_EQ(agg, want_agg);
  // Without the flag: no per-layer scalars; the values were cleared by the report.
  const auto again = tr.report(0.5, {"load_balancing_loss"}, 3, 2, nullptr, nullptr, Device::cpu());
  EXPECT_EQ(again, (std::vector<std::pair<std::string, double>>{{"load_balancing_loss", 0.0}}));
  tr.entries().clear();
}

TEST(DistMoE, ExpertParallelAllGather) {
  SKIP_UNLESS_MULTI_RANK();
  check_expert_parallel(testing::dist_world()->size(), 1, "allgather", false);
}
TEST(DistMoE, ExpertParallelAlltoAll) {
  SKIP_UNLESS_MULTI_RANK();
  check_expert_parallel(testing::dist_world()->size(), 1, "alltoall", false);
}
TEST(DistMoE, ExpertParallelAlltoAllWithCapacity) {
  SKIP_UNLESS_MULTI_RANK();
  check_expert_parallel(testing::dist_world()->size(), 1, "alltoall", true);
}
TEST(DistMoE, ExpertParallelTimesExpertTensorParallel) {
  SKIP_UNLESS_MULTI_RANK();
  const int n = testing::dist_world()->size();
  if (n % 4 != 0) GTEST_SKIP() << "EP2 x expert-TP2 needs 4 ranks";
  for (const char* d : {"allgather", "alltoall"}) check_expert_parallel(n / 2, 2, d, false);
}

// gpu_bench moe's layer leg (bench/gpu/moe_layer_leg.h) on the CPU at a tiny shape, through the
// same code the GPU runs: the Experts module must receive the router's counts (E of them, summing
// to T k: no token dropping without a capacity factor), and both timed bodies run to the end. The
// first GPU run failed here ("experts: 0 counts": the counts were read after MoELayer::backward,
// which resets the forward context). Timer: one call, 1 ms reported.
TEST(MoELayerLeg, TheExpertsModuleRunsOnTheRoutersCounts) {
  const int64_t T = 24, H = 16, F = 8, E = 4, K = 2;
  std::mt19937 rng(7);
  auto rnd = [&](const Shape& s, DType dt, float std) {
    std::normal_distribution<float> d(0.0f, std);
    std::vector<float> v(static_cast<size_t>(shape_numel(s)));
    for (float& x : v) x = d(rng);
    return Tensor::from_vector(v, s).to(dt);
  };
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    int calls = 0;
    bench::MoELayerLegResult r = bench::moe_layer_leg(T, H, F, E, K, dt, Device::cpu(), rnd, [&](const std::function<void()>& fn) {
      fn();
      ++calls;
      return 1.0;
    });
    ASSERT_EQ(static_cast<int64_t>(r.tokens_per_expert.size()), E) << dtype_name(dt);
    EXPECT_EQ(std::accumulate(r.tokens_per_expert.begin(), r.tokens_per_expert.end(), int64_t{0}), T * K);
    for (int64_t c : r.tokens_per_expert) EXPECT_GE(c, 0);
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(r.layer_ms, 1.0);
    EXPECT_EQ(r.experts_ms, 1.0);
  }
}

}  // namespace
}  // namespace megatron::transformer::moe
