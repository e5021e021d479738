// The MoE ops of the op table (grouped_linear_forward / _backward, row_dot_f64), CPU reference:
// against float64 loops written here and against the defining invariant (the grouped op is the
// per-expert loop of linear_forward / linear_backward, bit for bit; docs/moe.md "Kernels").
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "megatron/core/ops/ops.h"

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
