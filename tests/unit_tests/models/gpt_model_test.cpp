// GPTModel against independent PyTorch implementations (tests/reference/model/gen_model_fixtures.py):
// a tiny Megatron-style GPT and a tiny LLaMA written from Hugging Face LlamaForCausalLM's math.
#include "megatron/core/models/gpt/gpt_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_utils/fixture_util.h"
#include "megatron/core/tensor_parallel/random.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using testing::Fixture;
using testing::max_rel_error;
using transformer::TransformerConfig;

TransformerConfig tiny_gpt_config() {
  TransformerConfig c = megatron::testing::tiny_gpt_config(64);
  c.bias_activation_fusion = true;  // pretrain_gpt default: tanh GeLU (fused bias_gelu)
  return c;
}

TransformerConfig tiny_llama_config() {
  TransformerConfig c = megatron::testing::tiny_llama_config(64, 2, 176);
  c.layernorm_epsilon = 1e-5f;
  c.rotary_base = 500000.0f;
  return c;
}

datasets::GPTBatch batch_from(const Fixture& f) {
  datasets::GPTBatch b;
  b.tokens = f.get("tokens");
  b.labels = f.get("labels");
  b.position_ids = f.get("position_ids");
  b.loss_mask = Tensor::zeros(b.tokens.shape(), DType::kFloat32);
  b.loss_mask.fill_(1.0f);
  if (f.has("attention_mask")) {
    Tensor m64 = f.get("attention_mask");
    b.attention_mask = Tensor::empty(m64.shape(), DType::kUInt8);
    for (int64_t i = 0; i < m64.numel(); ++i) b.attention_mask.data<uint8_t>()[i] = m64.data<int64_t>()[i] != 0;
  }
  return b;
}

void load_params(GPTModel& m, const Fixture& f) {
  size_t loaded = 0;
  for (auto& p : m.parameters()) {
    ASSERT_TRUE(f.has("param/" + p.name)) << "fixture lacks " << p.name;
    Tensor t = f.get("param/" + p.name);
    ASSERT_EQ(t.shape(), p.data.shape()) << p.name;
    p.data.copy_(t.to(p.data.dtype()));
    ++loaded;
  }
  EXPECT_EQ(loaded, f.keys_with_prefix("param/").size()) << "the fixture has parameters our model lacks";
}

// Tolerance: 1e-5 of the tensor's largest magnitude. Our CPU kernels compute in fp32, the
// reference in fp64 from the same fp32 weights, so the difference is fp32 rounding through
// two layers (observed ~1e-6); 1e-5 is the project's CPU-vs-reference bound (docs/architecture.md#testing).
constexpr double kTol = 1e-5;

void check_against_fixture(const TransformerConfig& config, int64_t vocab, int64_t max_pos, const char* name) {
  Fixture f(name);
  GPTModel model(config, vocab, max_pos, /*seed=*/1234);
  load_params(model, f);
  auto batch = batch_from(f);
  // The logits from an eval forward: a training forward without TP runs the fused cross entropy,
  // which leaves softmax - onehot in their place (GPTModel::last_logits). Dropout is 0, so the
  // training forward below computes the same logits; its backward checks the fused gradient path.
  model.forward(batch, /*training=*/false);
  const double logits_err = max_rel_error(model.last_logits(), f.get("logits"));
  Tensor loss = model.forward(batch, /*training=*/true);
  const double loss_err = max_rel_error(loss, f.get("loss"));
  EXPECT_LE(logits_err, kTol) << "logits";
  EXPECT_LE(loss_err, kTol) << "loss";
  model.zero_grad();
  model.backward(f.get("dloss"));
  double worst = 0.0;
  for (auto& p : model.parameters()) {
    const double e = max_rel_error(p.main_grad, f.get("grad/" + p.name));
    worst = std::max(worst, e);
    EXPECT_LE(e, kTol) << "gradient of " << p.name;
  }
  std::printf("%s: logits %.2e loss %.2e worst gradient %.2e (relative to max |ref|)\n", name, logits_err,
              loss_err, worst);
  // Gradient accumulation: a second forward/backward adds the same gradients again.
  model.forward(batch, true);
  model.backward(f.get("dloss"));
  for (auto& p : model.parameters()) {
    Tensor twice = f.get("grad/" + p.name);
    for (int64_t i = 0; i < twice.numel(); ++i) twice.data<float>()[i] *= 2.0f;
    EXPECT_LE(max_rel_error(p.main_grad, twice), kTol) << "accumulated gradient of " << p.name;
  }
}

TEST(GPTModel, TinyGPTMatchesPyTorch) { check_against_fixture(tiny_gpt_config(), 128, 40, "tiny_gpt"); }

TEST(GPTModel, TinyLlamaMatchesPyTorchHFMath) { check_against_fixture(tiny_llama_config(), 256, 32, "tiny_llama"); }

TransformerConfig tiny_variant_config() {
  TransformerConfig c = megatron::testing::tiny_gpt_config(48, megatron::testing::TinyDropout::kOff, 2, 6);
  c.num_query_groups = 3;
  c.kv_channels = 12;  // not hidden / heads = 8
  c.ffn_hidden_size = 80;
  c.layernorm_zero_centered_gamma = true;
  c.qk_layernorm = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = true;
  c.bias_activation_fusion = true;  // no bias -> exact erf GeLU (Megatron disables the fusion)
  c.position_embedding_type = transformer::PositionEmbeddingType::kRope;
  c.rotary_interleaved = true;
  c.rotary_percent = 0.5f;
  c.share_embeddings_and_output_weights = false;
  return c;
}

