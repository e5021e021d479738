// Multi-token prediction (--mtp-num-layers, transformer/multi_token_prediction.h, GPTModel's MTP
// stage). Checked against
//  * Megatron-LM's own MTP code (GPTMtpOracle.*: fixtures of tests/reference/mtp/
//    generate_mtp_fixture.py, run on the GPU machine; skipped until they are committed): the lm
//    loss, each module's logged MTP loss and every parameter gradient within 1e-5 relative to the
//    tensor's largest magnitude (both sides fp32; Megatron's GPU GEMMs with TF32 off and our
//    OpenBLAS ones differ only in summation order, ~1e-6 here);
//  * invariants that need no reference numbers: a zero --mtp-loss-scaling-factor leaves the main
//    model's loss and gradients bitwise as without MTP (and the MTP gradients exactly zero);
//    backward's MTP gradient is the derivative of the logged MTP loss (finite differences along
//    the gradient, fp32: see FiniteDifferences); full recomputation is bitwise; two pipeline
//    stages (MTP on the last, its embedding copy's gradient summed with the first stage's) equal
//    one; Megatron's roll_tensor, also across two context-parallel ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/transformer/multi_token_prediction.h"
#include "test_utils/fixture_util.h"
#include "test_utils/thread_group_util.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using models::gpt::GPTModelParallel;
using testing::Fixture;
using testing::max_rel_error;
using transformer::TransformerConfig;
using transformer::moe::MoEAuxLossAutoScaler;
using transformer::moe::MoEMetricsTracker;

constexpr int64_t kV = 128, kS = 16, kB = 2;

// The tiny GPT of the unit tests with RoPE (MTP refuses learned positions), hidden 64, ffn 128.
TransformerConfig gpt_config(int64_t mtp, float factor) {
  TransformerConfig c = testing::tiny_gpt_config(64);
  c.ffn_hidden_size = 128;
  c.position_embedding_type = transformer::PositionEmbeddingType::kRope;
  c.mtp_num_layers = mtp;
  c.mtp_loss_scaling_factor = factor;
  return c;
}

TransformerConfig llama_config(int64_t mtp, float factor) {
  TransformerConfig c = testing::tiny_llama_config(64, 2, 128);
  c.mtp_num_layers = mtp;
  c.mtp_loss_scaling_factor = factor;
  return c;
}

// MoE (--num-experts 4, top-2, SwiGLU experts of 64, aux 0.05 + z 0.01) on llama_config with the
// decoder's MoE layer pattern `pattern` (Megatron's --moe-layer-freq list).
TransformerConfig llama_moe_config(int64_t mtp, float factor, std::vector<int> pattern = {0, 1}) {
  TransformerConfig c = llama_config(mtp, factor);
  c.num_layers = static_cast<int64_t>(pattern.size());
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 64;
  c.moe_router_topk = 2;
  c.moe_layer_pattern = std::move(pattern);
  c.moe_aux_loss_coeff = {0.05};
  c.moe_z_loss_coeff = 0.01;
  c.validate();
  return c;
}

datasets::GPTBatch make_batch(uint64_t seed) {
  std::vector<int64_t> tok(kB * kS), lab(kB * kS), pos(kB * kS);
  std::vector<float> mask(kB * kS);
  for (int64_t i = 0; i < kB * kS; ++i) {
    tok[i] = static_cast<int64_t>(tensor_parallel::splitmix64(seed + 3 * i) % kV);
    lab[i] = static_cast<int64_t>(tensor_parallel::splitmix64(seed + 3 * i + 1) % kV);
    pos[i] = i % kS;
    mask[i] = tensor_parallel::splitmix64(seed + 3 * i + 2) % 5 == 0 ? 0.0f : 1.0f;
  }
  mask[kS - 1] = 0.0f;
  datasets::GPTBatch b;
  b.tokens = Tensor::from_vector_i64(tok, {kB, kS});
  b.labels = Tensor::from_vector_i64(lab, {kB, kS});
  b.position_ids = Tensor::from_vector_i64(pos, {kB, kS});
  b.loss_mask = Tensor::from_vector(mask, {kB, kS});
  return b;
}

