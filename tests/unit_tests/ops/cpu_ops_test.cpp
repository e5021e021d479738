// Every op of megatron/core/ops/ops.h (CPU backend), forward and backward, against PyTorch
// formulas (tests/reference/model/gen_op_fixtures.py, fp64 reference from fp32 inputs).
#include "megatron/core/ops/ops.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_utils/fixture_util.h"

namespace megatron {
namespace {

using testing::Fixture;
using testing::max_rel_error;

// fp32 kernels vs an fp64 reference on tiny shapes (max_rel_error: largest |difference| over the
// largest |reference|). Every reduction here runs over n <= 150 values (attention rows; most are
// <= 40), so whatever summation order a CPU's kernels pick, its fp32 error is <= n*u*sum|terms|
// (u = 2^-24: n*u <= 9e-6), with sum|terms| of the order of the largest output for these N(0, 1)
// fixtures; typical errors (sqrt(n)*u ~ 1e-6) sit an order of magnitude below 1e-5.
constexpr double kTol = 1e-5;

const Fixture& fx() {
  static Fixture f("ops");
  return f;
}
Tensor get(const std::string& k) { return fx().get(k); }
Tensor like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype()); }
Tensor f32(const Shape& s) { return Tensor::zeros(s, DType::kFloat32); }

TEST(CpuOps, LayerNorm) {
  for (std::string name : {"layernorm", "layernorm_1p"}) {
    const bool zc = name == "layernorm_1p";
    Tensor x = get(name + "/x"), g = get(name + "/gamma"), b = get(name + "/beta");
    Tensor y = like(x), mean = f32({6}), rstd = f32({6});
    ops::layernorm_forward(x, g, b, 1e-5f, zc, y, mean, rstd);
    EXPECT_LE(max_rel_error(y, get(name + "/y")), kTol) << name;
    Tensor dx = like(x), dg = like(g), db = like(b);
    ops::layernorm_backward(get(name + "/dy"), x, g, mean, rstd, zc, dx, dg, db, false);
    EXPECT_LE(max_rel_error(dx, get(name + "/dx")), kTol) << name;
    EXPECT_LE(max_rel_error(dg, get(name + "/dgamma")), kTol) << name;
    EXPECT_LE(max_rel_error(db, get(name + "/dbeta")), kTol) << name;
    // accumulate=true adds onto the existing gradients.
    ops::layernorm_backward(get(name + "/dy"), x, g, mean, rstd, zc, dx, dg, db, true);
    Tensor twice = get(name + "/dgamma");
    ops::scale_(twice, 2.0f);
    EXPECT_LE(max_rel_error(dg, twice), kTol) << name;
  }
}

TEST(CpuOps, RMSNorm) {
  for (std::string name : {"rmsnorm", "rmsnorm_1p"}) {
    const bool zc = name == "rmsnorm_1p";
    Tensor x = get(name + "/x"), g = get(name + "/gamma");
    Tensor y = like(x), rstd = f32({6});
    ops::rmsnorm_forward(x, g, 1e-5f, zc, y, rstd);
    EXPECT_LE(max_rel_error(y, get(name + "/y")), kTol) << name;
    Tensor dx = like(x), dg = like(g);
    ops::rmsnorm_backward(get(name + "/dy"), x, g, rstd, zc, dx, dg, false);
    EXPECT_LE(max_rel_error(dx, get(name + "/dx")), kTol) << name;
    EXPECT_LE(max_rel_error(dg, get(name + "/dgamma")), kTol) << name;
  }
}

TEST(CpuOps, GeLU) {
  for (std::string name : {"gelu_erf", "gelu_tanh"}) {
    const bool approx = name == "gelu_tanh";
    Tensor x = get(name + "/x"), y = like(x), dx = like(x);
    ops::gelu_forward(x, y, approx);
    ops::gelu_backward(get(name + "/dy"), x, dx, approx);
    // Megatron's tanh constant 0.79788456 vs sqrt(2/pi) in torch: 1e-9 relative, below kTol.
    EXPECT_LE(max_rel_error(y, get(name + "/y")), kTol) << name;
    EXPECT_LE(max_rel_error(dx, get(name + "/dx")), kTol) << name;
  }
}

