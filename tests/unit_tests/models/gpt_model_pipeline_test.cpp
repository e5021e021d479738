// GPTModel split into two pipeline stages (pre_process / post_process, set_input_tensor),
// run back to back in one process, equals the single-stage model.
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/random.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using models::gpt::GPTModelParallel;
using transformer::TransformerConfig;

double max_rel(const Tensor& a, const Tensor& b) {
  auto va = a.to_float_vector(), vb = b.to_float_vector();
  double err = 0, ref = 0;
  for (size_t i = 0; i < va.size(); ++i) err = std::max(err, std::abs(double(va[i]) - vb[i])), ref = std::max(ref, std::abs(double(vb[i])));
  return ref == 0 ? err : err / ref;
}

void check_two_stages(TransformerConfig c) {
  c.num_layers = 4;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  const int64_t V = 128, b = 2, s = 16;
  std::vector<int64_t> tok(b * s), lab(b * s), pos(b * s);
  for (int64_t i = 0; i < b * s; ++i)
    tok[i] = tensor_parallel::splitmix64(3 * i) % V, lab[i] = tensor_parallel::splitmix64(3 * i + 1) % V, pos[i] = i % s;
  datasets::GPTBatch batch;
  batch.tokens = Tensor::from_vector_i64(tok, {b, s});
  batch.labels = Tensor::from_vector_i64(lab, {b, s});
  batch.position_ids = Tensor::from_vector_i64(pos, {b, s});
  Tensor dloss = Tensor::zeros({b, s}, DType::kFloat32);
  dloss.fill_(1.0f / (b * s));

  GPTModel full(c, V, s, 5);
  Tensor loss_full = full.forward(batch, true);
  full.backward(dloss);

  GPTModelParallel p0, p1;
  p0.post_process = false;
  p0.num_layers = 2;
  p1.pre_process = false;
  p1.layer_offset = 2;
  p1.num_layers = 2;
  p1.pp_rank = 1;
  GPTModel first(c, V, s, 5, Device::cpu(), p0), last(c, V, s, 5, Device::cpu(), p1);
  EXPECT_EQ(last.parameters().front().name, "decoder.layers.2.input_layernorm.weight");
  EXPECT_EQ(first.parameters().back().name, "decoder.layers.1.mlp.linear_fc2." + std::string(c.add_bias_linear ? "bias" : "weight"));

  Tensor h = first.forward(batch, true);
  EXPECT_EQ(h.shape(), (Shape{s, b, c.hidden_size}));
  last.set_input_tensor(h);
  Tensor loss = last.forward(batch, true);
  EXPECT_LE(max_rel(loss, loss_full), 1e-6) << "same ops in the same order: equal up to rounding";
  last.backward(dloss);
  ASSERT_TRUE(last.input_tensor_grad().defined());
  first.backward(last.input_tensor_grad());

  for (auto* stage : {&first, &last})
    for (auto& p : stage->parameters()) {
      const bool tied_part = c.share_embeddings_and_output_weights &&
                             (p.name == "output_layer.weight" || p.name == "embedding.word_embeddings.weight");
      if (!tied_part) EXPECT_LE(max_rel(p.main_grad, full.parameter(p.name).main_grad), 1e-6) << p.name;
      if (!(tied_part && p.name == "output_layer.weight"))  // the copy is checked below
        EXPECT_EQ(p.data.to_float_vector(), full.parameter(p.name).data.to_float_vector()) << p.name;
    }
  if (c.share_embeddings_and_output_weights) {
    // The last stage's copy starts equal to the embedding; the two gradients sum to the tied one
    // (what the embedding-group all-reduce computes).
    auto& copy = last.parameter("output_layer.weight");
    auto& emb = first.parameter("embedding.word_embeddings.weight");
    EXPECT_TRUE(copy.shared);
    EXPECT_FALSE(emb.shared);
    EXPECT_EQ(copy.data.to_float_vector(), emb.data.to_float_vector());
    Tensor sum = emb.main_grad.clone();
    ops::add_(sum, copy.main_grad);
    EXPECT_LE(max_rel(sum, full.parameter("embedding.word_embeddings.weight").main_grad), 1e-6);
  }
}

TEST(GPTModelPipeline, TwoStagesTiedGPTEqualOneStage) {
  check_two_stages(megatron::testing::tiny_gpt_config(64));  // check_two_stages sets 4 layers
}

TEST(GPTModelPipeline, TwoStagesLlamaEqualOneStage) {
  check_two_stages(megatron::testing::tiny_llama_config(64, 2, 176));
}

TEST(GPTModelPipeline, StageWithoutInputTensorThrows) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  GPTModelParallel p;
  p.pre_process = false;
  GPTModel m(c, 128, 16, 1, Device::cpu(), p);
  datasets::GPTBatch batch;
  batch.labels = Tensor::from_vector_i64(std::vector<int64_t>(16, 1), {1, 16});
  EXPECT_THROW(m.forward(batch, false), UserError);
  // A middle stage (neither first nor last) needs nothing from the batch but the mask.
  GPTModelParallel mid;
  mid.pre_process = mid.post_process = false;
  GPTModel middle(c, 128, 16, 1, Device::cpu(), mid);
  middle.set_input_tensor(Tensor::zeros({16, 1, 64}, DType::kFloat32));
  Tensor out = middle.forward(datasets::GPTBatch{}, false);
  EXPECT_EQ(out.shape(), (Shape{16, 1, 64}));
  middle.backward(Tensor::zeros({16, 1, 64}, DType::kFloat32));
  EXPECT_EQ(middle.input_tensor_grad().shape(), (Shape{16, 1, 64}));
  p.layer_offset = 1;
  p.num_layers = 2;
  EXPECT_THROW(GPTModel(c, 128, 16, 1, Device::cpu(), p), UserError);
}

}  // namespace
}  // namespace megatron