std::vector<int64_t> i64(const Tensor& t) {
  const int64_t* p = t.data<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

double mask_sum(const Tensor& m) {
  double s = 0;
  for (float x : m.to_float_vector()) s += x;
  return s;
}

/// One training step's forward + backward with Megatron's seeds (one micro-batch, loss scale 1):
/// dL/dloss = mask / Σmask, MTP loss scale 1 (MoE aux-loss scale 1, the MoE metrics tracker
/// cleared first). Returns the main model's masked mean loss.
double step(GPTModel& m, const datasets::GPTBatch& b, bool main_seed = true) {
  MoEAuxLossAutoScaler::set_loss_scale(1.0);  // MoE models: the aux losses' backward scale
  MoEMetricsTracker::get().clear();
  m.zero_grad();
  Tensor loss = m.forward(b, true);
  const double n = mask_sum(b.loss_mask);
  double lm = 0;
  auto l = loss.to_float_vector(), k = b.loss_mask.to_float_vector();
  std::vector<float> seed(l.size());
  for (size_t i = 0; i < l.size(); ++i) {
    lm += static_cast<double>(l[i]) * k[i] / n;
    seed[i] = main_seed ? static_cast<float>(k[i] / n) : 0.0f;
  }
  m.set_mtp_loss_scale(1.0);
  m.backward(Tensor::from_vector(seed, loss.shape()));
  return lm;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.to(Device::cpu()).data_ptr(), b.to(Device::cpu()).data_ptr(), a.nbytes()) == 0;
}

std::map<std::string, Parameter*> by_name(GPTModel& m) {
  std::map<std::string, Parameter*> out;
  for (auto& p : m.parameters()) out[p.name] = &p;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Megatron-LM oracle.

void check_oracle(const std::string& name, const TransformerConfig& c) {
  const std::string dir = "tests/reference/mtp/data";
  if (!Fixture::exists(dir, name))
    GTEST_SKIP() << dir << "/" << name << ".json is not committed yet: run tests/reference/mtp/generate_mtp_fixture.py "
                 << "on the GPU machine (docs/training.md, Multi-token prediction)";
  Fixture f(dir, name);
  GPTModel m(c, kV, kS, 1);
  // Every fixture parameter exists here and vice versa (Megatron's names = ours).
  const auto params = f.keys_with_prefix("param.");
  ASSERT_EQ(params.size(), m.parameters().size());
  for (auto& p : m.parameters()) {
    ASSERT_TRUE(f.has("param." + p.name)) << p.name << " is not a Megatron parameter";
    Tensor w = f.get("param." + p.name);
    ASSERT_EQ(w.shape(), p.data.shape()) << p.name;
    p.data.copy_(w);
  }
  datasets::GPTBatch b;
  b.tokens = f.get("tokens");
  b.labels = f.get("labels");
  b.position_ids = f.get("position_ids");
  b.loss_mask = f.get("loss_mask");
  const double lm = step(m, b);
  const double ref = f.get("lm_loss").item();
  EXPECT_NEAR(lm, ref, 1e-5 * std::fabs(ref)) << "lm loss";
  const auto metrics = m.take_mtp_metrics();
  Tensor mtp_ref = f.get("mtp_loss");
  ASSERT_EQ(static_cast<int64_t>(metrics.size()), mtp_ref.numel());
  for (size_t k = 0; k < metrics.size(); ++k) {
    const double r = mtp_ref.to_float_vector()[k];
    EXPECT_NEAR(metrics[k].loss, r, 1e-5 * std::fabs(r)) << "mtp_" << k + 1 << " loss";
  }
  // MoE fixtures: the tracked per-layer aux / z losses (loss / coefficient), MTP layers at L + k + 1.
  for (const auto& key : f.keys_with_prefix("moe.")) {
    const auto want = f.get(key).to_float_vector();
    const auto& got = MoEMetricsTracker::get().entries().at(key.substr(4)).values;
    ASSERT_EQ(got.size(), want.size()) << key;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i])) << key << " layer " << i + 1;
  }
  for (auto& p : m.parameters())
    EXPECT_LE(max_rel_error(p.main_grad, f.get("grad." + p.name)), 1e-5) << p.name << " gradient";
}

