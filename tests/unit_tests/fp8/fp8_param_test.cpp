// FP8 primary weights (--fp8-param-gather; docs/fp8.md "FP8 parameters") on one rank:
// quantize_param_shard of two uneven shards + post_all_gather_processing make the linear's weight
// operand; it survives the step boundary and MEGATRON_FP8_WEIGHT_CACHE=0 (it is the parameter, not a
// cache) and keeps the scale_inv it was cast with until the next cast. Expected values by hand on
// E4M3: 0.5, -1.25, 2, -0.0625, 7, -3.5 are exact; bf16(0.3) = 0.30078125 rounds to 0.3125 (the
// E4M3 neighbours are 0.28125 and 0.3125); 500 saturates to 448; the weight amax is 500.
#include <gtest/gtest.h>

#include <vector>

#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/fp8/fp8_param.h"
#include "megatron/core/fp8/fp8_state.h"

using namespace megatron;
using namespace megatron::fp8;

namespace {
Fp8Config cfg2() {
  Fp8Config c;
  c.amax_history_len = 2;
  c.amax_compute_algo = AmaxComputeAlgo::kMax;
  c.param_gather = true;
  return c;
}

std::vector<float> forward(Fp8State& st, int base, const Tensor& w) {
  Tensor x = Tensor::from_vector({1.0f, 1.0f, 0.0f, 0.0f}, {1, 4});
  Tensor y = Tensor::empty({1, 2}, DType::kFloat32);
  linear_forward(st, base, x, w, nullptr, y);
  return y.to_float_vector();
}
}  // namespace

TEST(Fp8ParamGather, ShardCastsGatherIntoTheLinearsWeightOperand) {
  Fp8State st(cfg2(), Device::cpu());
  const int b = st.register_linear("l");
  Tensor w = Tensor::from_vector({0.5f, -1.25f, 0.3f, 500.0f, 2.0f, -0.0625f, 7.0f, -3.5f}, {2, 4}).to(DType::kBFloat16);
  Tensor wq = Tensor::zeros({2, 4}, DType::kFloat8E4M3);
  // Two "ranks": elements [0, 3) and [3, 8) (the second crosses the row boundary).
  Tensor wf = w.view({8}), qf = wq.view({8});
  Tensor q0 = qf.flat_slice(0, {3}), q1 = qf.flat_slice(3, {5});
  quantize_param_shard(st, b, wf.flat_slice(0, {3}), q0);
  quantize_param_shard(st, b, wf.flat_slice(3, {5}), q1);
  EXPECT_EQ(st.amax(b + kWeight).to_float_vector()[0], 500.0f) << "max over the shards";
  post_all_gather_processing(st, b, wq);
  const auto& c = st.weight_cache(b);
  ASSERT_TRUE(c.primary && c.valid);
  EXPECT_EQ(c.q.to_float_vector(), (std::vector<float>{0.5f, -1.25f, 0.3125f, 448.0f, 2.0f, -0.0625f, 7.0f, -3.5f}));
  // y = x W^T with x = [1, 1, 0, 0]: row 0: 0.5 - 1.25, row 1: 2 - 0.0625.
  EXPECT_EQ(forward(st, b, w), (std::vector<float>{-0.75f, 1.9375f}));
  EXPECT_EQ(st.weight_casts(), 0) << "no weight quantization in the GEMMs";

  // Step boundary: the recorded weight amax enters the history, the scale becomes 448 / 500; the
  // FP8 parameter stays the operand with the scale_inv it was cast with (1), until the next cast.
  st.reduce_and_update(nullptr);
  EXPECT_EQ(st.meta(b + kWeight).amax_history, (std::vector<float>{0.0f, 500.0f}));
  EXPECT_EQ(st.meta(b + kWeight).scale, 448.0f / 500.0f);
  EXPECT_TRUE(st.weight_cache(b).valid);
  EXPECT_EQ(st.weight_scale_inv(b).to_float_vector()[0], 1.0f);
  EXPECT_EQ(st.scale_inv(b + kWeight).to_float_vector()[0], 1.0f / (448.0f / 500.0f));  // scale_inv = 1 / scale
  st.set_weight_cache_enabled(false);  // MEGATRON_FP8_WEIGHT_CACHE=0 does not drop the parameter
  EXPECT_TRUE(st.weight_cache(b).valid);
  EXPECT_EQ(forward(st, b, w), (std::vector<float>{-0.75f, 1.9375f}));
  EXPECT_EQ(st.weight_casts(), 0);

  // The next cast uses the new scale: 500 * 0.896 = 448 (exact in E4M3), dequantized with the new
  // scale_inv; 0.5 * 0.896 = 0.448 -> E4M3 0.4375 (neighbours 0.4375, 0.46875).
  quantize_param_shard(st, b, wf, qf);
  post_all_gather_processing(st, b, wq);
  EXPECT_EQ(st.weight_cache(b).param_scale_inv, st.meta(b + kWeight).scale_inv);
  EXPECT_EQ(st.weight_scale_inv(b).to_float_vector()[0], st.meta(b + kWeight).scale_inv);
  const std::vector<float> q = st.weight_cache(b).q.to_float_vector();
  const float si = st.meta(b + kWeight).scale_inv;
  EXPECT_EQ(q[3], 448.0f * si);
  EXPECT_EQ(q[0], 0.4375f * si);
}
