// FP8 linear layers on the CPU (quantize-dequantize emulation) and the per-step state, against
// hand computations: operands chosen exactly representable in E4M3/E5M2 give exact products;
// non-representable ones are rounded by hand (E4M3 has 3 mantissa bits, E5M2 2, RNE, saturating
// at 448 / 57344). Recipe: scale = fp8_max / amax / 2^margin (docs/megatron-reference.md#fp8-delayed-scaling).
#include "megatron/core/fp8/fp8_linear.h"

#include <gtest/gtest.h>

#include <vector>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/transformer/transformer_config.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
#include "megatron/training/config_from_args.h"
#include "test_utils/tiny_model.h"

using namespace megatron;
using namespace megatron::fp8;

namespace {
Fp8State make_state(Fp8Format f = Fp8Format::kHybrid, bool wgrad = true, Fp8Recipe r = Fp8Recipe::kDelayed) {
  Fp8Config c;
  c.format = f;
  c.wgrad = wgrad;
  c.recipe = r;
  return Fp8State(c, Device::cpu());
}
std::vector<float> vec(const Tensor& t) { return t.to_float_vector(); }
}  // namespace

TEST(Fp8Linear, QuantizeDequantizeRoundsSaturatesAndRecordsAmax) {
  Fp8State st = make_state();
  const int base = st.register_linear("l");
  // Initial scale 1. E4M3: 0.3 -> 0.3125 (0.3 lies between 0.28125 and 0.3125, nearer the latter);
  // 1.0 exact; -500 saturates to -448; 0.0009765625 = 2^-10 is half the smallest subnormal 2^-9:
  // ties to even -> 0.
  Tensor x = Tensor::from_vector({0.3f, 1.0f, -500.0f, 0.0009765625f}, {4});
  Tensor y = quantize_dequantize_cpu(st, base + kInput, x, /*record=*/true);
  EXPECT_EQ(vec(y), (std::vector<float>{0.3125f, 1.0f, -448.0f, 0.0f}));
  EXPECT_EQ(vec(st.amax(base + kInput)), (std::vector<float>{500.0f}));
  // Grad-output role in hybrid is E5M2: 0.3 -> 0.3125 (steps of 0.0625 in [0.25, 0.5)); 0.35 -> 0.375
  // (0.35 lies between 0.3125 and 0.375, nearer 0.375); 1e5 saturates to 57344.
  Tensor g = Tensor::from_vector({0.3f, 0.35f, 1e5f}, {3});
  EXPECT_EQ(vec(quantize_dequantize_cpu(st, base + kGradOutput, g, false)),
            (std::vector<float>{0.3125f, 0.375f, 57344.0f}));
  EXPECT_EQ(vec(st.amax(base + kGradOutput)), (std::vector<float>{0.0f}));  // not recorded
}

TEST(Fp8Linear, StepUpdateUsesReducedAmaxes) {
  Fp8Config c;
  c.amax_history_len = 2;
  c.amax_compute_algo = AmaxComputeAlgo::kMax;
  Fp8State st(c, Device::cpu());
  const int base = st.register_linear("l");
  st.record_host_amax(base + kInput, 2.0f);
  st.record_host_amax(base + kInput, 3.5f);  // max within a step
  st.record_host_amax(base + kGradOutput, 0.5f);
  st.reduce_and_update(nullptr);
  EXPECT_FLOAT_EQ(st.host_scale(base + kInput), 448.0f / 3.5f);
  EXPECT_FLOAT_EQ(st.host_scale(base + kWeight), 1.0f);                 // amax 0: keeps the scale
  EXPECT_FLOAT_EQ(st.host_scale(base + kGradOutput), 57344.0f / 0.5f);  // E5M2 in hybrid
  EXPECT_FLOAT_EQ(vec(st.scale(base + kInput))[0], 128.0f);             // device copy
  EXPECT_FLOAT_EQ(vec(st.scale_inv(base + kGradOutput))[0], 0.5f / 57344.0f);
  EXPECT_EQ(vec(st.amax(base + kInput))[0], 0.0f);                      // zeroed for the next step
  // Next step: amax 1 but the history (len 2, max) still holds 3.5.
  st.record_host_amax(base + kInput, 1.0f);
  st.reduce_and_update(nullptr);
  EXPECT_FLOAT_EQ(st.host_scale(base + kInput), 128.0f);
  // Third step: 3.5 has left the window -> amax_used = max(1, 0.25) = 1.
  st.record_host_amax(base + kInput, 0.25f);
  st.reduce_and_update(nullptr);
  EXPECT_FLOAT_EQ(st.host_scale(base + kInput), 448.0f);
}

