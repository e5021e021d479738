// MegatronOptimizer with --optimizer sgd against torch.optim.SGD + clip_grad_norm_
// (tests/reference/training/gen_sgd_reference.py -> sgd_steps.json): momentum 0.9 and 0, weight
// decay on the weight only (Megatron's no-decay rule for biases), clipping at 1.0 with some
// steps clipped, a changing lr, bf16 model params with fp32 main params, and an fp32 case.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/tensor/dtype.h"

using namespace megatron;
using namespace megatron::optimizer;
using json = nlohmann::json;

namespace {

json load_fixture() {
  std::ifstream f(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/training/sgd_steps.json");
  EXPECT_TRUE(f) << "missing tests/reference/training/sgd_steps.json";
  return json::parse(f);
}

std::vector<float> floats(const json& a) {
  std::vector<float> v;
  for (const auto& x : a) v.push_back(static_cast<float>(x.get<double>()));
  return v;
}

// fp32 tolerance: our update performs torch's fp32 operations in torch's order (d = g + wd*p,
// buf = momentum*buf + d, p += -lr*buf); results differ only where one side fuses a
// multiply-add (torch's vectorized add uses fmadd) and through the clip coefficient (our norm is
// accumulated in fp64, torch's in fp32): a few fp32 ulps per step, over 8 steps < 1e-6 relative
// (~8 ulps); + 1e-7 absolute for values that cancel towards zero.
constexpr double kRel = 1e-6, kAbs = 1e-7;

void run_case(const json& c) {
  const std::string name = c.at("name");
  const bool bf16 = c.at("model_dtype") == "bfloat16";
  const char* keys[] = {"layer.weight", "layer.bias"};
  std::vector<OptimizerParam> ps(2);
  for (int k = 0; k < 2; ++k) {
    Shape shape;
    for (const auto& d : c.at("shape").at(keys[k])) shape.push_back(d.get<int64_t>());
    ps[k].name = keys[k];
    Tensor p = Tensor::from_vector(floats(c.at("init").at(keys[k])), shape);
    ps[k].param = bf16 ? p.to(DType::kBFloat16) : p;  // init values are bf16-representable
    ps[k].main_grad = Tensor::zeros(shape, DType::kFloat32);
  }
  OptimizerConfig cfg;
  cfg.optimizer = "sgd";
  cfg.sgd_momentum = c.at("momentum").get<double>();
  cfg.weight_decay = 0.1;
  cfg.clip_grad = c.at("clip_grad").get<double>();
  cfg.bf16 = bf16;
  cfg.lr = 0.1;
  MegatronOptimizer opt(cfg, ps);
  ASSERT_EQ(opt.param_groups().size(), 2u) << name;
  ASSERT_EQ(opt.param_groups()[0].params, std::vector<size_t>{0}) << name;  // weight: decays
  ASSERT_EQ(opt.param_groups()[1].params, std::vector<size_t>{1}) << name;  // bias: no decay
  for (int k = 0; k < 2; ++k) {
    // A momentum buffer exists (zeros) exactly when momentum != 0.
    EXPECT_EQ(opt.momentum_buffer(k).defined(), cfg.sgd_momentum != 0.0) << name;
    EXPECT_EQ(opt.main_param(k).data_ptr() == opt.params()[k].param.data_ptr(), !bf16) << name;
  }
  int steps = 0;
  for (const auto& s : c.at("steps")) {
    const int t = s.at("step").get<int>();
    for (int k = 0; k < 2; ++k) {
      auto g = floats(s.at("grad").at(keys[k]));
      std::copy(g.begin(), g.end(), opt.params()[k].main_grad.data<float>());
    }
    auto& groups = opt.mutable_param_groups();
    for (auto& grp : groups) {
      grp.lr = s.at("lr").get<double>();
      grp.weight_decay = 0.1 * grp.wd_mult;
    }
    StepResult r = opt.step();
    ASSERT_TRUE(r.update_successful) << name;
    const double norm = s.at("grad_norm").get<double>();
    // fp64-accumulated norm of fp32 grads vs torch's fp32 norm: 1e-6 relative.
    EXPECT_NEAR(*r.grad_norm, norm, 1e-6 * norm) << name << " step " << t;
    for (int k = 0; k < 2; ++k) {
      const std::string at = name + " " + keys[k] + " step " + std::to_string(t);
      auto want = floats(s.at("main_param").at(keys[k]));
      auto got = opt.main_param(k).to_float_vector();
      ASSERT_EQ(got.size(), want.size()) << at;
      for (size_t e = 0; e < want.size(); ++e)
        EXPECT_NEAR(got[e], want[e], kRel * std::fabs(want[e]) + kAbs) << at << " main[" << e << "]";
      // Model param: the bf16 rounding of our fp32 main param, bit for bit, and so within one bf16
      // ulp (2^-8 relative) of torch's where the fp32 values straddle a rounding boundary.
      auto model = opt.params()[k].param.to_float_vector();
      auto want_model = floats(s.at("model_param").at(keys[k]));
      for (size_t e = 0; e < want.size(); ++e) {
        EXPECT_EQ(model[e], bf16 ? round_bf16(got[e]) : got[e]) << at << " model[" << e << "]";
        EXPECT_NEAR(model[e], want_model[e], std::ldexp(std::fabs(want_model[e]), -8)) << at << " model[" << e << "]";
      }
      const json& wb = s.at("momentum_buffer").at(keys[k]);
      if (wb.is_null()) {
        EXPECT_FALSE(opt.momentum_buffer(k).defined()) << at;  // torch keeps None with momentum 0
      } else {
        ASSERT_TRUE(opt.momentum_buffer(k).defined()) << at;
        auto wbuf = floats(wb);
        auto buf = opt.momentum_buffer(k).to_float_vector();
        for (size_t e = 0; e < wbuf.size(); ++e)
          EXPECT_NEAR(buf[e], wbuf[e], kRel * std::fabs(wbuf[e]) + kAbs) << at << " momentum_buffer[" << e << "]";
      }
    }
    ++steps;
  }
  EXPECT_EQ(steps, 8) << name;
  EXPECT_EQ(opt.step_count(), 8) << name;
}

}  // namespace

TEST(SgdOptimizer, MatchesTorchSgdBf16Momentum) { run_case(load_fixture().at("cases").at(0)); }
TEST(SgdOptimizer, MatchesTorchSgdBf16NoMomentum) { run_case(load_fixture().at("cases").at(1)); }
TEST(SgdOptimizer, MatchesTorchSgdFp32NoClip) { run_case(load_fixture().at("cases").at(2)); }

// The main grad is left as it was (torch adds the weight decay out of place); the first step's
// momentum buffer is d = g + wd * p exactly (hand computation: g = 0.5, wd = 0.1, p = 2 -> 0.7).
TEST(SgdOptimizer, FirstStepBufferIsDecayedGradAndGradUntouched) {
  std::vector<OptimizerParam> ps(1);
  ps[0].name = "w";
  ps[0].param = Tensor::from_vector({2.0f, -4.0f}, {1, 2});
  ps[0].main_grad = Tensor::from_vector({0.5f, 0.25f}, {1, 2});
  OptimizerConfig cfg;
  cfg.optimizer = "sgd";
  cfg.sgd_momentum = 0.9;
  cfg.weight_decay = 0.1;
  cfg.clip_grad = 0.0;
  cfg.lr = 0.5;
  MegatronOptimizer opt(cfg, ps);
  opt.step();
  auto buf = opt.momentum_buffer(0).to_float_vector();
  EXPECT_FLOAT_EQ(buf[0], 0.5f + 0.1f * 2.0f);
  EXPECT_FLOAT_EQ(buf[1], 0.25f + 0.1f * -4.0f);
  auto g = opt.params()[0].main_grad.to_float_vector();
  EXPECT_EQ(g[0], 0.5f);
  EXPECT_EQ(g[1], 0.25f);
  auto p = opt.main_param(0).to_float_vector();
  EXPECT_FLOAT_EQ(p[0], 2.0f - 0.5f * 0.7f);
  EXPECT_FLOAT_EQ(p[1], -4.0f - 0.5f * (0.25f - 0.4f));
}
