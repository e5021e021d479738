// FP8 weight cache (docs/fp8.md "Weight cache"; Transformer Engine's is_first_microbatch): the
// weight is cast once per training step and reused by every micro-batch's forward and backward;
// the cast is redone after the scale update (reduce_and_update), after a parameter update
// (megatron::bump_param_version: optimizer step, checkpoint load), after a checkpoint restore of
// the FP8 state, and when a training forward finds only an evaluation cast (which did not record
// the weight's amax). Expected values: hand computations on E4M3-exact operands, and the
// uncached path (MEGATRON_FP8_WEIGHT_CACHE=0 behaviour) for bit-equality of whole sequences.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/utils/param_version.h"

using namespace megatron;
using namespace megatron::fp8;

namespace {
std::vector<float> vec(const Tensor& t) { return t.to_float_vector(); }

Fp8Config delayed_cfg() {
  Fp8Config c;
  c.amax_history_len = 2;
  c.amax_compute_algo = AmaxComputeAlgo::kMax;
  return c;
}

// One micro-batch: forward and backward of y = x w^T.
struct Grads {
  std::vector<float> y, dx, dw;
};
Grads microbatch(Fp8State& st, int base, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dw) {
  Tensor y = Tensor::empty({x.size(0), w.size(0)}, DType::kFloat32);
  linear_forward(st, base, x, w, nullptr, y);
  Tensor dx = Tensor::empty(x.shape(), DType::kFloat32);
  linear_backward(st, base, dy, x, w, &dx, &dw, nullptr, /*accumulate=*/true);
  return {vec(y), vec(dx), vec(dw)};
}
}  // namespace

TEST(Fp8WeightCache, OneCastPerStepForAllMicrobatches) {
  Fp8State st(delayed_cfg(), Device::cpu());
  ASSERT_TRUE(st.weight_cache_enabled());
  const int base = st.register_linear("l");
  Tensor x = Tensor::from_vector({1.0f, 2.0f, -0.5f, 4.0f}, {2, 2});
  Tensor w = Tensor::from_vector({1.0f, 0.0f, 0.5f, 0.25f, -2.0f, 3.0f}, {3, 2});
  Tensor dy = Tensor::from_vector(std::vector<float>(6, 0.25f), {2, 3});
  Tensor dw = Tensor::zeros({3, 2}, DType::kFloat32);
  for (int mb = 0; mb < 4; ++mb) microbatch(st, base, x, w, dy, dw);
  EXPECT_EQ(st.weight_casts(), 1);  // 4 forwards + 4 dgrads, one cast
  EXPECT_EQ(vec(st.amax(base + kWeight))[0], 3.0f);  // recorded by that cast
  st.reduce_and_update(nullptr);                      // new step, new scales: cast again
  microbatch(st, base, x, w, dy, dw);
  EXPECT_EQ(st.weight_casts(), 2);
  microbatch(st, base, x, w, dy, dw);
  EXPECT_EQ(st.weight_casts(), 2);
}

TEST(Fp8WeightCache, ParamVersionBumpRecastsAndInPlaceChangeWithoutBumpIsNotSeen) {
  Fp8State st(delayed_cfg(), Device::cpu());
  const int base = st.register_linear("l");
  Tensor x = Tensor::from_vector({1.0f, 2.0f}, {1, 2});
  Tensor w = Tensor::from_vector({1.0f, 1.0f}, {1, 2});
  Tensor y = Tensor::empty({1, 1}, DType::kFloat32);
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(vec(y)[0], 3.0f);  // 1*1 + 2*1
  // The contract: weights written in place must be announced. Without the bump the cached
  // cast of this step is still used (this is what makes the cache a cache)...
  w.fill_(2.0f);
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(vec(y)[0], 3.0f);
  EXPECT_EQ(st.weight_casts(), 1);
  // ... and after bump_param_version (what the optimizer step and checkpoint load do) the new
  // weight is cast: 1*2 + 2*2 = 6 (2 is exact in E4M3 at scale 1).
  bump_param_version();
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(vec(y)[0], 6.0f);
  EXPECT_EQ(st.weight_casts(), 2);
  // Another storage (same shape) is never mistaken for the cached one.
  Tensor w2 = Tensor::from_vector({0.5f, 0.5f}, {1, 2});
  linear_forward(st, base, x, w2, nullptr, y);
  EXPECT_EQ(vec(y)[0], 1.5f);
  EXPECT_EQ(st.weight_casts(), 3);
}

TEST(Fp8WeightCache, OptimizerStepBumpsTheParamVersion) {
  optimizer::OptimizerConfig oc;
  oc.optimizer = "sgd";
  oc.lr = 0.1;
  oc.clip_grad = 0.0;
  optimizer::OptimizerParam p;
  p.name = "w";
  p.param = Tensor::from_vector({1.0f, 1.0f}, {2});
  p.main_grad = Tensor::from_vector({1.0f, 1.0f}, {2});
  optimizer::MegatronOptimizer opt(oc, {p});
  const uint64_t v0 = param_version();
  opt.step();
  EXPECT_GT(param_version(), v0);
}

