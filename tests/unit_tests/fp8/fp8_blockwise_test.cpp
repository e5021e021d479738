// The blockwise FP8 recipe (--fp8-recipe blockwise: Transformer Engine's Float8BlockScaling,
// docs/fp8.md "Blockwise recipe") on the CPU, against hand computations from the specs:
//   * E4M3 (OCP FP8): bias 7, 3 mantissa bits, max 448 (0x7E), no infinity, subnormals m * 2^-9;
//     E5M2: bias 15, 2 mantissa bits, max 57344. Casts round to nearest even and saturate.
//   * TE's compute_scale_from_amax (epsilon 0): scale = fp8_max / amax (1 if amax is 0; FLT_MAX if
//     the division overflows), rounded down to a power of 2 by default (power_2_scale); the stored
//     factor is 1 / scale. Blocks: 1 x 128 tiles for inputs and gradients, 128 x 128 for weights.
//   * The wgrad GEMM reads both operands quantized in 128 x 1 tiles along the tokens (TE's
//     columnwise copies), the dgrad and forward GEMMs the 1 x 128 row tiles.
// With power-of-2 scales every product v * scale is exact, so each expected value below is the
// RNE rounding of an exactly known number, computed by hand in the comments.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
#include "megatron/training/config_from_args.h"
#include "test_utils/tiny_model.h"

using namespace megatron;
using namespace megatron::fp8;

namespace {
std::vector<float> vec(const Tensor& t) { return t.to_float_vector(); }
uint8_t byte_at(const Tensor& q, int64_t i) { return static_cast<const uint8_t*>(q.data_ptr())[i]; }

Fp8State blockwise_state(Fp8Format f = Fp8Format::kHybrid, bool pow2 = true) {
  Fp8Config c;
  c.format = f;
  c.recipe = Fp8Recipe::kBlockwise;
  c.block_pow2_scales = pow2;
  return Fp8State(c, Device::cpu());
}

// x [2, 130]: row 0 tile 0 holds the rounding cases, row 0 tile 1 a second scale, row 1 tile 0
// is all zero, row 1 tile 1 needs a scale below 1.
Tensor rows_case() {
  std::vector<float> v(2 * 130, 0.0f);
  v[0] = 3.0f;                       // amax of tile (0, 0): scale 448/3 = 149.3 -> 2^7
  v[1] = 0.3f;                       // 0.3 * 128 = 38.4, E4M3 step 4 in [32, 64): 40 -> 0.3125
  v[2] = 17.0f / 128;                // 17: tie between 16 (mantissa 000) and 18 (001): even -> 16
  v[3] = 19.0f / 128;                // 19: tie between 18 (001) and 20 (010): even -> 20
  v[4] = 3.0f * std::ldexp(1.0f, -17);  // 1.5 * 2^-9: subnormal tie between 2^-9 (odd) and 2^-8: 2^-8
  v[5] = -1.0f;                      // -128 exact
  v[128] = 0.5f;                     // tile (0, 1): 448/0.5 = 896 -> 2^9; 256 exact
  v[129] = -0.25f;                   // -128 exact
  v[130 + 128] = 1000.0f;            // tile (1, 1): 448/1000 = 0.448 -> 2^-2; 250 -> 256 (step 16) -> 1024
  v[130 + 129] = -7.0f;              // -1.75 exact
  return Tensor::from_vector(v, {2, 130});
}
}  // namespace

