// The multi-tensor, fused, FP8 and MoE ops of the op table (megatron/core/ops/op_table.h), CPU
// reference: each against an independent computation (fp64 loops written here, or the defining
// invariant: a multi-tensor op equals its per-tensor op, a scaled Adam equals Adam on the
// pre-scaled gradient, a "composes when not fused" op equals its documented composition, the
// grouped GEMM equals the per-expert loop bit for bit).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>

#include "megatron/core/ops/grouped_gemm.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"

namespace megatron {
namespace {

Tensor randn(const Shape& s, float stddev, uint32_t seed, DType dt = DType::kFloat32) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  Tensor t = Tensor::from_vector(v, s);
  return dt == DType::kFloat32 ? t : t.to(dt);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(MultiTensorOps, ReductionsEqualTheSumOfPerTensorResults) {
  // Sizes on both sides of the parallel threshold (32768) and an empty tensor.
  std::vector<Tensor> xs = {randn({7}, 1.0f, 1), randn({40000}, 0.5f, 2), randn({0}, 1.0f, 3),
                            randn({3, 5}, 2.0f, 4, DType::kBFloat16)};
  xs[1].data<float>()[17] = 0.0f;
  double s = 0.0, ref = 0.0;
  int64_t z = 0;
  for (const auto& x : xs) {
    s += ops::sum_of_squares(x);
    z += ops::count_zeros(x);
    for (float v : x.to_float_vector()) ref += static_cast<double>(v) * v;  // fp64, sequential
  }
  EXPECT_EQ(ops::sum_of_squares_many(xs), s);  // the op's contract: per-tensor sums in list order
  // Against the sequential fp64 sum: only the summation order differs (relative 1e-12 holds for
  // 40k terms of fp64).
  EXPECT_NEAR(ops::sum_of_squares_many(xs), ref, 1e-12 * ref);
  EXPECT_EQ(ops::count_zeros_many(xs), z);
  EXPECT_GE(z, 1);
  EXPECT_FALSE(ops::has_inf_or_nan_many(xs));
  xs[3] = Tensor::from_vector({1.0f, NAN}, {2});
  EXPECT_TRUE(ops::has_inf_or_nan_many(xs));
  EXPECT_EQ(ops::sum_of_squares_many({}), 0.0);
  EXPECT_EQ(ops::count_zeros_many({}), 0);
  EXPECT_FALSE(ops::has_inf_or_nan_many({}));
}

TEST(MultiTensorOps, AdamMultiEqualsPerTensorAdamAndGradScaleEqualsPrescaling) {
  for (bool decoupled : {true, false}) {
    ops::AdamParams ap;
    ap.step = 5;
    ap.decoupled = decoupled;
    ap.grad_scale = 0.37f;
    const std::vector<int64_t> sizes = {33, 1000, 40000};
    std::vector<Tensor> p, g, m, v, mp, p2, m2, v2, mp2;
    std::vector<ops::AdamTensor> ts;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const uint32_t s = 10 * static_cast<uint32_t>(k);
      p.push_back(randn({sizes[k]}, 1.0f, s + 1));
      g.push_back(randn({sizes[k]}, 0.1f, s + 2));
      m.push_back(randn({sizes[k]}, 0.01f, s + 3));
      Tensor vv = randn({sizes[k]}, 0.01f, s + 4);
      for (int64_t i = 0; i < vv.numel(); ++i) vv.data<float>()[i] = std::fabs(vv.data<float>()[i]);
      v.push_back(vv);
      mp.push_back(Tensor::zeros({sizes[k]}, DType::kBFloat16));
      p2.push_back(p[k].clone());
      m2.push_back(m[k].clone());
      v2.push_back(v[k].clone());
      mp2.push_back(Tensor::zeros({sizes[k]}, DType::kBFloat16));
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      ops::AdamTensor t;
      t.param = &p[k];
      t.grad = &g[k];
      t.exp_avg = &m[k];
      t.exp_avg_sq = &v[k];
      t.model_param = k == 1 ? nullptr : &mp[k];
      t.lr = 1e-3f * static_cast<float>(k + 1);
      t.weight_decay = k == 2 ? 0.0f : 0.1f;
      ts.push_back(t);
    }
    ops::adam_step_multi(ts, ap);
    for (size_t k = 0; k < sizes.size(); ++k) {
      // Reference: scale the gradient first (the fp32 product scale_ makes), then a plain step.
      Tensor gs = g[k].clone();
      ops::scale_(gs, ap.grad_scale);
      ops::AdamParams a1 = ap;
      a1.grad_scale = 1.0f;
      a1.lr = ts[k].lr;
      a1.weight_decay = ts[k].weight_decay;
      ops::adam_step(p2[k], gs, m2[k], v2[k], a1, k == 1 ? nullptr : &mp2[k]);
      EXPECT_TRUE(bit_equal(p[k], p2[k])) << k;
      EXPECT_TRUE(bit_equal(m[k], m2[k])) << k;
      EXPECT_TRUE(bit_equal(v[k], v2[k])) << k;
      if (k != 1) EXPECT_TRUE(bit_equal(mp[k], mp2[k])) << k;
      EXPECT_TRUE(bit_equal(g[k], randn({sizes[k]}, 0.1f, 10 * static_cast<uint32_t>(k) + 2)))
          << "the gradient is not modified";
    }
  }
}

TEST(FusedOps, NormBackwardResidualIsBackwardPlusResidual) {
  const int64_t n = 6, h = 16;
  Tensor x = randn({n, h}, 1.0f, 1, DType::kBFloat16), gamma = randn({h}, 1.0f, 2);
  Tensor beta = randn({h}, 1.0f, 3), dy = randn({n, h}, 1.0f, 4, DType::kBFloat16);
  Tensor res = randn({n, h}, 1.0f, 5, DType::kBFloat16);
  Tensor y = Tensor::zeros({n, h}, DType::kBFloat16), mean = Tensor::zeros({n}, DType::kFloat32);
  Tensor rstd = Tensor::zeros({n}, DType::kFloat32);
  ops::layernorm_forward(x, gamma, beta, 1e-5f, false, y, mean, rstd);
  Tensor dx1 = Tensor::zeros({n, h}, DType::kBFloat16), dx2 = dx1.clone();
  Tensor dg1 = Tensor::zeros({h}, DType::kFloat32), dg2 = dg1.clone(), db1 = dg1.clone(), db2 = dg1.clone();
  ops::layernorm_backward_residual(dy, x, gamma, mean, rstd, false, res, dx1, dg1, db1, true);
  ops::layernorm_backward(dy, x, gamma, mean, rstd, false, dx2, dg2, db2, true);
  ops::add_(dx2, res);
  EXPECT_TRUE(bit_equal(dx1, dx2) && bit_equal(dg1, dg2) && bit_equal(db1, db2));
  Tensor rs = Tensor::zeros({n}, DType::kFloat32), rs2 = rs.clone();
  ops::rmsnorm_forward(x, gamma, 1e-5f, true, y, rs);
  ops::rmsnorm_rstd(x, gamma, 1e-5f, rs2);
  EXPECT_TRUE(bit_equal(rs, rs2)) << "rmsnorm_rstd is rmsnorm_forward's rstd";
  ops::rmsnorm_backward_residual(dy, x, gamma, rs, true, res, dx1, dg1, true);
  ops::rmsnorm_backward(dy, x, gamma, rs, true, dx2, dg2, true);
  ops::add_(dx2, res);
  EXPECT_TRUE(bit_equal(dx1, dx2) && bit_equal(dg1, dg2));
  // The CPU backend fuses nothing: the bool ops say so and write nothing.
  Tensor out = Tensor::zeros({n, h}, DType::kBFloat16);
  EXPECT_FALSE(ops::linear_forward_residual(x, randn({h, h}, 1.0f, 6, DType::kBFloat16), nullptr, res, out));
  EXPECT_FALSE(ops::gelu_backward_bgrad(dy, x, out, nullptr, true));
  EXPECT_EQ(ops::count_zeros(out), n * h);
}

// FP8 reference ops against values computed here from the format definitions.
TEST(Fp8Ops, QuantizeTransposeAmaxAndGemm) {
  const int64_t m = 5, k = 16, n = 3;
  Tensor a = randn({m, k}, 2.0f, 1), b = randn({n, k}, 0.5f, 2);
  a.data<float>()[3] = -1000.0f;  // saturates to -448 after scaling by 1
  float sa = 1.0f, sb = 64.0f, amax_a = 0.0f, amax_b = 0.5f;
  Tensor qa = Tensor::empty({m, k}, DType::kFloat8E4M3), qa_t = Tensor::empty({k, m}, DType::kFloat8E4M3);
  Tensor qb = Tensor::empty({n, k}, DType::kFloat8E4M3);
  ops::fp8_quantize(a, &sa, &amax_a, &qa, &qa_t);
  ops::fp8_quantize(b, &sb, &amax_b, &qb, nullptr);
  EXPECT_EQ(amax_a, 1000.0f);
  float ref_b = 0.5f;
  for (float v : b.to_float_vector()) ref_b = std::max(ref_b, std::fabs(v));
  EXPECT_EQ(amax_b, ref_b);
  const auto* qab = static_cast<const uint8_t*>(qa.data_ptr());
  EXPECT_EQ(e4m3_bits_to_float(qab[3]), -448.0f);  // E4M3's finite maximum (OCP "fn")
  // Each code is a nearest E4M3 value: |decode - x| is at most half a step (2^-3 relative) for normal values.
  for (int64_t i = 0; i < m * k; ++i) {
    const float x = a.data<float>()[i], d = e4m3_bits_to_float(qab[i]);
    if (std::fabs(x) <= 448.0f && std::fabs(x) >= 0.015625f) EXPECT_LE(std::fabs(d - x), std::fabs(x) / 16.0f) << i;
  }
  Tensor t2 = Tensor::empty({k, m}, DType::kFloat8E4M3);
  ops::fp8_transpose(qa, t2);
  EXPECT_TRUE(bit_equal(t2, qa_t));
  // GEMM: C = sa_inv * sb_inv * A_q @ B_q^T, in fp64 from the decoded codes.
  const float sai = 1.0f / sa, sbi = 1.0f / sb;
  Tensor c = Tensor::zeros({m, n}, DType::kFloat32);
  ops::fp8_gemm_tn(qa, &sai, qb, &sbi, c, 0.0f, false);
  const auto* qbb = static_cast<const uint8_t*>(qb.data_ptr());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double r = 0.0;
      for (int64_t l = 0; l < k; ++l) r += double(e4m3_bits_to_float(qab[i * k + l])) * e4m3_bits_to_float(qbb[j * k + l]);
      r *= double(sai) * sbi;
      // fp32 accumulation of 16 products: relative 1e-6 of the sum of |terms| bounds the error.
      EXPECT_NEAR(c.data<float>()[i * n + j], r, 1e-6 * (std::fabs(r) + 448.0 * 448.0 * k * sai * sbi)) << i << "," << j;
    }
}