TEST(GPTMtpOracle, TiedGptOneModuleMatchesMegatron) { check_oracle("gpt_d1", gpt_config(1, 0.3f)); }
TEST(GPTMtpOracle, TiedGptTwoModulesMatchesMegatron) { check_oracle("gpt_d2", gpt_config(2, 0.3f)); }
TEST(GPTMtpOracle, LlamaTwoModulesMatchesMegatron) { check_oracle("llama_d2", llama_config(2, 0.1f)); }
// A dense first layer, an MoE second: both MTP layers are MoE layers (the last decoder layer's spec).
TEST(GPTMtpOracle, LlamaMoeTwoModulesMatchesMegatron) { check_oracle("llama_moe_d2", llama_moe_config(2, 0.1f)); }

// ---------------------------------------------------------------------------------------------
// Invariants.

// With --mtp-loss-scaling-factor 0 every MTP gradient seed is exactly 0, so the main model's
// gradients (shared embedding and output layer included: they only receive + 0) and its loss are
// bitwise those of the model without MTP -- also with dropout, whose main-path masks come before
// the MTP modules' in the stream. The MTP modules' own gradients are exactly zero.
TEST(GPTMtp, ZeroScalingFactorLeavesMainModelBitwise) {
  for (auto make : {gpt_config, llama_config}) {
    for (int64_t D : {1, 2}) {
      TransformerConfig base = make(0, 0.1f), with = make(D, 0.0f);
      base.hidden_dropout = with.hidden_dropout = 0.1f;
      base.attention_dropout = with.attention_dropout = 0.1f;
      GPTModel a(base, kV, kS, 7), m(with, kV, kS, 7);
      const auto b = make_batch(11);
      const double la = step(a, b), lm = step(m, b);
      EXPECT_EQ(la, lm) << "main loss, D=" << D;
      auto pm = by_name(m);
      for (auto& p : a.parameters()) {
        ASSERT_TRUE(pm.count(p.name)) << p.name;
        EXPECT_TRUE(bitwise_equal(p.data, pm[p.name]->data)) << p.name << " initial value";
        EXPECT_TRUE(bitwise_equal(p.main_grad, pm[p.name]->main_grad)) << p.name << " gradient, D=" << D;
      }
      int n_mtp = 0;
      for (auto& p : m.parameters())
        if (p.name.starts_with("mtp.")) {
          ++n_mtp;
          EXPECT_EQ(ops::sum_of_squares(p.main_grad), 0.0) << p.name;
        }
      EXPECT_GT(n_mtp, 0);
    }
  }
}