TEST(CpuOps, SquaredReLU) {
  // Megatron's squared_relu (megatron/core/activations.py: relu(x)^2), by hand: y = max(x, 0)^2,
  // dx = dy * 2 max(x, 0) (0 at x <= 0). All values are exact in fp32 (small dyadic rationals), so
  // the comparison is exact.
  Tensor x = Tensor::from_vector({-2.0f, -0.5f, 0.0f, 0.5f, 3.0f, 1.25f}, {2, 3});
  Tensor dy = Tensor::from_vector({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, -2.0f}, {2, 3});
  Tensor y = like(x), dx = like(x);
  ops::squared_relu_forward(x, y);
  ops::squared_relu_backward(dy, x, dx);
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{0.0f, 0.0f, 0.0f, 0.25f, 9.0f, 1.5625f}));
  EXPECT_EQ(dx.to_float_vector(), (std::vector<float>{0.0f, 0.0f, 0.0f, 4.0f, 30.0f, -5.0f}));
}

TEST(CpuOps, SwiGLU) {
  Tensor x = get("swiglu/x"), y = f32({5, 20}), dx = like(x);
  ops::swiglu_forward(x, y);
  ops::swiglu_backward(get("swiglu/dy"), x, dx);
  EXPECT_LE(max_rel_error(y, get("swiglu/y")), kTol);
  EXPECT_LE(max_rel_error(dx, get("swiglu/dx")), kTol);
}

TEST(CpuOps, LinearAndBiasAdd) {
  Tensor x = get("linear/x"), w = get("linear/w"), b = get("linear/b");
  Tensor y = f32({3, 5, 16});
  ops::linear_forward(x, w, &b, y);
  EXPECT_LE(max_rel_error(y, get("linear/y")), kTol);
  Tensor y2 = f32({3, 5, 16});
  ops::linear_forward(x, w, nullptr, y2);
  ops::bias_add_(y2, b);
  EXPECT_LE(max_rel_error(y2, get("linear/y")), kTol);
  Tensor dx = like(x), dw = like(w), db = like(b);
  ops::linear_backward(get("linear/dy"), x, w, &dx, &dw, &db, false);
  EXPECT_LE(max_rel_error(dx, get("linear/dx")), kTol);
  EXPECT_LE(max_rel_error(dw, get("linear/dw")), kTol);
  EXPECT_LE(max_rel_error(db, get("linear/db")), kTol);
}

TEST(CpuOps, GemmTransposesAndBeta) {
  Tensor ab = get("gemm/ab");
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor c = f32({7, 9});
      ops::gemm(get(ta ? "gemm/at" : "gemm/a"), ta, get(tb ? "gemm/bt" : "gemm/b"), tb, c);
      EXPECT_LE(max_rel_error(c, ab), kTol) << ta << tb;
    }
  Tensor c = get("gemm/c");
  ops::gemm(get("gemm/a"), false, get("gemm/b"), false, c, 2.0f, 0.5f);
  EXPECT_LE(max_rel_error(c, get("gemm/axpby")), kTol);
}

TEST(CpuOps, VocabShardEmbedding) {
  Tensor table = get("embedding/table"), ids = get("embedding/ids");
  Tensor y = f32({4, 3, 8});
  ops::embedding_forward(ids, table, y, 5);
  EXPECT_EQ(max_rel_error(y, get("embedding/y")), 0.0);  // a copy: exact
  Tensor dt = like(table);
  ops::embedding_backward(get("embedding/dy"), ids, dt, 5);
  EXPECT_LE(max_rel_error(dt, get("embedding/dtable")), kTol);
}

TEST(CpuOps, Rope) {
  ops::RopeParams half{true, 10000.0f, 1.0f, false};
  Tensor x = get("rope_half/x"), y = like(x), dx = like(x);
  ops::rope_forward(x, half, nullptr, y);
  ops::rope_backward(get("rope_half/dy"), half, nullptr, dx);
  EXPECT_LE(max_rel_error(y, get("rope_half/y")), kTol);
  EXPECT_LE(max_rel_error(dx, get("rope_half/dx")), kTol);

  ops::RopeParams inter{true, 500.0f, 0.5f, true};
  const std::string n = "rope_interleaved_half_percent";
  Tensor pos = get(n + "/position_ids");
  x = get(n + "/x");
  y = like(x);
  dx = like(x);
  ops::rope_forward(x, inter, &pos, y);
  ops::rope_backward(get(n + "/dy"), inter, &pos, dx);
  // Positions up to 49: angles ~50 rad in fp32 on both sides (torch computes them in fp32 too).
  EXPECT_LE(max_rel_error(y, get(n + "/y")), kTol);
  EXPECT_LE(max_rel_error(dx, get(n + "/dx")), kTol);
}

