// Activation memory of full recomputation (--recompute-granularity full), measured with the
// tensor allocator's statistics (megatron/core/tensor/memory_stats.h) on the CPU.
//
// Expected values by hand from what one GPT layer keeps for its backward (transformer_layer.h,
// attention.h, mlp.h, norm.h), T = tokens (s * b), h = hidden, a = heads, fp32, no dropout, TP 1:
//   input x [T, h], input_layernorm out [T, h] (the QKV GEMM's input), q, k, v [T, 3h] (the QKV
//   output), attention out [T, h] (linear_proj's input), x1 = x + attn [T, h], pre_mlp_layernorm
//   out [T, h] (fc1's input), fc1 out [T, 4h] (pre-activation), GeLU out [T, 4h] (fc2's input)
//   = 16 h floats per token; plus LayerNorm mean + rstd (2 x 2 floats) and the attention
//   log-sum-exp (a floats) per token.
// With uniform recomputation of 1 layer a layer keeps only its input x: h floats per token.
// The test measures the slope of the peak (max allocated during forward + backward) in the number
// of layers, L = 2 -> 6, so everything that does not scale with L (embedding, logits, loss,
// backward scratch, the one layer being recomputed) cancels:
//   slope without recomputation = (16 h + 4 + a) * T * 4 bytes per layer
//   slope with uniform 1        =            h   * T * 4 bytes per layer
// Tolerance: 1% of the no-recomputation slope for both: the peak can move by a few small
// per-token vectors (T floats = 0.1% of that slope here) depending on where in backward it falls.
#include <gtest/gtest.h>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/tensor/memory_stats.h"
#include "megatron/core/tensor_parallel/random.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using transformer::RecomputeGranularity;
using transformer::RecomputeMethod;
using transformer::TransformerConfig;

constexpr int64_t kH = 64, kHeads = 4, kSeq = 64, kBatch = 2, kVocab = 128;

datasets::GPTBatch batch() {
  const int64_t n = kBatch * kSeq;
  std::vector<int64_t> tok(n), lab(n);
  for (int64_t i = 0; i < n; ++i) {
    tok[i] = static_cast<int64_t>(tensor_parallel::splitmix64(2 * i) % kVocab);
    lab[i] = static_cast<int64_t>(tensor_parallel::splitmix64(2 * i + 1) % kVocab);
  }
  datasets::GPTBatch b;
  b.tokens = Tensor::from_vector_i64(tok, {kBatch, kSeq});
  b.labels = Tensor::from_vector_i64(lab, {kBatch, kSeq});
  b.loss_mask = Tensor::zeros({kBatch, kSeq}, DType::kFloat32);
  b.loss_mask.fill_(1.0f);
  return b;
}

// Peak bytes allocated during one micro-batch's forward + backward above what the model held
// before it (parameters, gradient buffer).
int64_t peak_activation_bytes(int64_t layers, RecomputeGranularity g, RecomputeMethod m, int64_t k,
                              bool llama = false, int64_t vocab = kVocab) {
  TransformerConfig c = megatron::testing::tiny_gpt_config(kH, megatron::testing::TinyDropout::kOff, layers, kHeads);
  // LLaMA-3-8B's proportions: ffn 3.5 h, 4 query heads per K/V group
  if (llama) megatron::testing::make_llama(c, 1, 224);
  c.recompute_granularity = g;
  c.recompute_method = m;
  c.recompute_num_layers = k;
  GPTModel model(c, vocab, kSeq, 5);
  const auto b = batch();
  Tensor dloss = Tensor::zeros({kBatch, kSeq}, DType::kFloat32);
  dloss.fill_(1.0f / (kBatch * kSeq));
  model.forward(b, true);  // warm-up: lazily built state (RoPE tables, scratch) is not activation memory
  model.backward(dloss);
  const int64_t before = memory_stats(DeviceType::kCPU).allocated;
  reset_peak_memory_stats(DeviceType::kCPU);
  model.forward(b, true);
  model.backward(dloss);
  return memory_stats(DeviceType::kCPU).max_allocated - before;
}