// Megatron's parameter names and order: embedding, decoder, mtp.layers.<k>.{enorm, hnorm, eh_proj,
// transformer_layer.*, final_layernorm}, output layer (inside the layer Megatron's Attention
// builds linear_proj before SelfAttention adds linear_qkv).
TEST(GPTMtp, ParameterNamesAndShapesAreMegatrons) {
  GPTModel m(llama_config(2, 0.1f), kV, kS, 1);
  std::vector<std::string> names;
  for (auto& p : m.parameters())
    if (p.name.starts_with("mtp.layers.1.")) names.push_back(p.name.substr(13));
  const std::vector<std::string> want = {"enorm.weight",
                                         "hnorm.weight",
                                         "eh_proj.weight",
                                         "transformer_layer.input_layernorm.weight",
                                         "transformer_layer.self_attention.linear_proj.weight",
                                         "transformer_layer.self_attention.linear_qkv.weight",
                                         "transformer_layer.pre_mlp_layernorm.weight",
                                         "transformer_layer.mlp.linear_fc1.weight",
                                         "transformer_layer.mlp.linear_fc2.weight",
                                         "final_layernorm.weight"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(m.parameter("mtp.layers.0.eh_proj.weight").data.shape(), (Shape{64, 128}));
  EXPECT_EQ(m.parameters().back().name, "output_layer.weight");
  EXPECT_TRUE(m.parameters()[m.parameters().size() - 2].name.starts_with("mtp.layers.1.final_layernorm"));
}

// The parameters' main_grad g (from the last backward) is the derivative of `objective`: per
// group of parameters (name prefixes), the central difference of objective() along u = g
// restricted to the group, at a step of length 5e-3, equals |u|^2 within 2e-3 relative (the
// tests state why the bound holds for their model). objective() may run backward (it overwrites
// main_grad; g is copied first).
void expect_gradient_is_derivative(GPTModel& m, const std::vector<std::string>& groups,
                                   const std::function<double()>& objective) {
  std::map<std::string, Tensor> grad;
  for (auto& p : m.parameters()) grad[p.name] = p.main_grad.clone();
  for (const auto& g : groups) {
    double u2 = 0;
    for (auto& p : m.parameters())
      if (p.name.starts_with(g)) u2 += ops::sum_of_squares(grad[p.name]);
    ASSERT_GT(u2, 0.0) << g << " has no gradient";
    const double eps = 5e-3 / std::sqrt(u2);
    auto shift = [&](double t) {
      for (auto& p : m.parameters())
        if (p.name.starts_with(g)) ops::add_(p.data, grad[p.name], static_cast<float>(t));
    };
    shift(eps);
    const double lp = objective();
    shift(-2 * eps);
    const double lm = objective();
    shift(eps);
    const double fd = (lp - lm) / (2 * eps);
    EXPECT_NEAR(fd, u2, 2e-3 * u2) << g << ": finite difference " << fd << " vs |g|^2 " << u2;
  }
}

// backward's MTP gradient g is the derivative of L_mtp = factor / D · Σ_k (logged loss of module
// k): seeding the main loss with 0, L_mtp(θ ± ε·u) with u = g restricted to one parameter group
// gives (L+ − L−) / 2ε ≈ |u|² (central difference). There is no fp64 model, so the bound is set
// from the two fp32 error sources at a step of length ε|u| = 5e-3: the O((ε|u|)²) truncation
// (measured ~2e-4 relative for a decoder layer) and the forward's rounding noise (~3e-8 on L,
// i.e. ~4e-4 relative for the small enorm gradient); observed worst 4.2e-4 over the OpenBLAS
// kernel sets, bound 2e-3. Groups: an MTP module's eh_proj, its transformer layer, its enorm,
// the shared embedding, a decoder layer (reached through hnorm only), the output layer.
TEST(GPTMtp, FiniteDifferencesOfTheMtpLoss) {
  const TransformerConfig c = llama_config(2, 0.5f);
  GPTModel m(c, kV, kS, 3);
  const auto b = make_batch(5);
  auto mtp_loss = [&] {
    Tensor loss = m.forward(b, true);
    (void)loss;
    double L = 0;
    for (const auto& k : m.take_mtp_metrics()) L += k.loss;
    m.zero_grad();
    m.backward(Tensor::zeros({kB, kS}, DType::kFloat32));  // release the activations
    return L * c.mtp_loss_scaling_factor / static_cast<double>(c.mtp_num_layers);
  };
  step(m, b, /*main_seed=*/false);
  m.take_mtp_metrics();
  expect_gradient_is_derivative(m, {"mtp.layers.0.eh_proj.", "mtp.layers.1.transformer_layer.", "mtp.layers.0.enorm.",
                                     "embedding.", "decoder.layers.1.", "output_layer."},
                                mtp_loss);
}

// --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 recomputes the
// MTP module in backward (Megatron's _checkpointed_forward): same ops, same dropout streams.
TEST(GPTMtp, FullRecomputationIsBitwise) {
  TransformerConfig plain = llama_config(2, 0.1f), rec = plain;
  plain.hidden_dropout = rec.hidden_dropout = 0.1f;
  rec.recompute_granularity = transformer::RecomputeGranularity::kFull;
  rec.recompute_method = transformer::RecomputeMethod::kUniform;
  rec.recompute_num_layers = 1;
  GPTModel a(plain, kV, kS, 9), r(rec, kV, kS, 9);
  const auto b = make_batch(2);
  EXPECT_EQ(step(a, b), step(r, b));
  for (size_t i = 0; i < a.parameters().size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.parameters()[i].main_grad, r.parameters()[i].main_grad)) << a.parameters()[i].name;
  const auto ma = a.take_mtp_metrics(), mr = r.take_mtp_metrics();
  ASSERT_EQ(ma.size(), 2u);
  for (size_t k = 0; k < ma.size(); ++k) EXPECT_EQ(ma[k].loss, mr[k].loss);
}