TEST(Fp8WeightCache, EvaluationCastDoesNotHideTheStepAmax) {
  Fp8State st(delayed_cfg(), Device::cpu());
  const int base = st.register_linear("l");
  Tensor x = Tensor::from_vector({1.0f, 2.0f}, {1, 2});
  Tensor w = Tensor::from_vector({0.5f, -1.5f}, {1, 2});
  Tensor y = Tensor::empty({1, 1}, DType::kFloat32);
  st.set_recording(false);  // evaluation forward: casts, records nothing
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(vec(st.amax(base + kWeight))[0], 0.0f);
  linear_forward(st, base, x, w, nullptr, y);  // evaluation again: reuses its cast
  EXPECT_EQ(st.weight_casts(), 1);
  st.set_recording(true);  // training forward: must record the weight amax of this step
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(vec(st.amax(base + kWeight))[0], 1.5f);
  EXPECT_EQ(st.weight_casts(), 2);
  linear_forward(st, base, x, w, nullptr, y);
  st.set_recording(false);
  linear_forward(st, base, x, w, nullptr, y);  // a recorded cast serves evaluation too
  EXPECT_EQ(st.weight_casts(), 2);
}

TEST(Fp8WeightCache, CheckpointRestoreInvalidates) {
  Fp8State st(delayed_cfg(), Device::cpu());
  const int base = st.register_linear("l");
  Tensor x = Tensor::from_vector({1.0f, 2.0f}, {1, 2});
  Tensor w = Tensor::from_vector({1.0f, 1.0f}, {1, 2});
  Tensor y = Tensor::empty({1, 1}, DType::kFloat32);
  linear_forward(st, base, x, w, nullptr, y);
  const uint64_t e = st.scale_epoch();
  st.restore_checkpoint_tensors(st.checkpoint_tensors(), {});
  EXPECT_GT(st.scale_epoch(), e);
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(st.weight_casts(), 2);
}

// Several steps of 3 micro-batches with scale updates, weight updates (bump), an evaluation
// forward between steps, delayed and tensorwise recipes: cached and uncached runs agree
// bit-for-bit in outputs, gradients, amax histories and scales.
TEST(Fp8WeightCache, SameNumericsAsUncached) {
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kTensorwise}) {
    Fp8Config c = delayed_cfg();
    c.recipe = recipe;
    Fp8State on(c, Device::cpu()), off(c, Device::cpu());
    off.set_weight_cache_enabled(false);
    const int b_on = on.register_linear("l"), b_off = off.register_linear("l");
    const int64_t N = 4, in = 8, out = 6;
    std::vector<float> xv(N * in), wv(out * in), dyv(N * out);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.37f * static_cast<float>((i * 7) % 11) - 1.3f;
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.011f * static_cast<float>((i * 5) % 13) - 0.05f;
    for (size_t i = 0; i < dyv.size(); ++i) dyv[i] = 1e-3f * static_cast<float>((i * 3) % 7) - 2e-3f;
    Tensor x = Tensor::from_vector(xv, {N, in}), dy = Tensor::from_vector(dyv, {N, out});
    Tensor w_on = Tensor::from_vector(wv, {out, in}), w_off = Tensor::from_vector(wv, {out, in});
    for (int step = 0; step < 4; ++step) {
      Tensor dw_on = Tensor::zeros({out, in}, DType::kFloat32), dw_off = Tensor::zeros({out, in}, DType::kFloat32);
      for (int mb = 0; mb < 3; ++mb) {
        Grads a = microbatch(on, b_on, x, w_on, dy, dw_on), b = microbatch(off, b_off, x, w_off, dy, dw_off);
        EXPECT_EQ(a.y, b.y) << "step " << step << " mb " << mb;
        EXPECT_EQ(a.dx, b.dx) << "step " << step << " mb " << mb;
        EXPECT_EQ(a.dw, b.dw) << "step " << step << " mb " << mb;
      }
      on.reduce_and_update(nullptr);
      off.reduce_and_update(nullptr);
      for (int r = 0; r < kNumRoles; ++r) {
        EXPECT_EQ(on.meta(r).amax_history, off.meta(r).amax_history) << "role " << r;
        EXPECT_EQ(on.host_scale(r), off.host_scale(r)) << "role " << r;
      }
      // "Optimizer step": w -= 0.5 * dw, then the bump the optimizer does.
      std::vector<float> w = vec(w_on), g = vec(dw_on);
      for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * g[i];
      w_on.copy_(Tensor::from_vector(w, {out, in}));
      w_off.copy_(Tensor::from_vector(w, {out, in}));
      bump_param_version();
      // Evaluation forward between steps.
      on.set_recording(false);
      off.set_recording(false);
      Tensor ya = Tensor::empty({N, out}, DType::kFloat32), yb = Tensor::empty({N, out}, DType::kFloat32);
      linear_forward(on, b_on, x, w_on, nullptr, ya);
      linear_forward(off, b_off, x, w_off, nullptr, yb);
      EXPECT_EQ(vec(ya), vec(yb));
      on.set_recording(true);
      off.set_recording(true);
    }
    // Cached: one training cast per step plus one evaluation cast per step; uncached: one per GEMM
    // that reads the weight (forward + dgrad per micro-batch, plus the evaluation forward).
    EXPECT_EQ(on.weight_casts(), 4 * 2);
    EXPECT_EQ(off.weight_casts(), 4 * (3 * 2 + 1));
  }
}