TEST(Fp8Linear, ForwardBackwardExactOnRepresentableValues) {
  Fp8State st = make_state();
  const int base = st.register_linear("l");
  // x [2, 2], w [3, 2]: all values exact in E4M3 at scale 1.
  Tensor x = Tensor::from_vector({1.0f, 2.0f, -0.5f, 4.0f}, {2, 2});
  Tensor w = Tensor::from_vector({1.0f, 0.0f, 0.5f, 0.25f, -2.0f, 3.0f}, {3, 2});
  Tensor y = Tensor::empty({2, 3}, DType::kFloat32);
  linear_forward(st, base, x, w, nullptr, y);
  // y = x w^T by hand: row0 (1,2): [1, 0.5+0.5, -2+6] = [1, 1, 4]; row1 (-0.5,4): [-0.5, -0.25+1, 1+12]
  EXPECT_EQ(vec(y), (std::vector<float>{1.0f, 1.0f, 4.0f, -0.5f, 0.75f, 13.0f}));
  EXPECT_EQ(vec(st.amax(base + kInput))[0], 4.0f);
  EXPECT_EQ(vec(st.amax(base + kWeight))[0], 3.0f);
  // dy = 0.3 everywhere: E5M2 -> 0.3125. dx = dyq w = 0.3125 * column sums of w = 0.3125*[-0.5, 3.25]
  Tensor dy = Tensor::from_vector(std::vector<float>(6, 0.3f), {2, 3});
  Tensor dx = Tensor::empty({2, 2}, DType::kFloat32);
  Tensor dw = Tensor::from_vector(std::vector<float>(6, 1.0f), {3, 2});
  linear_backward(st, base, dy, x, w, &dx, &dw, nullptr, /*accumulate=*/true);
  EXPECT_EQ(vec(dx), (std::vector<float>{-0.15625f, 1.015625f, -0.15625f, 1.015625f}));
  // dw += dyq^T x = 0.3125 * column sums of x = 0.3125 * [0.5, 6] for every output row.
  EXPECT_EQ(vec(dw), (std::vector<float>{1.15625f, 2.875f, 1.15625f, 2.875f, 1.15625f, 2.875f}));
  EXPECT_EQ(vec(st.amax(base + kGradOutput))[0], 0.3f);
}

TEST(Fp8Linear, NoFp8WgradKeepsHighPrecisionGradient) {
  Fp8State st = make_state(Fp8Format::kHybrid, /*wgrad=*/false);
  const int base = st.register_linear("l");
  Tensor x = Tensor::from_vector({1.0f, 2.0f}, {1, 2});
  Tensor w = Tensor::from_vector({1.0f, 1.0f}, {1, 2});
  Tensor dy = Tensor::from_vector({0.3f}, {1, 1});
  Tensor dw = Tensor::zeros({1, 2}, DType::kFloat32);
  linear_backward(st, base, dy, x, w, nullptr, &dw, nullptr, false);
  // dw = 0.3 * x (unquantized dy), up to fp32 rounding of 0.3 * 2 (1 ulp).
  EXPECT_FLOAT_EQ(vec(dw)[0], 0.3f);
  EXPECT_FLOAT_EQ(vec(dw)[1], 0.6f);
}

TEST(Fp8Linear, E4m3FormatQuantizesGradientsToE4m3) {
  Fp8State st = make_state(Fp8Format::kE4M3);
  const int base = st.register_linear("l");
  EXPECT_EQ(st.meta(base + kGradOutput).dtype, DType::kFloat8E4M3);
  // 0.35 in E4M3 (steps of 0.03125 in [0.25, 0.5)) -> 0.34375; in E5M2 it would be 0.375.
  Tensor g = Tensor::from_vector({0.35f}, {1});
  EXPECT_EQ(vec(quantize_dequantize_cpu(st, base + kGradOutput, g, false))[0], 0.34375f);
}