TEST(RecomputeMemory, FullUniformKeepsOnlyEachLayersInput) {
  const double T = kBatch * kSeq;
  const double per_layer_full = (16.0 * kH + 4 + kHeads) * T * 4;
  const double per_layer_recompute = kH * T * 4;
  const double tol = 0.01 * per_layer_full;
  using G = RecomputeGranularity;
  using M = RecomputeMethod;
  const double slope_none =
      (peak_activation_bytes(6, G::kNone, M::kNone, 0) - peak_activation_bytes(2, G::kNone, M::kNone, 0)) / 4.0;
  const double slope_uniform = (peak_activation_bytes(6, G::kFull, M::kUniform, 1) -
                                peak_activation_bytes(2, G::kFull, M::kUniform, 1)) / 4.0;
  EXPECT_NEAR(slope_none, per_layer_full, tol);
  EXPECT_NEAR(slope_uniform, per_layer_recompute, tol);

  // The 4-layer model: the peak per micro-batch must drop. With C what does not scale with the
  // layers (taken from the no-recomputation peak), A = per_layer_full, I = per_layer_recompute:
  //   uniform 1: the peak is the recomputation of the last layer: C + 4 I (the inputs) + A - I
  //              (that layer's other activations; its input is already counted)
  //   block 2:   layers 2 and 3 keep everything, 0 and 1 only their inputs: C + 2 A + 2 I
  // Here 0.437 and 0.625 of the no-recomputation peak (C is large relative to A in this tiny
  // model: logits, embedding and backward scratch).
  const double p4_none = static_cast<double>(peak_activation_bytes(4, G::kNone, M::kNone, 0));
  const double p4_uniform = static_cast<double>(peak_activation_bytes(4, G::kFull, M::kUniform, 1));
  const double p4_block2 = static_cast<double>(peak_activation_bytes(4, G::kFull, M::kBlock, 2));
  const double c_none = p4_none - 4 * per_layer_full;  // the part that does not scale with L
  const double expected_uniform = c_none + 3 * per_layer_recompute + per_layer_full;
  EXPECT_LT(p4_uniform, p4_none);
  EXPECT_NEAR(p4_uniform, expected_uniform, 2 * tol) << "ratio " << p4_uniform / p4_none;
  // block 2: layers 0 and 1 recomputed (input kept), layers 2 and 3 keep everything.
  EXPECT_NEAR(p4_block2, c_none + 2 * per_layer_recompute + 2 * per_layer_full, 2 * tol)
      << "ratio " << p4_block2 / p4_none;
  std::printf("GPT peak activation bytes per micro-batch, 4 layers: none %.0f, uniform 1 %.0f (ratio %.3f), block 2 %.0f "
              "(ratio %.3f)\n", p4_none, p4_uniform, p4_uniform / p4_none, p4_block2, p4_block2 / p4_none);
}

TEST(RecomputeMemory, LlamaShapedFourLayersSaveThreeLayersOfActivations) {
  // The GPU check's LLaMA-3-8B-shaped model scaled down with its proportions (ffn 3.5 h, GQA 4:1,
  // vocab 2000 = 31.25 h as 128256 / 4096 = 31.3): per layer without recomputation the layer keeps
  // x, the RMSNorm outputs (2 h), QKV (1.5 h), attention out (h), x1 (h), fc1 out (7 h) and the
  // SwiGLU output (3.5 h) = 17 h per token, plus rstd 2 and lse 4 floats. Uniform 1 on 4 layers
  // keeps 4 inputs and replays one layer: the peak drops by 3 (A - I) = 3 x (16 h + 6) T floats
  // if the peak stays in the layers' backward (it does unless the logits dominate). Tolerance as
  // above (1% of A per layer involved).
  using G = RecomputeGranularity;
  using M = RecomputeMethod;
  const double T = kBatch * kSeq;
  const double a = (17.0 * kH + 6) * T * 4, i = kH * T * 4;
  const double none = static_cast<double>(peak_activation_bytes(4, G::kNone, M::kNone, 0, true, 2000));
  const double uni = static_cast<double>(peak_activation_bytes(4, G::kFull, M::kUniform, 1, true, 2000));
  EXPECT_NEAR(none - uni, 3 * (a - i), 0.04 * a) << "none " << none << " uniform " << uni;
  std::printf("LLaMA-shaped peak activation bytes, 4 layers: none %.0f, uniform 1 %.0f (drop %.0f = %.3f x (A - I))\n",
              none, uni, none - uni, (none - uni) / (a - i));
}

}  // namespace
}  // namespace megatron