TEST(CpuOps, QkvSplitRope) {
  ops::RopeParams rope{true, 10000.0f, 1.0f, false};
  Tensor qkv = get("qkv_split_rope/qkv");
  Tensor q = f32({6, 2, 4, 8}), k = f32({6, 2, 2, 8}), v = f32({6, 2, 2, 8});
  ops::qkv_split_rope_forward(qkv, 4, 2, rope, nullptr, q, k, v);
  EXPECT_LE(max_rel_error(q, get("qkv_split_rope/q")), kTol);
  EXPECT_LE(max_rel_error(k, get("qkv_split_rope/k")), kTol);
  EXPECT_EQ(max_rel_error(v, get("qkv_split_rope/v")), 0.0);
  Tensor dqkv = like(qkv);
  ops::qkv_split_rope_backward(get("qkv_split_rope/dq"), get("qkv_split_rope/dk"), get("qkv_split_rope/dv"), 4, 2,
                               rope, nullptr, dqkv);
  EXPECT_LE(max_rel_error(dqkv, get("qkv_split_rope/dqkv")), kTol);
}

TEST(CpuOps, AttentionGQACausalAndMasked) {
  for (std::string name : {"attention_causal", "attention_mask", "attention_long"}) {
    Tensor q = get(name + "/q"), k = get(name + "/k"), v = get(name + "/v");
    ops::AttentionParams p;
    p.softmax_scale = 1.0f / std::sqrt(8.0f);
    p.causal = true;
    Tensor mask;
    if (name == "attention_mask") {
      Tensor mask64 = get(name + "/mask");
      mask = Tensor::empty(mask64.shape(), DType::kUInt8);
      for (int64_t i = 0; i < mask.numel(); ++i) mask.data<uint8_t>()[i] = mask64.data<int64_t>()[i] != 0;
      p.attention_mask = &mask;
    }
    Tensor out = like(q), lse = f32({q.size(1), q.size(2), q.size(0)});
    ops::attention_forward(q, k, v, p, out, lse);
    EXPECT_LE(max_rel_error(out, get(name + "/out")), kTol) << name;
    EXPECT_LE(max_rel_error(lse, get(name + "/lse")), kTol) << name;
    Tensor dq = like(q), dk = like(k), dv = like(v);
    ops::attention_backward(get(name + "/dout"), q, k, v, out, lse, p, dq, dk, dv);
    EXPECT_LE(max_rel_error(dq, get(name + "/dq")), kTol) << name;
    EXPECT_LE(max_rel_error(dk, get(name + "/dk")), kTol) << name;
    EXPECT_LE(max_rel_error(dv, get(name + "/dv")), kTol) << name;
  }
}

TEST(CpuOps, AttentionDropoutIsConsistentAndUnbiased) {
  // No PyTorch counterpart (different random streams): check that the backward replays the
  // forward's mask (finite differences of <dout, out> along a fixed direction of q, on a short
  // sequence and on one spanning several row blocks) and that p > 0 changes the output.
  for (std::string name : {"attention_causal", "attention_long"}) {
    Tensor q = get(name + "/q"), k = get(name + "/k"), v = get(name + "/v");
    Tensor dout = get(name + "/dout");
    const Shape lse_shape{q.size(1), q.size(2), q.size(0)};
    ops::AttentionParams p;
    p.softmax_scale = 0.35f;
    p.dropout_p = 0.3f;
    p.seed = 5;
    p.offset = 9;
    auto objective = [&](const Tensor& qq) {
      Tensor out = like(qq), lse = f32(lse_shape);
      ops::attention_forward(qq, k, v, p, out, lse);
      double s = 0;
      auto a = out.to_float_vector(), b = dout.to_float_vector();
      for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
      return s;
    };
    Tensor out = like(q), lse = f32(lse_shape);
    ops::attention_forward(q, k, v, p, out, lse);
    Tensor dq = like(q), dk = like(k), dv = like(v);
    ops::attention_backward(dout, q, k, v, out, lse, p, dq, dk, dv);
    Tensor dir = get(name + "/dq");  // any fixed direction of q's shape
    const float eps = 1e-2f;
    Tensor qp = q.clone(), qm = q.clone();
    ops::add_(qp, dir, eps);
    ops::add_(qm, dir, -eps);
    const double fd = (objective(qp) - objective(qm)) / (2 * eps);
    double an = 0;
    auto g = dq.to_float_vector(), dvec = dir.to_float_vector();
    for (size_t i = 0; i < g.size(); ++i) an += double(g[i]) * dvec[i];
    // Central differences in fp32 with eps 1e-2: truncation O(eps^2) and rounding ~1e-5/eps.
    EXPECT_NEAR(fd, an, 1e-3 * std::max(1.0, std::abs(an))) << name;
    Tensor out0 = like(q);
    p.dropout_p = 0.0f;
    ops::attention_forward(q, k, v, p, out0, lse);
    EXPECT_GT(max_rel_error(out, out0), 1e-2) << name;
  }
}

