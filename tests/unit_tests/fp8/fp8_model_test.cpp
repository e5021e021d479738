// GPTModel with FP8 (TransformerConfig::fp8) on the CPU: which GEMMs are FP8 (Megatron / TE:
// linear_qkv, linear_proj, linear_fc1, linear_fc2 of every layer; not the output layer), which
// passes record amaxes (training forward and backward; not evaluation), and that the step
// update turns the recorded amaxes into scales (scale = 448 / amax for the E4M3 input role).
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using transformer::TransformerConfig;

TransformerConfig fp8_llama() {
  TransformerConfig c = megatron::testing::tiny_llama_config(64, 2, 128);
  c.fp8 = fp8::Fp8Config{};
  return c;
}

datasets::GPTBatch batch(int64_t b, int64_t s, int64_t vocab) {
  std::vector<int64_t> tok(b * s), lab(b * s);
  for (int64_t i = 0; i < b * s; ++i) {
    tok[i] = (7 * i + 3) % vocab;
    lab[i] = (5 * i + 1) % vocab;
  }
  datasets::GPTBatch out;
  out.tokens = Tensor::from_vector_i64(tok, {b, s});
  out.labels = Tensor::from_vector_i64(lab, {b, s});
  return out;
}

TEST(Fp8Model, FourFp8LinearsPerLayer) {
  GPTModel m(fp8_llama(), 128, 16, 1234);
  fp8::Fp8State* st = m.fp8_state();
  ASSERT_NE(st, nullptr);
  ASSERT_EQ(st->num_roles(), 2 * 4 * fp8::kNumRoles);
  std::vector<std::string> names;
  for (int base = 0; base < st->num_roles(); base += fp8::kNumRoles) names.push_back(st->linear_name(base));
  EXPECT_EQ(names, (std::vector<std::string>{"decoder.layers.0.self_attention.linear_qkv",
                                             "decoder.layers.0.self_attention.linear_proj",
                                             "decoder.layers.0.mlp.linear_fc1", "decoder.layers.0.mlp.linear_fc2",
                                             "decoder.layers.1.self_attention.linear_qkv",
                                             "decoder.layers.1.self_attention.linear_proj",
                                             "decoder.layers.1.mlp.linear_fc1", "decoder.layers.1.mlp.linear_fc2"}));
  TransformerConfig plain = fp8_llama();
  plain.fp8.reset();
  GPTModel m2(plain, 128, 16, 1234);
  EXPECT_EQ(m2.fp8_state(), nullptr);
}

TEST(Fp8Model, TrainingRecordsAmaxesEvaluationDoesNot) {
  GPTModel m(fp8_llama(), 128, 16, 1234);
  fp8::Fp8State& st = *m.fp8_state();
  auto amaxes = [&](int role) {
    std::vector<float> v;
    for (int base = 0; base < st.num_roles(); base += fp8::kNumRoles) v.push_back(st.amax(base + role).item());
    return v;
  };
  m.forward(batch(2, 16, 128), /*training=*/false);
  for (float a : amaxes(fp8::kInput)) EXPECT_EQ(a, 0.0f);
  for (float a : amaxes(fp8::kWeight)) EXPECT_EQ(a, 0.0f);
  Tensor loss = m.forward(batch(2, 16, 128), /*training=*/true);
  for (float a : amaxes(fp8::kInput)) EXPECT_GT(a, 0.0f);
  for (float a : amaxes(fp8::kWeight)) EXPECT_GT(a, 0.0f);
  for (float a : amaxes(fp8::kGradOutput)) EXPECT_EQ(a, 0.0f);  // before backward
  Tensor dloss = Tensor::zeros(loss.shape(), DType::kFloat32);
  dloss.fill_(1.0f / 32.0f);
  m.backward(dloss);
  for (float a : amaxes(fp8::kGradOutput)) EXPECT_GT(a, 0.0f);
  // Step boundary: scale = 448 / amax (most_recent, history 1, margin 0) for the input role.
  const float a0 = st.amax(fp8::kInput).item();
  st.reduce_and_update(nullptr);
  EXPECT_FLOAT_EQ(st.host_scale(fp8::kInput), 448.0f / a0);
  EXPECT_EQ(st.amax(fp8::kInput).item(), 0.0f);
  EXPECT_TRUE(std::isfinite(loss.to_float_vector()[0]));
}

}  // namespace
}  // namespace megatron