TEST(Fp8Ops, ScaleFromAmaxAndDelayedUpdate) {
  Tensor cur = Tensor::from_vector({3.5f}, {1});
  float scale = 1.0f, scale_inv = 1.0f, step = 1.0f;
  ops::fp8_scale_from_amax(cur, 448.0f, 1, &scale, &scale_inv, &step);
  EXPECT_EQ(scale, 448.0f / 3.5f / 2.0f);
  EXPECT_EQ(scale_inv, 1.0f / scale);
  EXPECT_EQ(step, 3.5f);
  EXPECT_EQ(cur.data<float>()[0], 0.0f);
  ops::fp8_scale_from_amax(cur, 448.0f, 0, &scale, &scale_inv, nullptr);  // amax 0: scale kept
  EXPECT_EQ(scale, 448.0f / 3.5f / 2.0f);
  // Two roles, history 3, ring position 1: role 0 "max" over the window, role 1 most recent.
  const int64_t slot = 2;
  Tensor amax = Tensor::from_vector({5.0f, 0.0f, 1.0f, 0.0f}, {4});
  std::vector<float> hist = {7.0f, 2.0f, 0.5f, /*role 1*/ 9.0f, 4.0f, 1.0f};
  std::vector<float> fmax = {448.0f, 57344.0f}, sc = {1.0f, 0.0f, 1.0f, 0.0f}, si = sc;
  ops::fp8_update_scales(amax, slot, hist.data(), 3, /*pos=*/1, 2, fmax.data(), 0, /*max_algo=*/true, true, sc.data(),
                         si.data());
  // Role 0: entry 0 (slot 1) = max(2, 5) = 5; window max = 7 -> 448 / 7.
  EXPECT_EQ(sc[0], 448.0f / 7.0f);
  EXPECT_EQ(si[0], 1.0f / sc[0]);
  EXPECT_EQ(hist[1], 5.0f);
  EXPECT_EQ(hist[2], 0.0f);  // the new entry 0 of the next step
  // Role 1: entry 0 = max(4, 1) = 4; window max 9 -> 57344 / 9.
  EXPECT_EQ(sc[2], 57344.0f / 9.0f);
  EXPECT_EQ(amax.data<float>()[0], 0.0f);
  EXPECT_EQ(amax.data<float>()[2], 0.0f);
}

