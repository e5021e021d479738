// Llama-3.1 RoPE frequency scaling (--use-rope-scaling) and position interpolation
// (--rotary-seq-len-interpolation-factor) on the CPU backend, against the float64 reference of
// tests/reference/model/gen_rope_scaling_reference.py (Hugging Face's _compute_llama3_parameters
// rule, the same as Megatron-Core's RotaryEmbedding._apply_scaling). rope_inv_freq / rope_angle
// (megatron/core/ops/rope_freq.h) are the functions the CUDA kernels call too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "megatron/core/ops/ops.h"
#include "megatron/core/ops/rope_freq.h"

namespace megatron {
namespace {

using nlohmann::json;

const json& ref() {
  static const json j = [] {
    std::ifstream in(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/model/data/rope_scaling.json");
    return json::parse(in);
  }();
  return j;
}

TEST(RopeScaling, InvFreqMatchesLlama31Reference) {
  // fp32 (powf, one division, then at most 6 float ops in the medium band) vs the float64
  // reference: each float op adds <= 2^-24 relative; powf/1/x about 1 ulp; the smooth factor
  // (original/wavelen - 1)/3 carries that error times at most ~4/3, so the result stays within a few
  // 1e-7 relative. 1e-6 bounds it. The generator prints each wavelen's distance to the band edges
  // (>= 0.3%), far more than fp32 error, so no entry can change band.
  constexpr double kRelTol = 1e-6;
  ASSERT_EQ(ref()["inv_freq"].size(), 3u);
  for (const auto& c : ref()["inv_freq"]) {
    const float base = c["base"].get<float>();
    const int rot = c["rot"].get<int>();
    ops::RopeScaling sc;
    sc.enabled = true;
    sc.factor = c["factor"].get<float>();
    const ops::RopeScaling off;
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < rot / 2; ++i) {
      const double want = c["scaled"][i].get<double>(), plain = c["unscaled"][i].get<double>();
      const float got = ops::rope_inv_freq(base, i, rot, sc);
      EXPECT_LE(std::abs(got - want) / want, kRelTol) << "base " << base << " rot " << rot << " i " << i;
      EXPECT_LE(std::abs(ops::rope_inv_freq(base, i, rot, off) - plain) / plain, kRelTol) << i;
      // Scaling off: exactly the expression the kernels used before scaling existed.
      EXPECT_EQ(ops::rope_inv_freq(base, i, rot, off),
                1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rot)));
      const std::string band = c["bands"][i].get<std::string>();
      bands[band == "high" ? 0 : band == "medium" ? 1 : 2]++;
    }
    // Every case exercises all three bands (unchanged, interpolated, divided by the factor).
    EXPECT_GT(bands[0], 0);
    EXPECT_GT(bands[1], 0);
    EXPECT_GT(bands[2], 0);
  }
}