int g_free_calls = 0;
int64_t fake_free_bytes() {
  ++g_free_calls;
  return (int64_t(4) << 30) + 250;  // the 4 GiB margin + 250 bytes of budget
}

// kAuto on a GPU (here with a stand-in for the device's free memory): nothing is cached in the
// first step; then linears are admitted in first-use order while they fit the budget measured
// once (free memory - 4 GiB), and keep their answer.
TEST(Fp8WeightCache, AutoModeAdmitsAgainstTheFreeMemoryBudget) {
  Fp8State st(delayed_cfg(), Device::cpu());
  ASSERT_EQ(st.weight_cache_mode(), Fp8State::WeightCacheMode::kAuto);
  const int b0 = st.register_linear("a"), b1 = st.register_linear("b"), b2 = st.register_linear("c");
  Fp8State::reset_weight_cache_budgets();
  g_free_calls = 0;
  EXPECT_FALSE(st.weight_cache_admit(b0, 100, &fake_free_bytes));  // first step
  EXPECT_EQ(g_free_calls, 0);
  EXPECT_EQ(st.weight_cache_budget_left(), -1);
  st.reduce_and_update(nullptr);
  EXPECT_TRUE(st.weight_cache_admit(b0, 100, &fake_free_bytes));   // budget 250 -> 150
  EXPECT_FALSE(st.weight_cache_admit(b1, 200, &fake_free_bytes));  // does not fit
  EXPECT_TRUE(st.weight_cache_admit(b2, 150, &fake_free_bytes));   // fits exactly -> 0
  EXPECT_TRUE(st.weight_cache_admit(b0, 100, &fake_free_bytes));   // decisions stick
  EXPECT_FALSE(st.weight_cache_admit(b1, 1, &fake_free_bytes));
  EXPECT_EQ(g_free_calls, 1);
  EXPECT_EQ(st.weight_cache_admitted_bytes(), 250);
  EXPECT_EQ(st.weight_cache_budget_left(), 0);
  // A second state on the same device (e.g. another model chunk) draws from the same budget.
  Fp8State other(delayed_cfg(), Device::cpu());
  const int o0 = other.register_linear("d");
  other.reduce_and_update(nullptr);
  EXPECT_FALSE(other.weight_cache_admit(o0, 1, &fake_free_bytes));
  EXPECT_EQ(g_free_calls, 1);
  Fp8State::reset_weight_cache_budgets();
  EXPECT_TRUE(st.weight_cache_admit(b1, 200, nullptr));  // host memory: no budget
  st.set_weight_cache_mode(Fp8State::WeightCacheMode::kOn);
  EXPECT_TRUE(st.weight_cache_admit(b1, 200, &fake_free_bytes));
  st.set_weight_cache_mode(Fp8State::WeightCacheMode::kOff);
  EXPECT_FALSE(st.weight_cache_admit(b0, 100, &fake_free_bytes));
}

TEST(Fp8WeightCache, EnvironmentSwitchesItOff) {
  ::setenv("MEGATRON_FP8_WEIGHT_CACHE", "0", 1);
  Fp8State st(delayed_cfg(), Device::cpu());
  ::unsetenv("MEGATRON_FP8_WEIGHT_CACHE");
  EXPECT_FALSE(st.weight_cache_enabled());
  const int base = st.register_linear("l");
  Tensor x = Tensor::from_vector({1.0f, 2.0f}, {1, 2});
  Tensor w = Tensor::from_vector({1.0f, 1.0f}, {1, 2});
  Tensor y = Tensor::empty({1, 1}, DType::kFloat32);
  linear_forward(st, base, x, w, nullptr, y);
  linear_forward(st, base, x, w, nullptr, y);
  EXPECT_EQ(st.weight_casts(), 2);
  EXPECT_FALSE(st.weight_cache(base).q.defined());  // holds no memory
  Fp8State st2(delayed_cfg(), Device::cpu());
  EXPECT_TRUE(st2.weight_cache_enabled());
  EXPECT_EQ(st2.weight_cache_mode(), Fp8State::WeightCacheMode::kAuto);
  ::setenv("MEGATRON_FP8_WEIGHT_CACHE", "1", 1);
  Fp8State st3(delayed_cfg(), Device::cpu());
  ::unsetenv("MEGATRON_FP8_WEIGHT_CACHE");
  EXPECT_EQ(st3.weight_cache_mode(), Fp8State::WeightCacheMode::kOn);
}