TEST(Fp8Blockwise, ParseRecipeAndFlags) {
  EXPECT_EQ(parse_fp8_recipe("blockwise"), Fp8Recipe::kBlockwise);
  EXPECT_THROW(parse_fp8_recipe("mxfp8"), UserError);
  std::vector<std::string> f = megatron::testing::tiny_gpt_flags("1e-3");
  f.insert(f.end(), {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"});
  training::Arguments a = training::parse_args(f);
  training::validate_args(a);
  const auto c = training::fp8_config_from_args(a);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->recipe, Fp8Recipe::kBlockwise);
  EXPECT_TRUE(c->block_pow2_scales);  // TE's default power_2_scale
  // Megatron passes --fp8-format to Float8BlockScaling: hybrid keeps E5M2 gradients.
  EXPECT_EQ(fp8_dtype_for(c->format, true), DType::kFloat8E5M2);
}

TEST(Fp8Blockwise, RowTilesHandComputed) {
  Tensor x = rows_case();
  Tensor q = Tensor::empty({2, 130}, DType::kFloat8E4M3), s = Tensor::empty({2, 4}, DType::kFloat32);
  ops::fp8_block_quantize(x, false, true, &q, &s, nullptr, nullptr);
  // scale_inv [ceil(130/128), round4(2)] = [2, 4], entry [col tile][row]; padding 0.
  EXPECT_EQ(vec(s), (std::vector<float>{1.0f / 128, 1.0f, 0, 0, 1.0f / 512, 4.0f, 0, 0}));
  EXPECT_EQ(byte_at(q, 0), 0x7C);  // 384 = 1.5 * 2^8: sign 0, exponent 15, mantissa 100
  EXPECT_EQ(byte_at(q, 5), 0xF0);  // -128 = -1.0 * 2^7: 1 1110 000
  Fp8State st = blockwise_state(Fp8Format::kE4M3);
  const int base = st.register_linear("l");
  const std::vector<float> y = vec(block_quantize_dequantize_cpu(st, base + kInput, x, false));
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], 0.3125f);
  EXPECT_EQ(y[2], 0.125f);
  EXPECT_EQ(y[3], 0.15625f);
  EXPECT_EQ(y[4], std::ldexp(1.0f, -15));
  EXPECT_EQ(y[5], -1.0f);
  EXPECT_EQ(y[6], 0.0f);
  EXPECT_EQ(y[128], 0.5f);
  EXPECT_EQ(y[129], -0.25f);
  EXPECT_EQ(y[130], 0.0f);
  EXPECT_EQ(y[130 + 128], 1024.0f);
  EXPECT_EQ(y[130 + 129], -7.0f);
  // The blockwise recipe records no amax.
  EXPECT_EQ(vec(st.amax(base + kInput)), (std::vector<float>{0.0f}));
}

TEST(Fp8Blockwise, Fp32ScalesAndSaturation) {
  // NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1: scale = 448 / 3 as a float, not rounded to 2^7; the
  // amax element lands on 448 (3 * 149.33333 = 447.99998 in float, which rounds to E4M3 448).
  Tensor x = rows_case();
  Tensor q = Tensor::empty({2, 130}, DType::kFloat8E4M3), s = Tensor::empty({2, 4}, DType::kFloat32);
  ops::fp8_block_quantize(x, false, false, &q, &s, nullptr, nullptr);
  const float sc = 448.0f / 3.0f;
  EXPECT_EQ(vec(s)[0], 1.0f / sc);
  EXPECT_EQ(byte_at(q, 0), 0x7E);  // 448 = 1.75 * 2^8
  // The casts themselves saturate (__NV_SATFINITE): beyond 448 (also the would-be tie 464) -> 448.
  EXPECT_EQ(float_to_e4m3_bits(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3_bits(-1e9f), 0xFE);
  EXPECT_EQ(float_to_e4m3_bits(440.0f), 0x7E);  // tie between 416 (101) and 448 (110): even -> 448
  EXPECT_EQ(float_to_e4m3_bits(424.0f), 0x7D);  // nearer 416
}

TEST(Fp8Blockwise, ScaleEdgeCases) {
  // An amax so small that 448 / amax overflows: scale FLT_MAX, rounded down to 2^127.
  Tensor x = Tensor::from_vector({1e-40f, 0.0f}, {1, 2});
  Tensor q = Tensor::empty({1, 2}, DType::kFloat8E4M3), s = Tensor::empty({1, 4}, DType::kFloat32);
  ops::fp8_block_quantize(x, false, true, &q, &s, nullptr, nullptr);
  EXPECT_EQ(vec(s)[0], std::ldexp(1.0f, -127));
  // Without the power-of-2 rounding the scale is FLT_MAX itself.
  ops::fp8_block_quantize(x, false, false, &q, &s, nullptr, nullptr);
  EXPECT_EQ(vec(s)[0], 1.0f / FLT_MAX);
}

TEST(Fp8Blockwise, ColumnTilesOfTheTranspose) {
  // x [130, 3]: the 128 x 1 tiles of column 0 are rows 0..127 (amax 3 -> 2^7) and 128..129
  // (amax 0.5 -> 2^9); column 1 is all zero (scale 1); column 2 holds 1000 (2^-2).
  std::vector<float> v(130 * 3, 0.0f);
  v[0] = 3.0f;
  v[3 * 1] = 0.3f;
  v[3 * 129] = 0.5f;
  v[3 * 5 + 2] = 1000.0f;
  Tensor x = Tensor::from_vector(v, {130, 3});
  Tensor qt = Tensor::empty({3, 130}, DType::kFloat8E4M3), st = Tensor::empty({2, 4}, DType::kFloat32);
  ops::fp8_block_quantize(x, false, true, nullptr, nullptr, &qt, &st);
  // s_t [ceil(130/128), round4(3)], entry [row tile][column].
  EXPECT_EQ(vec(st), (std::vector<float>{1.0f / 128, 1.0f, 4.0f, 0, 1.0f / 512, 1.0f, 1.0f, 0}));
  EXPECT_EQ(byte_at(qt, 0), 0x7C);  // x[0][0] * 128 = 384, stored at q_t[0][0]
  Fp8State state = blockwise_state(Fp8Format::kE4M3);
  const int base = state.register_linear("l");
  const std::vector<float> y = vec(block_quantize_dequantize_cpu(state, base + kInput, x, /*columnwise=*/true));
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[3], 0.3125f);
  EXPECT_EQ(y[3 * 129], 0.5f);
  EXPECT_EQ(y[3 * 5 + 2], 1024.0f);
}