// Two pipeline stages: MTP (and a copy of the word embedding, marked shared) on the last. The
// first stage's embedding gradient plus the copy's equals the one-stage gradient (what the
// embedding group's all-reduce forms); every other gradient equals its one-stage counterpart.
TEST(GPTMtp, TwoPipelineStagesEqualOne) {
  for (auto make : {gpt_config, llama_config}) {
    TransformerConfig c = make(2, 0.2f);
    c.num_layers = 4;
    GPTModel full(c, kV, kS, 5);
    GPTModelParallel p0, p1;
    p0.post_process = false;
    p0.num_layers = 2;
    p1.pre_process = false;
    p1.layer_offset = 2;
    p1.num_layers = 2;
    p1.pp_rank = 1;
    GPTModel first(c, kV, kS, 5, Device::cpu(), p0), last(c, kV, kS, 5, Device::cpu(), p1);
    Parameter& copy = last.parameter("embedding.word_embeddings.weight");
    EXPECT_TRUE(copy.shared);
    EXPECT_TRUE(bitwise_equal(copy.data, full.parameter("embedding.word_embeddings.weight").data));
    const auto b = make_batch(8);
    const double lf = step(full, b);
    first.zero_grad();
    last.zero_grad();
    last.set_input_tensor(first.forward(b, true));
    Tensor loss = last.forward(b, true);
    const double n = mask_sum(b.loss_mask);
    double ll = 0;
    auto l = loss.to_float_vector(), k = b.loss_mask.to_float_vector();
    std::vector<float> seed(l.size());
    for (size_t i = 0; i < l.size(); ++i) ll += double(l[i]) * k[i] / n, seed[i] = float(k[i] / n);
    last.set_mtp_loss_scale(1.0);
    last.backward(Tensor::from_vector(seed, loss.shape()));
    first.backward(last.input_tensor_grad());
    EXPECT_NEAR(ll, lf, 1e-6 * lf);
    auto pf = by_name(full);
    for (GPTModel* stage : {&first, &last})
      for (auto& p : stage->parameters()) {
        if (p.name == "embedding.word_embeddings.weight") continue;
        ASSERT_TRUE(pf.count(p.name)) << p.name;
        EXPECT_LE(max_rel_error(p.main_grad, pf[p.name]->main_grad), 1e-5) << p.name;
      }
    Tensor sum = first.parameter("embedding.word_embeddings.weight").main_grad.clone();
    ops::add_(sum, copy.main_grad);
    EXPECT_LE(max_rel_error(sum, pf["embedding.word_embeddings.weight"]->main_grad), 1e-5);
  }
}

// The logged counts: total = positions with a nonzero rolled mask (summed by hand here).
TEST(GPTMtp, MetricsCountTheRolledMask) {
  GPTModel m(gpt_config(2, 0.1f), kV, kS, 4);
  const auto b = make_batch(3);
  step(m, b);
  const auto met = m.take_mtp_metrics();
  ASSERT_EQ(met.size(), 2u);
  auto k = b.loss_mask.to_float_vector();
  for (int64_t d = 1; d <= 2; ++d) {
    double total = 0;
    for (int64_t r = 0; r < kB; ++r)
      for (int64_t i = 0; i + d < kS; ++i) total += k[r * kS + i + d] != 0.0f;
    EXPECT_EQ(met[d - 1].total, total) << "module " << d;
    EXPECT_GE(met[d - 1].correct, 0.0);
    EXPECT_LE(met[d - 1].correct, total);
  }
  EXPECT_TRUE(m.take_mtp_metrics()[0].total == 0.0) << "taken: the tracker restarts";
}