TEST(CpuOps, VocabParallelCrossEntropyCombine) {
  Tensor logits = get("cross_entropy/logits"), labels = get("cross_entropy/labels");
  const int64_t n = 10, v = 12;
  Tensor shard[2], m[2], s[2], pred[2];
  for (int r = 0; r < 2; ++r) {
    shard[r] = f32({n, v});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < v; ++j) shard[r].data<float>()[i * v + j] = logits.data<float>()[i * 24 + r * v + j];
    m[r] = f32({n});
    s[r] = f32({n});
    pred[r] = f32({n});
    ops::cross_entropy_stats(shard[r], labels, r * v, m[r], s[r], pred[r]);
  }
  // What the all-reduces compute (docs/megatron-reference.md#vocab-parallel-cross-entropy).
  Tensor gmax = f32({n}), gsum = f32({n}), gpred = f32({n});
  for (int64_t i = 0; i < n; ++i) gmax.data<float>()[i] = std::max(m[0].data<float>()[i], m[1].data<float>()[i]);
  for (int r = 0; r < 2; ++r) {
    ops::cross_entropy_rescale_(s[r], m[r], gmax);
    ops::add_(gsum, s[r]);
    ops::add_(gpred, pred[r]);
  }
  Tensor loss = f32({n}), lse = f32({n});
  ops::cross_entropy_loss(gmax, gsum, gpred, loss, lse);
  EXPECT_LE(max_rel_error(loss, get("cross_entropy/loss")), kTol);
  EXPECT_LE(max_rel_error(lse, get("cross_entropy/lse")), kTol);
  Tensor ref = get("cross_entropy/dlogits");
  for (int r = 0; r < 2; ++r) {
    ops::cross_entropy_backward(shard[r], labels, r * v, lse, get("cross_entropy/dloss"), shard[r]);  // in place
    Tensor ref_shard = f32({n, v});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < v; ++j) ref_shard.data<float>()[i * v + j] = ref.data<float>()[i * 24 + r * v + j];
    EXPECT_LE(max_rel_error(shard[r], ref_shard), kTol) << "shard " << r;
  }
}

TEST(CpuOps, AdamMatchesTorchOptim) {
  for (std::string name : {"adamw", "adam_l2"}) {
    Tensor p = get(name + "/p0"), m = f32({50}), v = f32({50});
    Tensor model = Tensor::zeros({50}, DType::kBFloat16);
    ops::AdamParams ap;
    ap.lr = 1e-2f;
    ap.beta1 = 0.9f;
    ap.beta2 = 0.95f;
    ap.eps = 1e-8f;
    ap.weight_decay = 0.1f;
    ap.decoupled = name == "adamw";
    for (int t = 0; t < 3; ++t) {
      ap.step = t + 1;
      ops::adam_step(p, get(name + "/g" + std::to_string(t)), m, v, ap, &model);
    }
    EXPECT_LE(max_rel_error(p, get(name + "/p3")), kTol) << name;
    EXPECT_LE(max_rel_error(m, get(name + "/exp_avg")), kTol) << name;
    EXPECT_LE(max_rel_error(v, get(name + "/exp_avg_sq")), kTol) << name;
    EXPECT_EQ(max_rel_error(model, p.to(DType::kBFloat16)), 0.0) << "model param = RNE cast of the main param";
  }
}

TEST(CpuOps, DropoutMaskScaleAndDeterminism) {
  const int64_t n = 100000;
  Tensor x = f32({n});
  x.fill_(1.0f);
  Tensor y = f32({n}), mask = Tensor::empty({n}, DType::kUInt8);
  ops::dropout_forward(x, y, mask, 0.25f, 1, 2);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += mask.data<uint8_t>()[i];
    const float expect = mask.data<uint8_t>()[i] ? 1.0f / 0.75f : 0.0f;
    ASSERT_EQ(y.data<float>()[i], expect);
  }
  // Binomial(1e5, 0.75): std ~137; 5 sigma bound.
  EXPECT_NEAR(static_cast<double>(kept), 75000.0, 700.0);
  Tensor y2 = f32({n}), mask2 = Tensor::empty({n}, DType::kUInt8);
  ops::dropout_forward(x, y2, mask2, 0.25f, 1, 2);
  EXPECT_EQ(std::memcmp(mask.data_ptr(), mask2.data_ptr(), n), 0) << "same (seed, offset) -> same mask";
  ops::dropout_forward(x, y2, mask2, 0.25f, 1, 3);
  EXPECT_NE(std::memcmp(mask.data_ptr(), mask2.data_ptr(), n), 0) << "another offset -> another mask";
  Tensor dx = f32({n});
  ops::dropout_backward(x, mask, 0.25f, dx);
  EXPECT_EQ(max_rel_error(dx, y), 0.0);
  ops::dropout_forward(x, y2, mask2, 0.0f, 1, 2);
  EXPECT_EQ(max_rel_error(y2, x), 0.0);
}