TEST(Fp8Blockwise, WeightBlocks128x128AndTranspose) {
  // W [130, 132]: blocks (0,0) amax 2 -> 448/2 = 224 -> 2^7; (0,1) amax 0.01 -> 44800 -> 2^15;
  // (1,0) zero -> 1; (1,1) amax 448 -> 1.
  std::vector<float> v(130 * 132, 0.0f);
  v[5 * 132 + 7] = 2.0f;
  v[0] = 0.3f;                   // 38.4 -> 40 -> 0.3125
  v[3 * 132 + 130] = -0.01f;     // -327.68 -> -320 (step 32 in [256, 512)) -> -0.009765625
  v[129 * 132 + 131] = 448.0f;
  Tensor w = Tensor::from_vector(v, {130, 132});
  Tensor q = Tensor::empty({130, 132}, DType::kFloat8E4M3), s = Tensor::empty({2, 4}, DType::kFloat32);
  Tensor qt = Tensor::empty({132, 130}, DType::kFloat8E4M3), st = Tensor::empty({2, 4}, DType::kFloat32);
  ops::fp8_block_quantize(w, true, true, &q, &s, &qt, &st);
  EXPECT_EQ(vec(s), (std::vector<float>{1.0f / 128, 1.0f / 32768, 0, 0, 1.0f, 1.0f, 0, 0}));
  EXPECT_EQ(vec(st), (std::vector<float>{1.0f / 128, 1.0f, 0, 0, 1.0f / 32768, 1.0f, 0, 0}));
  int64_t bad = 0;
  for (int64_t r = 0; r < 130; ++r)
    for (int64_t c = 0; c < 132; ++c) bad += byte_at(q, r * 132 + c) != byte_at(qt, c * 130 + r);
  EXPECT_EQ(bad, 0) << "128 x 128 blocks: q_t is q transposed";
  Fp8State state = blockwise_state(Fp8Format::kE4M3);
  const int base = state.register_linear("l");
  const std::vector<float> y = vec(block_quantize_dequantize_cpu(state, base + kWeight, w, false));
  EXPECT_EQ(y[0], 0.3125f);
  EXPECT_EQ(y[5 * 132 + 7], 2.0f);
  EXPECT_EQ(y[3 * 132 + 130], -0.009765625f);
  EXPECT_EQ(y[129 * 132 + 131], 448.0f);
}

TEST(Fp8Blockwise, E5M2GradientsInHybrid) {
  // Grad-output role with hybrid: E5M2, fp8_max 57344: amax 3 -> 19114.7 -> 2^14;
  // 0.3 * 16384 = 4915.2, E5M2 step 1024 in [4096, 8192): 5120 -> 0.3125.
  Fp8State st = blockwise_state(Fp8Format::kHybrid);
  const int base = st.register_linear("l");
  ASSERT_EQ(st.dtype(base + kGradOutput), DType::kFloat8E5M2);
  Tensor g = Tensor::from_vector({3.0f, 0.3f}, {1, 2});
  EXPECT_EQ(vec(block_quantize_dequantize_cpu(st, base + kGradOutput, g, false)), (std::vector<float>{3.0f, 0.3125f}));
}