TEST(GPTModel, OptionVariantsMatchPyTorch) {
  // --qk-layernorm, --apply-layernorm-1p, --add-qkv-bias + --disable-bias-linear, --kv-channels, interleaved
  // RoPE on half the channels, GQA, untied output, explicit block-diagonal attention mask.
  check_against_fixture(tiny_variant_config(), 64, 16, "tiny_variants");
}

TEST(GPTModel, ParameterNamesAndOrderFollowMegatron) {
  GPTModel gpt(tiny_gpt_config(), 128, 40, 1);
  std::vector<std::string> names;
  for (auto& p : gpt.parameters()) names.push_back(p.name);
  const std::vector<std::string> expect_head = {
      "embedding.word_embeddings.weight",
      "embedding.position_embeddings.weight",
      "decoder.layers.0.input_layernorm.weight",
      "decoder.layers.0.input_layernorm.bias",
      "decoder.layers.0.self_attention.linear_proj.weight",
      "decoder.layers.0.self_attention.linear_proj.bias",
      "decoder.layers.0.self_attention.linear_qkv.weight",
      "decoder.layers.0.self_attention.linear_qkv.bias",
      "decoder.layers.0.pre_mlp_layernorm.weight",
      "decoder.layers.0.pre_mlp_layernorm.bias",
      "decoder.layers.0.mlp.linear_fc1.weight",
      "decoder.layers.0.mlp.linear_fc1.bias",
      "decoder.layers.0.mlp.linear_fc2.weight",
      "decoder.layers.0.mlp.linear_fc2.bias",
  };
  ASSERT_EQ(names.size(), 2u + 2 * 12 + 2);
  for (size_t i = 0; i < expect_head.size(); ++i) EXPECT_EQ(names[i], expect_head[i]);
  EXPECT_EQ(names.back(), "decoder.final_layernorm.bias");

  GPTModel llama(tiny_llama_config(), 256, 32, 1);
  EXPECT_EQ(llama.parameters().front().name, "embedding.word_embeddings.weight");
  EXPECT_EQ(llama.parameters().back().name, "output_layer.weight");
  EXPECT_EQ(llama.parameter("decoder.layers.0.self_attention.linear_qkv.weight").data.shape(), (Shape{128, 64}));
  EXPECT_EQ(llama.parameter("decoder.layers.0.mlp.linear_fc1.weight").data.shape(), (Shape{352, 64}));
  EXPECT_THROW(llama.parameter("decoder.layers.0.mlp.linear_fc1.bias"), UserError);
}

TEST(GPTModel, ParamGroupFlags) {
  GPTModel m(tiny_llama_config(), 256, 32, 1);
  for (auto& p : m.parameters()) {
    EXPECT_EQ(p.no_weight_decay, p.data.dim() == 1) << p.name;
    EXPECT_EQ(p.is_embedding_or_output,
              p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight") << p.name;
    EXPECT_EQ(p.main_grad.dtype(), DType::kFloat32);
  }
}

TEST(GPTModel, BuffersAreContiguousInReverseOrder) {
  GPTModel m(tiny_gpt_config(), 128, 40, 1);
  auto& params = m.parameters();
  int64_t total = 0;
  for (auto& p : params) total += p.data.numel();
  EXPECT_EQ(m.param_buffer().numel(), total);
  EXPECT_EQ(m.grad_buffer().numel(), total);
  // The last registered parameter starts the buffer; each earlier one follows the next.
  EXPECT_EQ(params.back().data.data_ptr(), m.param_buffer().data_ptr());
  EXPECT_EQ(params.back().main_grad.data_ptr(), m.grad_buffer().data_ptr());
  for (size_t i = 0; i + 1 < params.size(); ++i) {
    auto* next_end = static_cast<char*>(params[i + 1].data.data_ptr()) + params[i + 1].data.nbytes();
    EXPECT_EQ(params[i].data.data_ptr(), next_end) << params[i].name;
  }
}

TEST(GPTModel, InitializationFollowsMegatron) {
  TransformerConfig c = tiny_gpt_config();
  c.num_layers = 8;  // output-layer scale 1/sqrt(16) = 0.25
  GPTModel m(c, 128, 40, 7);
  auto stddev = [](const Tensor& t) {
    auto v = t.to_float_vector();
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    return std::sqrt(s2 / v.size() - (s / v.size()) * (s / v.size()));
  };
  // Sample std of >= 4096 normal draws is within ~5% of the true std (4 sigma: 4/sqrt(2n)).
  EXPECT_NEAR(stddev(m.parameter("embedding.word_embeddings.weight").data), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(stddev(m.parameter("decoder.layers.3.self_attention.linear_qkv.weight").data), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(stddev(m.parameter("decoder.layers.3.self_attention.linear_proj.weight").data), 0.005, 0.005 * 0.05);
  EXPECT_NEAR(stddev(m.parameter("decoder.layers.3.mlp.linear_fc2.weight").data), 0.005, 0.005 * 0.05);
  for (float x : m.parameter("decoder.layers.3.mlp.linear_fc1.bias").data.to_float_vector()) EXPECT_EQ(x, 0.0f);
  for (float x : m.parameter("decoder.final_layernorm.weight").data.to_float_vector()) EXPECT_EQ(x, 1.0f);
  c.layernorm_zero_centered_gamma = true;
  GPTModel z(c, 128, 40, 7);
  for (float x : z.parameter("decoder.final_layernorm.weight").data.to_float_vector()) EXPECT_EQ(x, 0.0f);
  // Different parameters get different streams.
  EXPECT_NE(m.parameter("decoder.layers.0.mlp.linear_fc1.weight").data.to_float_vector()[0],
            m.parameter("decoder.layers.1.mlp.linear_fc1.weight").data.to_float_vector()[0]);
}

}  // namespace
}  // namespace megatron