TEST(CpuOps, UtilityOps) {
  Tensor x = Tensor::from_vector({1.0f, -2.0f, 0.0f, 3.0f, 0.0f, 0.5f}, {2, 3});
  EXPECT_DOUBLE_EQ(ops::sum_of_squares(x), 1 + 4 + 9 + 0.25);
  EXPECT_EQ(ops::count_zeros(x), 2);
  EXPECT_FALSE(ops::has_inf_or_nan(x));
  Tensor bad = x.clone();
  bad.data<float>()[4] = std::nanf("");
  EXPECT_TRUE(ops::has_inf_or_nan(bad));
  Tensor t = f32({3, 2});
  ops::transpose01(x, t);
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{1.0f, 3.0f, -2.0f, 0.0f, 0.0f, 0.5f}));
  Tensor y = x.clone();
  ops::add_(y, x, 2.0f);
  ops::scale_(y, 0.5f);
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{1.5f, -3.0f, 0.0f, 4.5f, 0.0f, 0.75f}));
  // cast to bfloat16 rounds to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1.
  Tensor tie = Tensor::from_vector({1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f}, {2});
  Tensor b16 = Tensor::empty({2}, DType::kBFloat16);
  ops::cast(tie, b16);
  EXPECT_EQ(b16.to_float_vector(), (std::vector<float>{1.0f, 1.0f + 4.0f / 256.0f}));
  ops::fill(b16, 2.0f);
  EXPECT_EQ(b16.to_float_vector(), (std::vector<float>{2.0f, 2.0f}));
}

TEST(CpuOps, ReducedPrecisionLinearRoundsOnce) {
  // bf16 inputs: the kernel widens to fp32, accumulates in fp32 and rounds the output once,
  // so it equals the fp32 result (on the same bf16-valued inputs) rounded to bf16, up to one
  // bf16 ulp where the two fp32 sums straddle a rounding boundary.
  Tensor x = get("linear/x").to(DType::kBFloat16), w = get("linear/w").to(DType::kBFloat16);
  Tensor y16 = Tensor::empty({3, 5, 16}, DType::kBFloat16);
  ops::linear_forward(x, w, nullptr, y16);
  Tensor y32 = f32({3, 5, 16});
  ops::linear_forward(x.to(DType::kFloat32), w.to(DType::kFloat32), nullptr, y32);
  auto a = y16.to_float_vector(), b = y32.to_float_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(std::abs(a[i] - b[i]), std::abs(b[i]) * (1.0f / 128.0f)) << i;
}

}  // namespace
// torch.argmax(x, dim=-1) semantics, expected indices written by hand: the first of equal maxima,
// a NaN above every number (its first occurrence), an all -inf row gives 0; bfloat16 rows compare
// their (exactly converted) values.
TEST(CpuOps, ArgmaxLastDimIsTorchArgmax) {
  const float nan = std::nanf(""), inf = INFINITY;
  Tensor x = Tensor::from_vector({1, 3, 3, 2,  5, -1, nan, nan,  -inf, -inf, -inf, -inf,  -2, -3, -1, -1}, {4, 4});
  Tensor idx = Tensor::zeros({4}, DType::kInt64);
  ops::argmax_last_dim(x, idx);
  EXPECT_EQ(idx.data<int64_t>()[0], 1);
  EXPECT_EQ(idx.data<int64_t>()[1], 2);
  EXPECT_EQ(idx.data<int64_t>()[2], 0);
  EXPECT_EQ(idx.data<int64_t>()[3], 2);
  // bfloat16: 1.001 and 1.0 round to the same bf16 value 1.0, so the first one wins.
  Tensor xb = Tensor::from_vector({0.5f, 1.0f, 1.001f, 0.25f}, {1, 4}).to(DType::kBFloat16);
  Tensor ib = Tensor::zeros({1}, DType::kInt64);
  ops::argmax_last_dim(xb, ib);
  EXPECT_EQ(ib.data<int64_t>()[0], 1);
  Tensor bad = Tensor::zeros({3}, DType::kInt64);
  EXPECT_ANY_THROW(ops::argmax_last_dim(x, bad));
}

}  // namespace megatron
