// Delayed-scaling recipe against hand computations of Transformer Engine's rules
// (docs/megatron-reference.md#fp8-delayed-scaling): scale = fp8_max / amax / 2^margin; history rolled by -1 with
// slot 0 zeroed; "max" takes the max over the history, "most_recent" slot 0.
#include "megatron/core/fp8/fp8_recipe.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace megatron;
using namespace megatron::fp8;

TEST(Fp8Recipe, MostRecentScaleFromLastAmax) {
  Fp8Config cfg;  // defaults: history 1, most_recent, margin 0
  Fp8TensorMeta m(1, DType::kFloat8E4M3);
  m.record_amax(2.0f);
  m.update(cfg);
  EXPECT_FLOAT_EQ(m.scale, 448.0f / 2.0f);   // 224
  EXPECT_FLOAT_EQ(m.scale_inv, 1.0f / 224.0f);
  EXPECT_EQ(m.amax_history[0], 0.0f);        // zeroed for the next step
  // zero amax (e.g. an all-zero tensor) keeps the previous scale
  m.update(cfg);
  EXPECT_FLOAT_EQ(m.scale, 224.0f);
}

TEST(Fp8Recipe, MaxOverHistoryWithMarginAndRoll) {
  Fp8Config cfg;
  cfg.amax_history_len = 4;
  cfg.amax_compute_algo = AmaxComputeAlgo::kMax;
  cfg.margin = 1;
  Fp8TensorMeta m(4, DType::kFloat8E5M2);
  // step 1: amax 8 -> history [8,0,0,0] -> used 8; scale = 57344/8/2 = 3584; roll -> [0,0,0,8]
  m.record_amax(8.0f);
  m.update(cfg);
  EXPECT_FLOAT_EQ(m.scale, 3584.0f);
  EXPECT_EQ(m.amax_history, (std::vector<float>{0, 0, 0, 8}));
  // step 2: amax 2 -> [2,0,0,8] -> used max 8 -> same scale; roll -> [0,0,8,2]
  m.record_amax(2.0f);
  m.update(cfg);
  EXPECT_FLOAT_EQ(m.scale, 3584.0f);
  EXPECT_EQ(m.amax_history, (std::vector<float>{0, 0, 8, 2}));
  // step 3: [1,0,8,2] used 8, roll -> [0,8,2,1]
  // step 4: [1,8,2,1] used 8, roll -> [8,2,1,1], slot 0 zeroed -> [0,2,1,1] (the 8 leaves)
  m.record_amax(1.0f); m.update(cfg);
  m.record_amax(1.0f); m.update(cfg);
  EXPECT_EQ(m.amax_history, (std::vector<float>{0, 2, 1, 1}));
  EXPECT_FLOAT_EQ(m.scale, 3584.0f);
  m.record_amax(1.0f); m.update(cfg);  // [1,2,1,1] -> used 2 -> 57344/2/2 = 14336
  EXPECT_FLOAT_EQ(m.scale, 14336.0f);
}

TEST(Fp8Recipe, NonFiniteAmaxKeepsScale) {
  Fp8Config cfg;
  Fp8TensorMeta m(1, DType::kFloat8E4M3);
  m.record_amax(4.0f);
  m.update(cfg);
  EXPECT_FLOAT_EQ(m.scale, 112.0f);
  m.record_amax(INFINITY);
  m.update(cfg);
  EXPECT_FLOAT_EQ(m.scale, 112.0f);
  m.record_amax(NAN);
  m.update(cfg);
  EXPECT_FLOAT_EQ(m.scale, 112.0f);
}

TEST(Fp8Recipe, QuantizeDequantizeRoundTrip) {
  Fp8TensorMeta m(1, DType::kFloat8E4M3);
  m.scale = 2.0f;
  m.scale_inv = 0.5f;
  Tensor x = Tensor::from_vector({0.5f, -1.25f, 300.0f, 0.0f}, {4});
  Tensor q = Tensor::empty({4}, DType::kFloat8E4M3);
  float amax = quantize_cpu(x, m, q);
  EXPECT_EQ(amax, 300.0f);
  Tensor y = Tensor::empty({4}, DType::kFloat32);
  dequantize_cpu(q, m.scale_inv, y);
  // 0.5*2=1 -> 1 exactly; -2.5 exact in E4M3; 600 saturates to 448 -> 224; 0 -> 0
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{0.5f, -1.25f, 224.0f, 0.0f}));
}

TEST(Fp8Recipe, FormatsAndFlags) {
  EXPECT_EQ(fp8_dtype_for(Fp8Format::kHybrid, true), DType::kFloat8E5M2);
  EXPECT_EQ(fp8_dtype_for(Fp8Format::kHybrid, false), DType::kFloat8E4M3);
  EXPECT_EQ(fp8_dtype_for(Fp8Format::kE4M3, true), DType::kFloat8E4M3);
  EXPECT_THROW(parse_fp8_format("e5m2"), UserError);
  EXPECT_THROW(parse_fp8_recipe("mxfp8"), UserError);
}