TEST(Fp8Blockwise, GemmOfRepresentableOperandsIsExact) {
  // a [2, 256] with entries in {-2..2} (tile amax 2: scale 2^7, every value exact in E4M3), b [3, 256]
  // in {-0.5, 0, 0.5} (block amax 0.5: 2^9): the block-scaled GEMM equals the exact product.
  std::vector<float> av(2 * 256), bv(3 * 256), c0(6);
  for (int i = 0; i < 512; ++i) av[i] = static_cast<float>((i * 7 + 3) % 5 - 2);
  for (int i = 0; i < 768; ++i) bv[i] = 0.5f * static_cast<float>((i * 11 + 1) % 3 - 1);
  for (int i = 0; i < 6; ++i) c0[i] = 0.25f * i;
  Tensor a = Tensor::from_vector(av, {2, 256}), b = Tensor::from_vector(bv, {3, 256});
  Tensor aq = Tensor::empty({2, 256}, DType::kFloat8E4M3), as = Tensor::empty({2, 4}, DType::kFloat32);
  Tensor bq = Tensor::empty({3, 256}, DType::kFloat8E4M3), bs = Tensor::empty({1, 4}, DType::kFloat32);
  ops::fp8_block_quantize(a, false, true, &aq, &as, nullptr, nullptr);
  ops::fp8_block_quantize(b, true, true, &bq, &bs, nullptr, nullptr);
  Tensor c = Tensor::from_vector(c0, {2, 3});
  ops::fp8_block_gemm_tn(aq, as, false, bq, bs, true, c, 1.0f);
  std::vector<float> want(6);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double sum = c0[i * 3 + j];
      for (int k = 0; k < 256; ++k) sum += (double)av[i * 256 + k] * bv[j * 256 + k];
      want[i * 3 + j] = static_cast<float>(sum);  // small multiples of 0.25: exact in fp32
    }
  EXPECT_EQ(vec(c), want);
}

TEST(Fp8Blockwise, LinearUsesRowTilesForDgradAndColumnTilesForWgrad) {
  // dy [2 tokens, 2 out] = [[448, 2^-10], [0, 2^-10]], E4M3 gradients (--fp8-format e4m3).
  // Row tiles (dgrad): row 0 has amax 448 -> scale 1, and 2^-10 is half the smallest subnormal
  // 2^-9 -> ties to 0; row 1 (amax 2^-10 -> scale 2^18) keeps it. Column tiles (wgrad): column 1
  // is [2^-10, 2^-10] -> kept in both tokens. With x = w = I:
  //   dx = dy~row @ w = [[448, 0], [0, 2^-10]],  dw = dy~col^T @ x = [[448, 0], [2^-10, 2^-10]].
  Fp8State st = blockwise_state(Fp8Format::kE4M3);
  const int base = st.register_linear("l");
  const float t = std::ldexp(1.0f, -10);
  Tensor x = Tensor::from_vector({1, 0, 0, 1}, {2, 2}), w = Tensor::from_vector({1, 0, 0, 1}, {2, 2});
  Tensor dy = Tensor::from_vector({448.0f, t, 0.0f, t}, {2, 2});
  Tensor y = Tensor::empty({2, 2}, DType::kFloat32);
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(vec(y), (std::vector<float>{1, 0, 0, 1}));
  Tensor dx = Tensor::empty({2, 2}, DType::kFloat32), dw = Tensor::zeros({2, 2}, DType::kFloat32);
  linear_backward(st, base, dy, x, w, &dx, &dw, nullptr, /*accumulate=*/true);
  EXPECT_EQ(vec(dx), (std::vector<float>{448.0f, 0.0f, 0.0f, t}));
  EXPECT_EQ(vec(dw), (std::vector<float>{448.0f, 0.0f, t, t}));
  // Nothing to record or update: the step boundary leaves the (unused) scales at 1.
  st.reduce_and_update(nullptr);
  EXPECT_EQ(st.host_scale(base + kInput), 1.0f);
}
