// --moe-shared-expert-gate (Megatron's SharedExpertMLP with gate=True, shared_experts.py):
// y = swiglu_mlp(x) * sigmoid(x @ gate_weight^T) per token. The module (float32) against a float64
// reference written here from that formula (Megatron's SwiGLU: fc1 rows [gate; up], silu(gate) * up,
// then fc2) and its gradients against central finite differences of that float64 reference, so
// the expected numbers come from neither the module nor its ops. Also the parameter Megatron
// registers (name, shape, order, sequence-parallel attribute) and that the gate changes nothing
// when off.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/transformer/moe/shared_experts.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {
namespace {

constexpr int64_t kH = 8, kF = 6, kS = 3, kB = 2, kT = kS * kB;

TransformerConfig gate_config(bool gate) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = kH;
  c.ffn_hidden_size = 16;
  c.num_attention_heads = 2;
  c.add_bias_linear = false;
  c.gated_linear_unit = true;
  c.hidden_dropout = c.attention_dropout = 0;
  c.num_moe_experts = 2;
  c.moe_router_topk = 1;
  c.moe_router_pre_softmax = true;
  c.moe_aux_loss_coeff = {0.0};
  c.moe_shared_expert_intermediate_size = kF;
  c.moe_shared_expert_gate = gate;
  c.validate();
  return c;
}

std::vector<double> randn(size_t n, uint32_t seed, double std) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, std);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<float>(d(gen));  // representable in float32: both sides see the same values
  return v;
}

// The float64 reference: y[t] = sigmoid(<x[t], g>) * W2 (silu(W1g x[t]) * (W1u x[t])), W1 = [W1g; W1u]
// [2F, H], W2 [H, F], g [H] (gate == false: no sigmoid factor). Returns L = <dy, y> and writes y.
double reference(const std::vector<double>& x, const std::vector<double>& w1, const std::vector<double>& w2,
                 const std::vector<double>* g, const std::vector<double>& dy, std::vector<double>* y_out = nullptr) {
  double L = 0;
  std::vector<double> y(static_cast<size_t>(kT * kH));
  for (int64_t t = 0; t < kT; ++t) {
    const double* xt = &x[static_cast<size_t>(t * kH)];
    double a[kF];
    for (int64_t f = 0; f < kF; ++f) {
      double pg = 0, pu = 0;
      for (int64_t k = 0; k < kH; ++k) {
        pg += w1[static_cast<size_t>(f * kH + k)] * xt[k];
        pu += w1[static_cast<size_t>((kF + f) * kH + k)] * xt[k];
      }
      a[f] = pg / (1.0 + std::exp(-pg)) * pu;
    }
    double s = 1.0;
    if (g) {
      double l = 0;
      for (int64_t k = 0; k < kH; ++k) l += (*g)[static_cast<size_t>(k)] * xt[k];
      s = 1.0 / (1.0 + std::exp(-l));
    }
    for (int64_t o = 0; o < kH; ++o) {
      double v = 0;
      for (int64_t f = 0; f < kF; ++f) v += w2[static_cast<size_t>(o * kF + f)] * a[f];
      y[static_cast<size_t>(t * kH + o)] = s * v;
      L += dy[static_cast<size_t>(t * kH + o)] * s * v;
    }
  }
  if (y_out) *y_out = y;
  return L;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(SharedExpertGate, RegistersMegatronsGateWeight) {
  for (bool sp : {false, true}) {
    ParamRegistry reg;
    tensor_parallel::TPContext tp{comm::make_single_rank_group(), sp};
    SharedExpertMLP m(reg, "decoder.layers.0.mlp.shared_experts", gate_config(true), tp);
    ASSERT_TRUE(m.gated());
    ASSERT_EQ(reg.params().size(), 3u);  // Megatron: MLP.__init__ (fc1, fc2), then gate_weight
    EXPECT_EQ(reg.params()[0].name, "decoder.layers.0.mlp.shared_experts.linear_fc1.weight");
    EXPECT_EQ(reg.params()[1].name, "decoder.layers.0.mlp.shared_experts.linear_fc2.weight");
    const Parameter& g = reg.params()[2];
    EXPECT_EQ(g.name, "decoder.layers.0.mlp.shared_experts.gate_weight");
    EXPECT_EQ(g.global_shape, (std::vector<int64_t>{1, kH}));
    EXPECT_EQ(reg.local_shape(2), (Shape{1, kH}));  // not split over TP
    EXPECT_FALSE(g.tensor_parallel);
    EXPECT_EQ(g.sequence_parallel, sp);  // its gradient is a partial sum over the sequence shard with SP
    EXPECT_FALSE(g.no_weight_decay);     // 2-D, not a bias: Megatron's default weight-decay group
    EXPECT_EQ(g.init, InitKind::kNormal);
  }
  ParamRegistry reg;
  SharedExpertMLP off(reg, "p", gate_config(false), tensor_parallel::TPContext{comm::make_single_rank_group()});
  EXPECT_FALSE(off.gated());
  EXPECT_EQ(reg.params().size(), 2u);
}

// Megatron's SharedExpertMLP asserts add_bias_linear == False: refused in validate, naming the flags.
TEST(SharedExpertGate, SharedExpertWithBiasIsRefused) {
  TransformerConfig c = gate_config(true);
  c.add_bias_linear = true;
  try {
    c.validate();
    ADD_FAILURE() << "a shared expert with linear biases was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bias is not supported in the shared experts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--disable-bias-linear"), std::string::npos) << e.what();
  }
}

