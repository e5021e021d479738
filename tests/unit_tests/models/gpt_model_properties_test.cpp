// GPTModel properties that need no external reference: reduced-precision emulation against the
// fp32 model, run-to-run determinism, TP-sharding independence of the initialization, and
// Megatron's configuration checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "megatron/core/models/gpt/gpt_model.h"
#include "test_utils/fixture_util.h"
#include "megatron/core/tensor_parallel/random.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using transformer::TransformerConfig;

// Default dropout (0.1): some tests exercise it in training mode.
TransformerConfig small_config(bool llama) {
  using megatron::testing::TinyDropout;
  return llama ? megatron::testing::tiny_llama_config(64, 2, 176, TinyDropout::kDefault)
               : megatron::testing::tiny_gpt_config(64, TinyDropout::kDefault);
}

datasets::GPTBatch make_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> tok(b * s), lab(b * s);
  for (int64_t i = 0; i < b * s; ++i) {
    tok[i] = static_cast<int64_t>(tensor_parallel::splitmix64(seed + 2 * i) % vocab);
    lab[i] = static_cast<int64_t>(tensor_parallel::splitmix64(seed + 2 * i + 1) % vocab);
  }
  return testing::gpt_batch(tok, lab, b, s);
}

Tensor ones(const Shape& s) {
  Tensor t = Tensor::zeros(s, DType::kFloat32);
  t.fill_(1.0f / static_cast<float>(shape_numel(s)));
  return t;
}

double rel_norm_error(const Tensor& a, const Tensor& b) {
  auto va = a.to_float_vector(), vb = b.to_float_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) num += std::pow(double(va[i]) - vb[i], 2), den += double(vb[i]) * vb[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(GPTModelPrecision, BF16AndFP16EmulationTrackFP32) {
  for (DType low : {DType::kBFloat16, DType::kFloat16})
    for (bool llama : {false, true}) {
      TransformerConfig c32 = small_config(llama);
      c32.hidden_dropout = c32.attention_dropout = 0.0f;
      TransformerConfig c16 = c32;
      c16.params_dtype = low;
      GPTModel m32(c32, 128, 32, 11), m16(c16, 128, 32, 11);
      // Same seed: the bf16 parameters are exactly the RNE-rounded fp32 ones.
      for (size_t i = 0; i < m32.parameters().size(); ++i) {
        auto& p32 = m32.parameters()[i];
        auto& p16 = m16.parameters()[i];
        ASSERT_EQ(p16.data.dtype(), low);
        ASSERT_EQ(p16.main_grad.dtype(), DType::kFloat32) << "fp32 main grads";
        auto a = p32.data.to(low).to_float_vector(), b = p16.data.to_float_vector();
        ASSERT_EQ(a, b) << p32.name;
      }
      // Run the fp32 model on the bf16-rounded weights so only activation rounding differs.
      for (size_t i = 0; i < m32.parameters().size(); ++i)
        m32.parameters()[i].data.copy_(m16.parameters()[i].data.to(DType::kFloat32));
      auto batch = make_batch(2, 32, 128, 5);
      Tensor l32 = m32.forward(batch, true), l16 = m16.forward(batch, true);
      // Tolerance: bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3; fp16 2^-11); the
      // activations are rounded ~20 times along 2 layers, mostly independently, so the per-token
      // losses stay within 2e-3 relative (norm) and the gradients, rounded again on the way back
      // and smaller in magnitude, within 2e-2. Observed (printed): bf16 ~1.5e-4 / ~7e-3.
      const double loss_err = rel_norm_error(l16, l32);
      EXPECT_LE(loss_err, 2e-3) << (llama ? "llama" : "gpt");
      m32.backward(ones({2, 32}));
      m16.backward(ones({2, 32}));
      double worst = 0;
      for (size_t i = 0; i < m32.parameters().size(); ++i) {
        const double e = rel_norm_error(m16.parameters()[i].main_grad, m32.parameters()[i].main_grad);
        worst = std::max(worst, e);
        EXPECT_LE(e, 2e-2) << m32.parameters()[i].name;
      }
      std::printf("%s %s vs fp32: loss rel-norm error %.2e, worst gradient rel-norm error %.2e\n",
                  llama ? "llama" : "gpt", dtype_name(low), loss_err, worst);
    }
}

TEST(GPTModelDeterminism, SameSeedIsBitwiseIdentical) {
  TransformerConfig c = small_config(false);  // dropout 0.1 (defaults) exercised in training mode
  auto run = [&](uint64_t seed) {
    GPTModel m(c, 128, 32, seed);
    auto batch = make_batch(2, 32, 128, 9);
    std::vector<float> out;
    for (int step = 0; step < 2; ++step) {  // two micro-batches: the dropout stream advances
      Tensor loss = m.forward(batch, true);
      auto l = loss.to_float_vector();
      out.insert(out.end(), l.begin(), l.end());
      m.backward(ones({2, 32}));
    }
    auto g = m.grad_buffer().to_float_vector();
    out.insert(out.end(), g.begin(), g.end());
    return out;
  };
  auto a = run(1234), b = run(1234), c2 = run(1235);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  EXPECT_NE(std::memcmp(a.data(), c2.data(), a.size() * 4), 0);
}

TEST(GPTModelDeterminism, EvalModeDisablesDropout) {
  GPTModel m(small_config(false), 128, 32, 3);
  auto batch = make_batch(2, 16, 128, 1);
  auto a = m.forward(batch, false).to_float_vector();
  m.backward(ones({2, 16}));
  auto b = m.forward(batch, false).to_float_vector();
  m.backward(ones({2, 16}));
  auto t = m.forward(batch, true).to_float_vector();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, t);
}