// MoE ops (grouped_linear_forward / _backward, row_dot_f64; docs/moe.md "Kernels").
const std::vector<int64_t> kCounts = {3, 0, 5, 1};  // an expert without tokens in the middle
constexpr int64_t kIn = 24, kOut = 10;

// float64 products of the float inputs; fp32 sgemm over k <= 24 terms of magnitude <= ~10 agrees
// to 24 * 2^-24 relative to Σ|terms| (<= 2e-6 absolute here): bound 1e-5 absolute.
TEST(GroupedLinear, MatchesFloat64PerExpertProducts) {
  int64_t N = 0;
  for (int64_t c : kCounts) N += c;
  Tensor x = randn({N, kIn}, 1.0f, 1), dy = randn({N, kOut}, 1.0f, 2);
  std::vector<Tensor> w, g, g0;
  for (size_t e = 0; e < kCounts.size(); ++e) {
    w.push_back(randn({kOut, kIn}, 0.5f, 10 + static_cast<uint32_t>(e)));
    g.push_back(randn({kOut, kIn}, 0.1f, 20 + static_cast<uint32_t>(e)));
    g0.push_back(g.back().clone());
  }
  Tensor y = Tensor::empty({N, kOut}, DType::kFloat32), dx = Tensor::empty({N, kIn}, DType::kFloat32);
  ops::grouped_linear_forward(x, w, kCounts, y);
  ops::grouped_linear_backward(dy, x, w, kCounts, &dx, &g, /*accumulate=*/true);
  const float *X = x.data<float>(), *DY = dy.data<float>();
  int64_t off = 0;
  for (size_t e = 0; e < kCounts.size(); ++e) {
    const float* W = w[e].data<float>();
    for (int64_t r = off; r < off + kCounts[e]; ++r) {
      for (int64_t j = 0; j < kOut; ++j) {
        double s = 0;
        for (int64_t i = 0; i < kIn; ++i) s += static_cast<double>(X[r * kIn + i]) * W[j * kIn + i];
        EXPECT_NEAR(y.data<float>()[r * kOut + j], s, 1e-5) << "y e" << e << " r" << r;
      }
      for (int64_t i = 0; i < kIn; ++i) {
        double s = 0;
        for (int64_t j = 0; j < kOut; ++j) s += static_cast<double>(DY[r * kOut + j]) * W[j * kIn + i];
        EXPECT_NEAR(dx.data<float>()[r * kIn + i], s, 1e-5) << "dx e" << e << " r" << r;
      }
    }
    for (int64_t j = 0; j < kOut; ++j)
      for (int64_t i = 0; i < kIn; ++i) {
        double s = g0[e].data<float>()[j * kIn + i];
        for (int64_t r = off; r < off + kCounts[e]; ++r) s += static_cast<double>(DY[r * kOut + j]) * X[r * kIn + i];
        EXPECT_NEAR(g[e].data<float>()[j * kIn + i], s, 1e-5) << "dw e" << e;
      }
    off += kCounts[e];
  }
  EXPECT_TRUE(bit_equal(g[1], g0[1]));  // no tokens, accumulating: untouched
  std::vector<Tensor> fresh = {randn({kOut, kIn}, 1.0f, 30), randn({kOut, kIn}, 1.0f, 31),
                               randn({kOut, kIn}, 1.0f, 32), randn({kOut, kIn}, 1.0f, 33)};
  ops::grouped_linear_backward(dy, x, w, kCounts, nullptr, &fresh, /*accumulate=*/false);
  for (float v : fresh[1].to_float_vector()) EXPECT_EQ(v, 0.0f);  // no tokens, overwriting: zero
}