// float32 module vs the float64 reference. Forward: 1e-5 of the largest |y| (float32 GEMMs over
// H = 8 / F = 6 terms, ~1e-7 relative each; sigmoid and silu are well conditioned here).
// Gradients: central differences of the float64 reference with step 1e-6 (truncation ~1e-12 times
// the third derivative, O(1) here; rounding ~1e-16 / 1e-6 = 1e-10), against the module's float32
// analytic gradients within 1e-5 of the tensor's largest gradient (float32 rounding only).
TEST(SharedExpertGate, MatchesFloat64ReferenceAndFiniteDifferences) {
  for (bool gate : {true, false}) {
    const TransformerConfig c = gate_config(gate);
    ParamRegistry reg;
    SharedExpertMLP m(reg, "decoder.layers.0.mlp.shared_experts", c, tensor_parallel::TPContext{comm::make_single_rank_group()});
    // Weights of O(1 / sqrt(fan-in)) so that the gate logits are O(1): sigmoid far from linear.
    std::vector<double> w1 = randn(2 * kF * kH, 1, 1.0 / std::sqrt(kH)), w2 = randn(kH * kF, 2, 1.0 / std::sqrt(kF)),
                        g = randn(kH, 3, 1.0 / std::sqrt(kH)), x = randn(kT * kH, 4, 1.0), dy = randn(kT * kH, 5, 1.0);
    const std::vector<std::vector<double>*> vals = {&w1, &w2, &g};
    for (size_t i = 0; i < reg.params().size(); ++i) {
      Parameter& p = reg.params()[i];
      p.data = to_device_f32(*vals[i], reg.local_shape(i), Device::cpu());
      p.main_grad = Tensor::zeros(reg.local_shape(i), DType::kFloat32);
    }
    const std::vector<double>* gp = gate ? &g : nullptr;
    SharedExpertCtx ctx;
    Tensor y = m.forward(to_device_f32(x, {kS, kB, kH}, Device::cpu()), ctx);
    ASSERT_EQ(y.shape(), (Shape{kS, kB, kH}));
    Tensor dx = m.backward(to_device_f32(dy, {kS, kB, kH}, Device::cpu()), ctx);
    std::vector<double> y_ref;
    reference(x, w1, w2, gp, dy, &y_ref);
    const std::vector<double> yv = to_host_f64(y);
    double fwd = 0;
    for (size_t i = 0; i < yv.size(); ++i) fwd = std::max(fwd, std::abs(yv[i] - y_ref[i]));
    EXPECT_LE(fwd, 1e-5 * max_abs(y_ref)) << "gate " << gate << " forward";
    const double eps = 1e-6;
    auto check = [&](std::vector<double>& v, const Tensor& grad, const char* what) {
      const std::vector<double> got = to_host_f64(grad);
      ASSERT_EQ(got.size(), v.size()) << what;
      std::vector<double> fd(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const double orig = v[i];
        v[i] = orig + eps;
        const double lp = reference(x, w1, w2, gp, dy);
        v[i] = orig - eps;
        const double lm = reference(x, w1, w2, gp, dy);
        v[i] = orig;
        fd[i] = (lp - lm) / (2 * eps);
      }
      const double scale = max_abs(fd);
      ASSERT_GT(scale, 0.0) << what;
      for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(got[i], fd[i], 1e-5 * scale) << what << " " << i << " gate " << gate;
    };
    check(x, dx, "input");
    check(w1, reg.params()[0].main_grad, "linear_fc1");
    check(w2, reg.params()[1].main_grad, "linear_fc2");
    if (gate) check(g, reg.params()[2].main_grad, "gate_weight");
  }
}