/// A process group that only reports a rank and size (enough to build a TP shard).
class ShapeOnlyGroup final : public comm::ProcessGroup {
 public:
  ShapeOnlyGroup(int rank, int size) : rank_(rank), size_(size), ranks_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  std::unique_ptr<comm::Work> all_reduce(Tensor&, comm::ReduceOp, bool) override { fail(); }
  std::unique_ptr<comm::Work> all_gather(const Tensor&, Tensor&, bool) override { fail(); }
  std::unique_ptr<comm::Work> reduce_scatter(const Tensor&, Tensor&, comm::ReduceOp, bool) override {
    fail();
  }
  std::unique_ptr<comm::Work> broadcast(Tensor&, int, bool) override { fail(); }
  std::unique_ptr<comm::Work> send(const Tensor&, int, bool) override { fail(); }
  std::unique_ptr<comm::Work> recv(Tensor&, int, bool) override { fail(); }
  void barrier() override { fail(); }

 private:
  [[noreturn]] static void fail() { throw std::logic_error("ShapeOnlyGroup has no communication"); }
  int rank_, size_;
  std::vector<int> ranks_;
};

/// Slice of the global tensor `g` that rank r of `tp` owns for parameter p (reference
/// formula, written independently of global_index_of): contiguous blocks along the
/// partition dim, per stride block (SwiGLU fc1 = [gate; up]).
std::vector<float> expected_shard(const Parameter& p, const Tensor& global, int r, int tp) {
  auto gv = global.to_float_vector();
  const Shape& gs = p.global_shape;
  if (p.partition_dim < 0) return gv;
  std::vector<float> out;
  if (p.partition_dim == 0) {
    const int64_t cols = gs.size() > 1 ? gs[1] : 1;
    const int64_t stride = p.partition_stride, block = gs[0] / stride, per = block / tp;
    for (int64_t s = 0; s < stride; ++s)
      for (int64_t row = s * block + r * per; row < s * block + (r + 1) * per; ++row)
        out.insert(out.end(), gv.begin() + row * cols, gv.begin() + (row + 1) * cols);
  } else {
    const int64_t per = gs[1] / tp;
    for (int64_t row = 0; row < gs[0]; ++row)
      out.insert(out.end(), gv.begin() + row * gs[1] + r * per, gv.begin() + row * gs[1] + (r + 1) * per);
  }
  return out;
}

TEST(GPTModelInit, TensorParallelShardsAreSlicesOfTheGlobalWeights) {
  for (bool llama : {false, true}) {
    TransformerConfig c = small_config(llama);
    GPTModel full(c, 128, 32, 42);
    c.tensor_model_parallel_size = 2;
    for (int r = 0; r < 2; ++r) {
      models::gpt::GPTModelParallel par;
      par.tp_group = std::make_shared<ShapeOnlyGroup>(r, 2);
      GPTModel shard(c, 128, 32, 42, Device::cpu(), par);
      ASSERT_EQ(shard.parameters().size(), full.parameters().size());
      for (size_t i = 0; i < full.parameters().size(); ++i) {
        auto& pf = full.parameters()[i];
        auto& ps = shard.parameters()[i];
        ASSERT_EQ(pf.name, ps.name);
        EXPECT_EQ(ps.global_shape, pf.global_shape);
        EXPECT_EQ(ps.data.to_float_vector(), expected_shard(ps, pf.data, r, 2)) << ps.name << " rank " << r;
      }
      // Megatron's TP layouts: QKV/fc1/vocab split by rows, proj/fc2 by columns.
      EXPECT_EQ(shard.parameter("decoder.layers.0.self_attention.linear_qkv.weight").partition_dim, 0);
      EXPECT_EQ(shard.parameter("decoder.layers.0.self_attention.linear_proj.weight").partition_dim, 1);
      EXPECT_EQ(shard.parameter("decoder.layers.0.mlp.linear_fc2.weight").partition_dim, 1);
      EXPECT_EQ(shard.parameter("embedding.word_embeddings.weight").data.size(0), 64);
      EXPECT_EQ(shard.parameter("decoder.layers.0.mlp.linear_fc1.weight").partition_stride, llama ? 2 : 1);
    }
  }
}