// The contract the MoE path relies on (CPU results unchanged by the grouped op): bitwise the
// per-expert loop on row views, bf16 in, fp32 main grads accumulated.
TEST(GroupedLinear, IsThePerExpertLoopBitForBit) {
  int64_t N = 0;
  for (int64_t c : kCounts) N += c;
  const DType bf = DType::kBFloat16;
  Tensor x = randn({N, kIn}, 1.0f, 3, bf), dy = randn({N, kOut}, 1.0f, 4, bf);
  std::vector<Tensor> w, g, gl;
  for (size_t e = 0; e < kCounts.size(); ++e) {
    w.push_back(randn({kOut, kIn}, 0.5f, 40 + static_cast<uint32_t>(e), bf));
    g.push_back(randn({kOut, kIn}, 0.1f, 50 + static_cast<uint32_t>(e)));
    gl.push_back(g.back().clone());
  }
  Tensor y = Tensor::empty({N, kOut}, bf), yl = Tensor::empty({N, kOut}, bf);
  Tensor dx = Tensor::empty({N, kIn}, bf), dxl = Tensor::empty({N, kIn}, bf);
  ops::grouped_linear_forward(x, w, kCounts, y);
  ops::grouped_linear_backward(dy, x, w, kCounts, &dx, &g, true);
  int64_t off = 0;
  for (size_t e = 0; e < kCounts.size(); ++e) {
    const int64_t n = kCounts[e];
    if (n == 0) continue;
    Tensor ye = yl.narrow0(off, n), dxe = dxl.narrow0(off, n);
    ops::linear_forward(x.narrow0(off, n), w[e], nullptr, ye);
    ops::linear_backward(dy.narrow0(off, n), x.narrow0(off, n), w[e], &dxe, &gl[e], nullptr, true);
    off += n;
  }
  EXPECT_TRUE(bit_equal(y, yl));
  EXPECT_TRUE(bit_equal(dx, dxl));
  for (size_t e = 0; e < kCounts.size(); ++e) EXPECT_TRUE(bit_equal(g[e], gl[e])) << "expert " << e;
}