// bfloat16: the logits, the scores and the product are rounded to the model dtype as Megatron's
// torch code does (F.linear, sigmoid and * on bf16 tensors). The module's output against the
// float64 reference on the same (bf16-representable) values: within a few bf16 roundings (2^-8
// relative each; 4 of them: fc1/fc2 outputs, the score, the product) of the largest |y|.
TEST(SharedExpertGate, Bfloat16StaysWithinItsRounding) {
  const TransformerConfig c = gate_config(true);
  ParamRegistry reg;
  SharedExpertMLP m(reg, "p", c, tensor_parallel::TPContext{comm::make_single_rank_group()});
  auto bf16 = [](std::vector<double> v) {
    for (double& x : v) x = round_bf16(static_cast<float>(x));
    return v;
  };
  std::vector<double> w1 = bf16(randn(2 * kF * kH, 11, 0.35)), w2 = bf16(randn(kH * kF, 12, 0.4)),
                      g = bf16(randn(kH, 13, 0.35)), x = bf16(randn(kT * kH, 14, 1.0)), dy = bf16(randn(kT * kH, 15, 1.0));
  const std::vector<std::vector<double>*> vals = {&w1, &w2, &g};
  for (size_t i = 0; i < reg.params().size(); ++i) {
    Parameter& p = reg.params()[i];
    p.data = ops::cast_to(to_device_f32(*vals[i], reg.local_shape(i), Device::cpu()), DType::kBFloat16);
    p.main_grad = Tensor::zeros(reg.local_shape(i), DType::kFloat32);
  }
  SharedExpertCtx ctx;
  Tensor y = m.forward(ops::cast_to(to_device_f32(x, {kS, kB, kH}, Device::cpu()), DType::kBFloat16), ctx);
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  std::vector<double> y_ref;
  reference(x, w1, w2, &g, dy, &y_ref);
  const std::vector<double> yv = to_host_f64(y);
  double err = 0;
  for (size_t i = 0; i < yv.size(); ++i) err = std::max(err, std::abs(yv[i] - y_ref[i]));
  EXPECT_LE(err, 4 * std::ldexp(1.0, -8) * max_abs(y_ref));
  Tensor dx = m.backward(ops::cast_to(to_device_f32(dy, {kS, kB, kH}, Device::cpu()), DType::kBFloat16), ctx);
  EXPECT_EQ(dx.dtype(), DType::kBFloat16);
  EXPECT_GT(max_abs(to_host_f64(reg.params()[2].main_grad)), 0.0);
}

}  // namespace
}  // namespace megatron::transformer::moe