TEST(GPTModelConfig, MegatronConsistencyChecksThrowUserError) {
  auto expect_error = [](auto mutate, const char* fragment) {
    TransformerConfig c = small_config(false);
    mutate(c);
    try {
      c.validate();
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([](TransformerConfig& c) { c.num_attention_heads = 5; }, "--num-attention-heads");
  expect_error([](TransformerConfig& c) { c.num_query_groups = 3; }, "--num-query-groups");
  expect_error([](TransformerConfig& c) { c.tensor_model_parallel_size = 3; }, "--tensor-model-parallel-size");
  expect_error([](TransformerConfig& c) { c.num_layers = 0; }, "--num-layers");
  expect_error([](TransformerConfig& c) { c.hidden_dropout = 1.0f; }, "--hidden-dropout");
  expect_error([](TransformerConfig& c) { c.sequence_parallel = true; }, "--sequence-parallel");
  expect_error(
      [](TransformerConfig& c) {
        c.position_embedding_type = transformer::PositionEmbeddingType::kRope;
        c.rotary_percent = 0.05f;
      },
      "--rotary-percent");
  TransformerConfig ok = small_config(false);
  ok.validate();
  EXPECT_EQ(ok.ffn_hidden_size, 256);
  EXPECT_EQ(ok.kv_channels, 16);
  EXPECT_EQ(ok.num_query_groups, 4);
  EXPECT_THROW(transformer::parse_normalization("LayerNorm2"), UserError);
  EXPECT_EQ(transformer::parse_position_embedding_type("rope"), transformer::PositionEmbeddingType::kRope);
}

TEST(GPTModelConfig, BadBatchThrowsUserError) {
  GPTModel m(small_config(false), 128, 16, 1);
  EXPECT_THROW(m.forward(make_batch(1, 32, 128, 1), true), UserError);  // seq > max positions
  auto batch = make_batch(1, 8, 128, 1);
  batch.tokens.data<int64_t>()[3] = 128;
  EXPECT_THROW(m.forward(batch, true), UserError);    // token outside the vocabulary
  EXPECT_THROW(m.backward(ones({1, 8})), UserError);  // no forward in flight
}

}  // namespace
}  // namespace megatron

namespace megatron {
namespace {

TEST(GPTModelRecompute, FullRecomputationGivesBitwiseTheSameGradients) {
  // Dropout on: the recomputed forward must replay the same masks. The kernels are
  // deterministic, so the gradients must be bitwise equal to the run that kept activations.
  auto run = [](transformer::RecomputeGranularity g, transformer::RecomputeMethod m, int64_t k) {
    TransformerConfig c = small_config(true);
    c.num_layers = 3;
    c.recompute_granularity = g;
    c.recompute_method = m;
    c.recompute_num_layers = k;
    GPTModel model(c, 128, 16, 77);
    auto batch = make_batch(2, 16, 128, 4);
    std::vector<float> out = model.forward(batch, true).to_float_vector();
    model.backward(ones({2, 16}));
    auto g2 = model.grad_buffer().to_float_vector();
    out.insert(out.end(), g2.begin(), g2.end());
    return out;
  };
  using G = transformer::RecomputeGranularity;
  using M = transformer::RecomputeMethod;
  const auto ref = run(G::kNone, M::kNone, 0);
  for (auto [m, k] : {std::pair{M::kUniform, 1}, {M::kUniform, 2}, {M::kBlock, 1}, {M::kBlock, 3}}) {
    const auto got = run(G::kFull, m, k);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0)
        << (m == M::kUniform ? "uniform " : "block ") << k;
  }
  EXPECT_EQ(std::memcmp(run(G::kSelective, M::kNone, 0).data(), ref.data(), ref.size() * 4), 0);
  TransformerConfig bad = small_config(false);
  bad.recompute_granularity = G::kFull;
  EXPECT_THROW(bad.validate(), UserError);  // no method
  bad.recompute_method = M::kUniform;
  EXPECT_THROW(bad.validate(), UserError);  // no layer count
}

}  // namespace
}  // namespace megatron
