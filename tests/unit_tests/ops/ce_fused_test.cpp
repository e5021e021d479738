// ops::cross_entropy_fused_ and ops::scale_rows (CPU backend) against independent references:
// PyTorch's cross entropy (the committed fixture of tests/reference/model/gen_op_fixtures.py) and
// a float64 host computation written here from the formulas (lse = log sum exp, loss = lse -
// logit[label], g = softmax - onehot(label)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "test_utils/fixture_util.h"
#include "megatron/core/ops/ops.h"

namespace megatron {
namespace {

using testing::Fixture;
using testing::max_rel_error;

// fp32 kernels vs an fp64 (or PyTorch fp64-from-fp32) reference on small rows: rounding ~1e-7 of
// the largest value; 1e-5 is the project's CPU-vs-reference bound.
constexpr double kTol = 1e-5;

TEST(CeFused, MatchesPyTorchCrossEntropy) {
  Fixture f("ops");
  Tensor logits = f.get("cross_entropy/logits").clone(), labels = f.get("cross_entropy/labels");
  const int64_t n = logits.size(0);
  Tensor loss = Tensor::zeros({n}, DType::kFloat32), lse = Tensor::zeros({n}, DType::kFloat32);
  ops::cross_entropy_fused_(logits, labels, 0, loss, lse);
  EXPECT_LE(max_rel_error(loss, f.get("cross_entropy/loss")), kTol);
  EXPECT_LE(max_rel_error(lse, f.get("cross_entropy/lse")), kTol);
  // The fixture's dlogits = (softmax - onehot) * dloss: the fused op leaves the first factor.
  Tensor dlogits = logits.clone();
  ops::scale_rows(logits, f.get("cross_entropy/dloss"), dlogits);
  EXPECT_LE(max_rel_error(dlogits, f.get("cross_entropy/dlogits")), kTol);
}

// float64 reference of one row set; labels outside [vs, vs + v) contribute no logit and no onehot.
void reference(const std::vector<float>& x, const std::vector<int64_t>& lab, int64_t n, int64_t v, int64_t vs,
               std::vector<double>& loss, std::vector<double>& lse, std::vector<double>& g) {
  loss.assign(n, 0.0);
  lse.assign(n, 0.0);
  g.assign(n * v, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, (double)x[r * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp((double)x[r * v + j] - m);
    lse[r] = std::log(s) + m;
    const int64_t t = lab[r] - vs;
    loss[r] = lse[r] - ((t >= 0 && t < v) ? (double)x[r * v + t] : 0.0);
    for (int64_t j = 0; j < v; ++j) g[r * v + j] = std::exp((double)x[r * v + j] - lse[r]) - (j == t ? 1.0 : 0.0);
  }
}

Tensor from_d(const std::vector<double>& v, const Shape& s) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector(f, s);
}

TEST(CeFused, Float64ReferenceAllDtypes) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int64_t n = 37, v = 203, vs = 50;  // odd row length; labels below, inside and above the shard
  std::uniform_int_distribution<int64_t> ld(0, vs + v + 40);
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> x(n * v);
    for (auto& e : x) e = nd(rng);
    Tensor t = Tensor::from_vector(x, {n, v});
    if (dt != DType::kFloat32) t = t.to(dt);
    x = t.to_float_vector();  // the reference sees the rounded inputs
    std::vector<int64_t> lab(n);
    for (auto& l : lab) l = ld(rng);
    std::vector<double> rl, rlse, rg;
    reference(x, lab, n, v, vs, rl, rlse, rg);
    Tensor loss = Tensor::zeros({n}, DType::kFloat32), lse = Tensor::zeros({n}, DType::kFloat32);
    ops::cross_entropy_fused_(t, Tensor::from_vector_i64(lab, {n}), vs, loss, lse);
    EXPECT_LE(max_rel_error(loss, from_d(rl, {n})), kTol) << dtype_name(dt);
    EXPECT_LE(max_rel_error(lse, from_d(rlse, {n})), kTol) << dtype_name(dt);
    // g rounded once to the logits' dtype: 2^-8 (bf16) / 2^-11 (fp16) relative at most.
    const double gtol = dt == DType::kFloat32 ? kTol : dt == DType::kBFloat16 ? 4e-3 : 5e-4;
    EXPECT_LE(max_rel_error(t.to(DType::kFloat32), from_d(rg, {n, v})), gtol) << dtype_name(dt);
  }
}

TEST(CeFused, ScaleRowsInPlaceAndOutOfPlace) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  const int64_t n = 9, h = 13;
  std::vector<float> x(n * h), s(n);
  for (auto& e : x) e = nd(rng);
  for (auto& e : s) e = nd(rng);
  s[3] = 0.0f;  // a masked token
  std::vector<double> ref(n * h);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < h; ++j) ref[r * h + j] = (double)x[r * h + j] * s[r];
  Tensor X = Tensor::from_vector(x, {n, h}), S = Tensor::from_vector(s, {n});
  Tensor out = Tensor::zeros({n, h}, DType::kFloat32);
  ops::scale_rows(X, S, out);
  EXPECT_LE(max_rel_error(out, from_d(ref, {n, h})), 1e-7);  // one fp32 rounding per element
  ops::scale_rows(X, S, X);
  EXPECT_LE(max_rel_error(X, from_d(ref, {n, h})), 1e-7);
  Tensor B = Tensor::from_vector(x, {n, h}).to(DType::kBFloat16);
  ops::scale_rows(B, S, B);
  EXPECT_LE(max_rel_error(B.to(DType::kFloat32), from_d(ref, {n, h})), 8e-3);  // two bf16 roundings
  EXPECT_THROW(ops::scale_rows(X, Tensor::zeros({n + 1}, DType::kFloat32), out), std::exception);
}

}  // namespace
}  // namespace megatron