TEST(Fp8Linear, TensorwiseScalesFromTheCurrentTensor) {
  Fp8State st = make_state(Fp8Format::kHybrid, true, Fp8Recipe::kTensorwise);
  const int base = st.register_linear("l");
  Tensor x = Tensor::from_vector({2.0f, -1.0f}, {2});
  Tensor y = quantize_dequantize_cpu(st, base + kInput, x, true);
  EXPECT_FLOAT_EQ(st.host_scale(base + kInput), 224.0f);  // 448 / 2
  // 448 and -224 are exact in E4M3; dequantized with scale_inv = fl(1/224): within 1 ulp.
  EXPECT_FLOAT_EQ(vec(y)[0], 2.0f);
  EXPECT_FLOAT_EQ(vec(y)[1], -1.0f);
  st.reduce_and_update(nullptr);                          // tensorwise: the step keeps the scale
  EXPECT_FLOAT_EQ(st.host_scale(base + kInput), 224.0f);
}

TEST(Fp8Linear, CheckpointTensorsRoundTrip) {
  Fp8Config c;
  c.amax_history_len = 2;
  Fp8State a(c, Device::cpu());
  a.register_linear("decoder.layers.0.mlp.linear_fc1");
  a.record_host_amax(kInput, 7.0f);
  a.record_host_amax(kGradOutput, 0.25f);
  a.reduce_and_update(nullptr);
  a.record_host_amax(kWeight, 0.5f);  // this step's observation is not part of the saved state
  auto ts = a.checkpoint_tensors();
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[0].key, "decoder.layers.0.mlp.linear_fc1._extra_state.fp8.amax_history");
  EXPECT_EQ(ts[0].data.shape(), (Shape{2, 3}));
  // History after one update (roll by -1, slot 0 zeroed): row 0 zeros, row 1 = [7, 0, 0.25].
  EXPECT_EQ(vec(ts[0].data), (std::vector<float>{0, 0, 0, 7, 0, 0.25f}));
  EXPECT_EQ(vec(ts[1].data), (std::vector<float>{64.0f, 1.0f, 229376.0f}));
  Fp8State b(c, Device::cpu());
  b.register_linear("decoder.layers.0.mlp.linear_fc1");
  std::vector<std::string> keys;
  for (auto& t : ts) keys.push_back(t.key);
  b.restore_checkpoint_tensors(ts, keys);
  EXPECT_FLOAT_EQ(b.host_scale(kInput), 64.0f);
  EXPECT_FLOAT_EQ(vec(b.scale(kGradOutput))[0], 229376.0f);
  EXPECT_EQ(b.meta(kInput).amax_history, (std::vector<float>{0.0f, 7.0f}));
}

TEST(Fp8Linear, FlagsReachTransformerConfig) {
  using namespace megatron::training;
  std::vector<std::string> f = megatron::testing::tiny_gpt_flags("1e-3");
  f.insert(f.end(), {"--fp8-format", "e4m3", "--fp8-margin", "2", "--fp8-amax-history-len", "16",
                     "--fp8-amax-compute-algo", "max", "--no-fp8-wgrad", "--fp8-recipe", "tensorwise"});
  Arguments a = parse_args(f);
  validate_args(a);
  auto c = core_transformer_config_from_args(a);
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_EQ(c.fp8->format, Fp8Format::kE4M3);
  EXPECT_EQ(c.fp8->recipe, Fp8Recipe::kTensorwise);
  EXPECT_EQ(c.fp8->margin, 2);
  EXPECT_EQ(c.fp8->amax_history_len, 16);
  EXPECT_EQ(c.fp8->amax_compute_algo, AmaxComputeAlgo::kMax);
  EXPECT_FALSE(c.fp8->wgrad);
  Arguments none = parse_args(std::vector<std::string>(f.begin(), f.end() - 11));
  validate_args(none);
  EXPECT_FALSE(core_transformer_config_from_args(none).fp8.has_value());

  auto error_of = [&](std::vector<std::string> extra) -> std::string {
    std::vector<std::string> v(f.begin(), f.end() - 11);
    v.insert(v.end(), extra.begin(), extra.end());
    try {
      Arguments x = parse_args(v);
      validate_args(x);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({"--fp8-format", "e5m2"}).find("--fp8-format"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}).find("--fp8-recipe"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-margin", "-1"}).find("--fp8-margin"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-amax-history-len", "0"}).find("--fp8-amax-history-len"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-amax-compute-algo", "mean"}).find("--fp8-amax-compute-algo"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-param-gather"}).find("--use-distributed-optimizer"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-param-gather", "--use-distributed-optimizer"}).find("--fp8-format"), std::string::npos);
  EXPECT_EQ(error_of({"--fp8-format", "hybrid", "--fp8-param-gather", "--use-distributed-optimizer"}), "");
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather",
                      "--use-distributed-optimizer"})
                .find("--fp8-recipe delayed"),
            std::string::npos);
}