// Megatron's roll_tensor: left by one along the last dim, last position 0.
TEST(GPTMtp, RollTensor) {
  Tensor x = Tensor::from_vector_i64({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  EXPECT_EQ(i64(transformer::roll_tensor(x)), (std::vector<int64_t>{2, 3, 4, 0, 6, 7, 8, 0}));
  Tensor f = Tensor::from_vector({1, 1, 0, 1}, {1, 4});
  EXPECT_EQ(transformer::roll_tensor(f).to_float_vector(), (std::vector<float>{1, 0, 1, 0}));
}

// With context parallelism each rank's rolled chunks equal the chunks of the globally rolled
// sequence (get_batch_on_this_cp_rank's layout), for CP 2 and 3.
TEST(GPTMtp, RollTensorAcrossContextParallelRanks) {
  for (int cp : {2, 3}) {
    const int64_t s = 4 * cp;
    std::vector<int64_t> v(kB * s);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i + 1);
    datasets::GPTBatch whole, rolled;
    whole.tokens = Tensor::from_vector_i64(v, {kB, s});
    rolled.tokens = transformer::roll_tensor(whole.tokens);
    testing::run_ranks(cp, [&](int rank, comm::ProcessGroup& g) {
      const auto mine = transformer::get_batch_on_this_cp_rank(whole, cp, rank);
      const auto want = transformer::get_batch_on_this_cp_rank(rolled, cp, rank);
      EXPECT_EQ(i64(transformer::roll_tensor(mine.tokens, &g)), i64(want.tokens))
          << "CP " << cp << " rank " << rank;
    });
  }
}

TEST(GPTMtp, UnsupportedConfigurationsAreUserErrors) {
  TransformerConfig c = gpt_config(1, 0.1f);
  c.position_embedding_type = transformer::PositionEmbeddingType::kLearnedAbsolute;
  EXPECT_THROW(GPTModel(c, kV, kS, 1), UserError);
  c = gpt_config(-1, 0.1f);
  EXPECT_THROW(GPTModel(c, kV, kS, 1), UserError);
  c = gpt_config(1, 0.1f);
  c.recompute_granularity = transformer::RecomputeGranularity::kFull;
  c.recompute_method = transformer::RecomputeMethod::kUniform;
  c.recompute_num_layers = 2;
  EXPECT_THROW(GPTModel(c, kV, kS, 1), UserError);
  c.mtp_num_layers = 0;
  EXPECT_NO_THROW(GPTModel(c, kV, kS, 1));
}

// ---------------------------------------------------------------------------------------------
// Multi-token prediction with MoE (--mtp-num-layers with --num-experts): Megatron builds each MTP
// module's transformer layer from the last decoder layer's spec (gpt_layer_specs.py
// get_gpt_mtp_block_spec), so it is an MoE layer exactly when --moe-layer-freq makes the last
// decoder layer one, and its router records its losses at layer num_layers + k (router.py, with a
// num_layers + mtp_num_layers tracker). Checked against Megatron-LM (GPTMtpOracle.LlamaMoe...
// above: losses, the tracked per-layer aux / z losses, every gradient) and by invariants that need
// no reference numbers:
//  * Megatron's parameter names (mtp.layers.<k>.transformer_layer.mlp.router.weight, the experts'
//    local_experts.<e>.linear_fc{1,2}.weight) for a pattern ending in MoE, a dense MLP for one
//    ending dense;
//  * the tracker: D = 2 MoE MTP layers record load_balancing_loss / z_loss at indices L, L + 1 of
//    an L + D vector, nothing at the dense decoder layer;
//  * backward's gradient is the derivative of the objective it seeds -- the MTP loss plus every
//    MoE layer's aux and z losses (loss scale 1) -- by central finite differences along the
//    gradient, per parameter group (the MTP layer's router, its experts, its attention, the
//    decoder's MoE layer reached through hnorm), fp32, bound as in
//    FiniteDifferencesOfTheMtpLoss (2e-3 relative; measured worst 4.8e-4 over the OpenBLAS kernel
//    sets; top-4 of 4 experts, so that no routing choice changes under the perturbation).
TEST(GPTMtpMoE, MtpLayerTakesTheLastDecoderLayersSpec) {
  GPTModel moe(llama_moe_config(1, 0.5f), kV, kS, 1);
  std::vector<std::string> names;
  for (auto& p : moe.parameters())
    if (p.name.starts_with("mtp.layers.0.transformer_layer.mlp.")) names.push_back(p.name.substr(31));
  const std::vector<std::string> want = {"mlp.router.weight",
                                         "mlp.experts.local_experts.0.linear_fc1.weight",
                                         "mlp.experts.local_experts.0.linear_fc2.weight",
                                         "mlp.experts.local_experts.1.linear_fc1.weight",
                                         "mlp.experts.local_experts.1.linear_fc2.weight",
                                         "mlp.experts.local_experts.2.linear_fc1.weight",
                                         "mlp.experts.local_experts.2.linear_fc2.weight",
                                         "mlp.experts.local_experts.3.linear_fc1.weight",
                                         "mlp.experts.local_experts.3.linear_fc2.weight"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(moe.parameter("mtp.layers.0.transformer_layer.mlp.router.weight").data.shape(), (Shape{4, 64}));
  EXPECT_EQ(moe.moe_routers().size(), 2u);  // decoder layer 1, MTP module 0
  GPTModel dense(llama_moe_config(1, 0.5f, {1, 0}), kV, kS, 1);
  bool has_fc1 = false;
  for (auto& p : dense.parameters()) {
    EXPECT_FALSE(p.name.starts_with("mtp.") && p.name.find(".router.") != std::string::npos) << p.name;
    has_fc1 |= p.name == "mtp.layers.0.transformer_layer.mlp.linear_fc1.weight";
  }
  EXPECT_TRUE(has_fc1);
  EXPECT_EQ(dense.moe_routers().size(), 1u);
}

// step() with the main loss seeded with 0: the gradient is that of J = MTP loss + Σ_MoE layers
// (aux + z loss). Returns J from the logged values.
double objective_step(GPTModel& m, const TransformerConfig& c, const datasets::GPTBatch& b) {
  step(m, b, /*main_seed=*/false);
  double J = 0;
  for (const auto& k : m.take_mtp_metrics()) J += k.loss * c.mtp_loss_scaling_factor / static_cast<double>(c.mtp_num_layers);
  auto& e = MoEMetricsTracker::get().entries();
  for (double v : e.at("load_balancing_loss").values) J += v * c.moe_aux_loss_coeff[0];
  for (double v : e.at("z_loss").values) J += v * *c.moe_z_loss_coeff;
  return J;
}

TEST(GPTMtpMoE, RouterLossesAreTrackedAfterTheDecoderLayers) {
  const TransformerConfig c = llama_moe_config(2, 0.5f);
  GPTModel m(c, kV, kS, 3);
  objective_step(m, c, make_batch(4));
  for (const char* name : {"load_balancing_loss", "z_loss"}) {
    const auto& v = MoEMetricsTracker::get().entries().at(name).values;
    ASSERT_EQ(v.size(), 4u) << name;  // num_layers + mtp_num_layers
    EXPECT_EQ(v[0], 0.0) << name << ": dense decoder layer";
    for (int i : {1, 2, 3}) EXPECT_GT(v[i], 0.0) << name << " at layer " << i + 1;
  }
  MoEMetricsTracker::get().clear();
}

TEST(GPTMtpMoE, FiniteDifferencesOfMtpAndRouterLosses) {
  // Top-4 of 4: no top-k choice can change under the perturbation (with top-2 the near-tied
  // choices of these small initial router logits flip at steps of 1e-3, a jump of the objective
  // that finite differences cannot follow); the probabilities, aux and z losses keep their
  // gradients through the router.
  TransformerConfig c = llama_moe_config(1, 0.5f);
  c.moe_router_topk = 4;
  c.validate();
  GPTModel m(c, kV, kS, 5);
  const auto b = make_batch(6);
  objective_step(m, c, b);
  expect_gradient_is_derivative(m,
                                {"mtp.layers.0.transformer_layer.mlp.router.", "mtp.layers.0.transformer_layer.mlp.experts.",
                                 "mtp.layers.0.transformer_layer.self_attention.", "mtp.layers.0.eh_proj.",
                                 "decoder.layers.1.mlp."},
                                [&] { return objective_step(m, c, b); });
  MoEMetricsTracker::get().clear();
}

}  // namespace
}  // namespace megatron