TEST(RopeScaling, PositionScaleIsFloatOfTheReciprocal) {
  // Megatron: seq *= 1 / seq_len_interpolation_factor (a Python double, applied to a float32
  // tensor). Hand values: 1/4 = 0.25 exactly; float(1/3) = 0.3333333432674408.
  EXPECT_EQ(ops::rope_position_scale(4.0), 0.25f);
  EXPECT_EQ(ops::rope_position_scale(3.0), static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(ops::rope_position_scale(0.0), 1.0f);  // flag not given
  EXPECT_EQ(ops::rope_angle(7.0f, 1.0f, 0.123f), 7.0f * 0.123f);  // no interpolation: unchanged
}

/// Runs rope_forward for one reference case; returns y [s, 1, n, d].
Tensor run_case(const json& c, bool scaling, bool interp, ops::RopeParams* used = nullptr) {
  const auto positions = c["positions"].get<std::vector<int64_t>>();
  const int64_t s = static_cast<int64_t>(positions.size()), n = c["n"].get<int64_t>(), d = c["d"].get<int64_t>();
  std::vector<float> xv;
  for (const auto& v : c["x"]) xv.push_back(static_cast<float>(v.get<double>()));
  Tensor x = Tensor::from_vector(xv, {s, 1, n, d}), y = Tensor::zeros({s, 1, n, d}, DType::kFloat32);
  Tensor pos = Tensor::from_vector_i64(positions, {s, 1});
  ops::RopeParams rope;
  rope.enabled = true;
  rope.base = c["base"].get<float>();
  if (scaling && !c["factor"].is_null()) {
    rope.scaling.enabled = true;
    rope.scaling.factor = c["factor"].get<float>();
  }
  if (interp && !c["interp"].is_null()) rope.position_scale = ops::rope_position_scale(c["interp"].get<double>());
  ops::rope_forward(x, rope, &pos, y);
  if (used) *used = rope;
  return y;
}

/// Largest |y - ref| / tol(pos) over the case; tol(pos) = 1e-5 + 1e-6 * (pos / F) * max|x|: the
/// fp32 angle (pos/F) * inv_freq carries <= ~1e-6 relative error (inv_freq above, plus two
/// roundings), i.e. an absolute angle error that grows with the position, times |x|; 1e-5 covers
/// the fp32 cos/sin and products at small angles.
double worst_ratio(const Tensor& y, const json& c) {
  const auto positions = c["positions"].get<std::vector<int64_t>>();
  const int64_t n = c["n"].get<int64_t>(), d = c["d"].get<int64_t>();
  const double F = c["interp"].is_null() ? 1.0 : c["interp"].get<double>();
  double xmax = 0;
  for (const auto& v : c["x"]) xmax = std::max(xmax, std::abs(v.get<double>()));
  double worst = 0;
  for (size_t si = 0; si < positions.size(); ++si) {
    const double tol = 1e-5 + 1e-6 * (static_cast<double>(positions[si]) / F) * xmax;
    for (int64_t e = 0; e < n * d; ++e) {
      const int64_t idx = static_cast<int64_t>(si) * n * d + e;
      worst = std::max(worst, std::abs(y.data<float>()[idx] - c["y"][idx].get<double>()) / tol);
    }
  }
  return worst;
}

TEST(RopeScaling, ForwardMatchesReference) {
  ASSERT_EQ(ref()["forward"].size(), 4u);
  for (const auto& c : ref()["forward"]) {
    const std::string name = c["name"].get<std::string>();
    Tensor y = run_case(c, true, true);
    EXPECT_LE(worst_ratio(y, c), 1.0) << name;
    if (name != "plain") {
      // The reference really depends on the variant: the plain rotation misses it by far.
      EXPECT_GT(worst_ratio(run_case(c, false, false), c), 100.0) << name;
    }
  }
}

TEST(RopeScaling, BackwardInvertsAndQkvPathAgrees) {
  // Exact algebra: rope_backward applies the inverse rotation with the same angles, so it
  // returns x up to fp32 rounding (|x| <~ 4, two rotations: 1e-5 absolute). The fused QKV split
  // path must give the same q bits as rope_forward (same rotate() and angles).
  const json& c = ref()["forward"][2];  // scaled + interpolated
  ASSERT_EQ(c["name"].get<std::string>(), "scaled_interpolated");
  ops::RopeParams rope;
  Tensor y = run_case(c, true, true, &rope);
  const auto positions = c["positions"].get<std::vector<int64_t>>();
  const int64_t s = static_cast<int64_t>(positions.size()), n = c["n"].get<int64_t>(), d = c["d"].get<int64_t>();
  Tensor pos = Tensor::from_vector_i64(positions, {s, 1});
  Tensor back = Tensor::zeros({s, 1, n, d}, DType::kFloat32);
  ops::rope_backward(y, rope, &pos, back);
  for (int64_t i = 0; i < s * n * d; ++i)
    ASSERT_NEAR(back.data<float>()[i], c["x"][i].get<double>(), 1e-5) << i;
  // qkv rows [q_0, q_1, k, v] with one query group of two heads.
  std::vector<float> qkv;
  for (int64_t si = 0; si < s; ++si) {
    for (int64_t h = 0; h < n + 2; ++h)
      for (int64_t e = 0; e < d; ++e)
        qkv.push_back(static_cast<float>(c["x"][si * n * d + std::min<int64_t>(h, n - 1) * d + e].get<double>()));
  }
  Tensor tqkv = Tensor::from_vector(qkv, {s, 1, (n + 2) * d});
  Tensor q = Tensor::zeros({s, 1, n, d}, DType::kFloat32), k = Tensor::zeros({s, 1, 1, d}, DType::kFloat32),
         v = Tensor::zeros({s, 1, 1, d}, DType::kFloat32);
  ops::qkv_split_rope_forward(tqkv, n, 1, rope, &pos, q, k, v);
  for (int64_t i = 0; i < s * n * d; ++i) ASSERT_EQ(q.data<float>()[i], y.data<float>()[i]) << i;
}

}  // namespace
}  // namespace megatron