TEST(GroupedLinear, RejectsCountsThatDoNotCoverTheRows) {
  Tensor x = randn({4, kIn}, 1.0f, 5), y = Tensor::empty({4, kOut}, DType::kFloat32);
  std::vector<Tensor> w = {randn({kOut, kIn}, 1.0f, 6), randn({kOut, kIn}, 1.0f, 7)};
  EXPECT_ANY_THROW(ops::grouped_linear_forward(x, w, {1, 2}, y));      // 3 of 4 rows
  EXPECT_ANY_THROW(ops::grouped_linear_forward(x, w, {4}, y));         // one count, two weights
}

// The CUDA path rule (ops/grouped_gemm.h) against the first H200 measurements it was written from
// (docs/moe.md "Kernels"): at each measured shape the rule must pick the path that was faster
// there, for every forward / dgrad GEMM kind; the wgrad into fp32 main grads, float32 models and a
// single expert with rows always loop (cuBLAS has no grouped bf16 -> fp32 GEMM; fp32 stays on
// cuBLASLt); MEGATRON_MOE_GROUPED_GEMM=1 / 0 force a path, any other value is refused by name.
TEST(GroupedGemmRule, PicksTheFasterMeasuredPath) {
  using M = ops::GroupedGemmMode;
  using P = ops::GroupedGemmPath;
  const DType bf = DType::kBFloat16;
  struct Shape3 {
    int64_t experts, rows, hidden, ffn;
    P faster;  // measured, forward + dgrad
  };
  // Qwen3-30B-A3B: grouped 5.03 ms vs loop 7.61 ms; Mixtral-8x7B: grouped 27.5 ms vs loop 15.0 ms.
  for (const Shape3& c : {Shape3{128, 256, 2048, 768, P::kGrouped}, Shape3{8, 1024, 4096, 14336, P::kLoop}}) {
    const double e = static_cast<double>(c.experts), r = static_cast<double>(c.rows);
    const double fc1 = 2.0 * r * (2.0 * c.ffn) * c.hidden, fc2 = 2.0 * r * c.hidden * c.ffn;  // same for dgrad
    for (double per_expert : {fc1, fc2}) {
      EXPECT_EQ(ops::choose_grouped_gemm_path(M::kAuto, bf, bf, c.experts, e * per_expert), c.faster)
          << c.experts << " experts, " << per_expert << " FLOP each";
      EXPECT_EQ(ops::choose_grouped_gemm_path(M::kAuto, bf, DType::kFloat32, c.experts, e * per_expert), P::kLoop);
      EXPECT_EQ(ops::choose_grouped_gemm_path(M::kGrouped, bf, bf, c.experts, e * per_expert), P::kGrouped);
      EXPECT_EQ(ops::choose_grouped_gemm_path(M::kGrouped, bf, DType::kFloat32, c.experts, e * per_expert), P::kLoop);
      EXPECT_EQ(ops::choose_grouped_gemm_path(M::kLoop, bf, bf, c.experts, e * per_expert), P::kLoop);
    }
  }
  EXPECT_EQ(ops::choose_grouped_gemm_path(M::kGrouped, DType::kFloat32, DType::kFloat32, 8, 8e6), P::kLoop);
  EXPECT_EQ(ops::choose_grouped_gemm_path(M::kGrouped, bf, bf, 1, 1e6), P::kLoop);
  EXPECT_EQ(ops::choose_grouped_gemm_path(M::kAuto, DType::kFloat16, DType::kFloat16, 4, 4e6), P::kGrouped);
  EXPECT_EQ(ops::parse_grouped_gemm_mode(nullptr), M::kAuto);
  EXPECT_EQ(ops::parse_grouped_gemm_mode("auto"), M::kAuto);
  EXPECT_EQ(ops::parse_grouped_gemm_mode("1"), M::kGrouped);
  EXPECT_EQ(ops::parse_grouped_gemm_mode("0"), M::kLoop);
  try {
    ops::parse_grouped_gemm_mode("yes");
    ADD_FAILURE() << "MEGATRON_MOE_GROUPED_GEMM=yes accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("MEGATRON_MOE_GROUPED_GEMM=yes"), std::string::npos) << e.what();
  }
}

// MEGATRON_MOE_GEMM_STREAMS (ops/grouped_gemm.h): unset / empty -> the default (4), 1..8 as
// given, anything else (0, 9, a sign, a suffix, a word) refused by name. The lanes of the
// per-expert loop: equal counts go round-robin; each expert goes to the lane with the fewest rows
// so far (hand-worked below); experts without rows get no lane; one lane takes every expert.
TEST(GroupedGemmRule, StreamsSwitchAndExpertLanes) {
  EXPECT_EQ(ops::parse_moe_gemm_streams(nullptr), 4);
  EXPECT_EQ(ops::parse_moe_gemm_streams(""), 4);
  EXPECT_EQ(ops::parse_moe_gemm_streams("1"), 1);
  EXPECT_EQ(ops::parse_moe_gemm_streams("2"), 2);
  EXPECT_EQ(ops::parse_moe_gemm_streams("8"), 8);
  for (const char* bad : {"0", "9", "12", "-1", "+2", "2x", " 2", "two", "1000000000000"}) {
    try {
      ops::parse_moe_gemm_streams(bad);
      ADD_FAILURE() << "MEGATRON_MOE_GEMM_STREAMS=" << bad << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("MEGATRON_MOE_GEMM_STREAMS=") + bad), std::string::npos)
          << e.what();
    }
  }
  // Unset: 4 streams below the grouped rule's 10 GFLOP mean per expert GEMM, the serial loop above
  // (the two measured H200 points, docs/moe.md "Session 11": Qwen3's wgrad loop, 128 experts x
  // 2*256*768*2048 = 0.8 GFLOP each, 1.27x faster on 4 streams; Mixtral's, 8 x 2*1024*28672*4096
  // = 240 GFLOP, slower on 4); a set value wins either way.
  const double qwen3 = 128 * 2.0 * 256 * 768 * 2048, mixtral = 8 * 2.0 * 1024 * 28672 * 4096;
  EXPECT_EQ(ops::moe_gemm_streams_for(nullptr, qwen3, 128), 4);
  EXPECT_EQ(ops::moe_gemm_streams_for("", qwen3, 128), 4);
  EXPECT_EQ(ops::moe_gemm_streams_for(nullptr, mixtral, 8), 1);
  EXPECT_EQ(ops::moe_gemm_streams_for("4", mixtral, 8), 4);
  EXPECT_EQ(ops::moe_gemm_streams_for("1", qwen3, 128), 1);
  EXPECT_THROW(ops::moe_gemm_streams_for("0", mixtral, 8), UserError);
  EXPECT_EQ(ops::assign_expert_lanes({5, 5, 5, 5, 5}, 2), (std::vector<int>{0, 1, 0, 1, 0}));
  EXPECT_EQ(ops::assign_expert_lanes({5, 5, 5, 5, 5}, 4), (std::vector<int>{0, 1, 2, 3, 0}));
  // Rows per lane after each expert: [100,0] [100,10] [100,30] [100,60] [100,61] [100,161] [107,161].
  EXPECT_EQ(ops::assign_expert_lanes({100, 10, 20, 30, 1, 100, 7}, 2), (std::vector<int>{0, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(ops::assign_expert_lanes({0, 3, 0, 4, 2}, 3), (std::vector<int>{-1, 0, -1, 1, 2}));
  EXPECT_EQ(ops::assign_expert_lanes({0, 3, 0, 4, 2}, 1), (std::vector<int>{-1, 0, -1, 0, 0}));
}

// Products of two floats are exact in float64 and the reference sums j ascending like this loop:
// equal exactly (bf16 and fp32 inputs, a row length over the OpenMP threshold).
TEST(RowDotF64, EqualsTheSequentialFloat64Sum) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const int64_t n = 40, h = 700;
    Tensor a = randn({n, h}, 1.0f, 8, dt), b = randn({n, h}, 1.0f, 9, dt);
    Tensor out = Tensor::empty({n}, DType::kFloat64);
    ops::row_dot_f64(a, b, out);
    const std::vector<float> av = a.to_float_vector(), bv = b.to_float_vector();
    for (int64_t r = 0; r < n; ++r) {
      double s = 0;
      for (int64_t j = 0; j < h; ++j) s += static_cast<double>(av[r * h + j]) * bv[r * h + j];
      EXPECT_EQ(out.data<double>()[r], s) << dtype_name(dt) << " row " << r;
    }
  }
}

}  // namespace
}  // namespace megatron
