// MegatronOptimizer: Adam(W) + clipping vs PyTorch (tests/reference/training/gen_adamw.py ->
// adamw_steps.txt), param groups, decoupled lr, bf16 master params, and the dynamic loss scaler
// against a hand computation of docs/megatron-reference.md#loss-scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "megatron/core/optimizer/clip_grads.h"
#include "megatron/core/optimizer/grad_scaler.h"
#include "megatron/core/optimizer/optimizer.h"
#include "test_utils/thread_group_util.h"

using namespace megatron;
using namespace megatron::optimizer;

namespace {
std::vector<float> read_floats(std::istringstream& is) {
  std::vector<float> v;
  double x;
  while (is >> x) v.push_back(static_cast<float>(x));
  return v;
}
}  // namespace

TEST(MegatronOptimizer, AdamWTenStepsMatchPyTorch) {
  std::ifstream f(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/training/adamw_steps.txt");
  ASSERT_TRUE(f);
  std::map<std::string, std::vector<float>> init;
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line)) lines.push_back(line);
  for (const auto& l : lines) {
    std::istringstream is(l);
    std::string kind, name;
    is >> kind >> name;
    if (kind == "init") init[name] = read_floats(is);
  }
  std::vector<OptimizerParam> ps(2);
  ps[0].name = "layer.weight";
  ps[0].param = Tensor::from_vector(init["layer.weight"], {4, 3});
  ps[0].main_grad = Tensor::zeros({4, 3}, DType::kFloat32);
  ps[1].name = "layer.bias";
  ps[1].param = Tensor::from_vector(init["layer.bias"], {3});
  ps[1].main_grad = Tensor::zeros({3}, DType::kFloat32);
  OptimizerConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.adam_beta1 = 0.9;
  c.adam_beta2 = 0.95;
  c.adam_eps = 1e-8;
  c.clip_grad = 1.0;
  MegatronOptimizer opt(c, ps);
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_EQ(opt.param_groups()[0].wd_mult, 1.0);  // 2-D weight decays
  EXPECT_EQ(opt.param_groups()[1].wd_mult, 0.0);  // bias does not
  Tensor w = opt.params()[0].param, b = opt.params()[1].param;
  Tensor gw = opt.params()[0].main_grad, gb = opt.params()[1].main_grad;

  int steps = 0;
  double lr = 0, norm = 0;
  for (const auto& l : lines) {
    std::istringstream is(l);
    std::string kind;
    is >> kind;
    if (kind == "step") {
      int t;
      is >> t >> lr >> norm;
    } else if (kind == "grad") {
      std::string name;
      is >> name;
      auto v = read_floats(is);
      Tensor& g = name == "layer.weight" ? gw : gb;
      std::copy(v.begin(), v.end(), g.data<float>());
      if (name == "layer.bias") {
        // Both grads loaded: set the lr as the fixture's schedule did, then step.
        auto& groups = const_cast<std::vector<ParamGroup>&>(opt.param_groups());
        groups[0].lr = lr;
        groups[0].weight_decay = 0.1;
        groups[1].lr = lr;
        groups[1].weight_decay = 0.0;
        StepResult r = opt.step();
        ASSERT_TRUE(r.update_successful);
        ASSERT_TRUE(r.grad_norm.has_value());
        // fp64-accumulated norm of fp32 grads vs torch's fp32 norm: 1e-6 relative.
        EXPECT_NEAR(*r.grad_norm, norm, 1e-6 * norm) << "step " << steps + 1;
        ++steps;
      }
    } else if (kind == "param") {
      std::string name;
      is >> name;
      auto v = read_floats(is);
      Tensor& p = name == "layer.weight" ? w : b;
      for (size_t i = 0; i < v.size(); ++i) {
        // fp32 AdamW: same operations up to association order (torch applies the decay
        // before the Adam update, FusedAdam adds it in): a few fp32 ulps -> 1e-6 relative + 1e-7.
        EXPECT_NEAR(p.data<float>()[i], v[i], 1e-6 * std::fabs(v[i]) + 1e-7) << name << "[" << i << "] step " << steps;
      }
    }
  }
  EXPECT_EQ(steps, 10);
}

TEST(MegatronOptimizer, ClipGradHandComputed) {
  // grads 3 and 4 -> norm 5; clip 1 -> coeff 1/(5 + 1e-6).
  Tensor g = Tensor::from_vector({3.0f, 4.0f}, {2});
  EXPECT_DOUBLE_EQ(get_grad_norm_fp32({g}, nullptr), 5.0);
  clip_grad_by_total_norm_fp32({g}, 1.0, 5.0);
  EXPECT_FLOAT_EQ(g.data<float>()[0], static_cast<float>(3.0 / (5.0 + 1e-6)));
  // coeff >= 1: untouched.
  Tensor h = Tensor::from_vector({0.3f, 0.4f}, {2});
  clip_grad_by_total_norm_fp32({h}, 1.0, 0.5);
  EXPECT_EQ(h.data<float>()[0], 0.3f);
  Tensor z = Tensor::from_vector({0.0f, 1.0f, 0.0f}, {3});
  EXPECT_EQ(count_zeros_fp32({z}, nullptr), 2);
}

TEST(MegatronOptimizer, NormSkipsSharedAndTpDuplicates) {
  std::vector<OptimizerParam> ps(3);
  const char* names[] = {"embedding.word_embeddings.weight", "output_layer.weight", "final_layernorm.weight"};
  for (int i = 0; i < 3; ++i) {
    ps[i].name = names[i];
    ps[i].param = Tensor::zeros({2, 2}, DType::kFloat32);
    ps[i].main_grad = Tensor::from_vector({1, 1, 1, 1}, {2, 2});
  }
  ps[0].tensor_parallel = true;
  ps[1].shared = true;           // tied duplicate: never counted
  ps[2].tensor_parallel = false;  // duplicated across TP: counted on TP rank 0 only
  OptimizerConfig c;
  c.lr = 0.0;
  c.clip_grad = 100.0;
  MegatronOptimizer rank0(c, ps, nullptr, /*tp_rank=*/0);
  EXPECT_DOUBLE_EQ(*rank0.step().grad_norm, std::sqrt(8.0));
  for (auto& p : ps) p.main_grad = Tensor::from_vector({1, 1, 1, 1}, {2, 2});
  MegatronOptimizer rank1(c, ps, nullptr, /*tp_rank=*/1);
  EXPECT_DOUBLE_EQ(*rank1.step().grad_norm, 2.0);
}

TEST(MegatronOptimizer, DecoupledLrGroupAndLoggedLr) {
  std::vector<OptimizerParam> ps(3);
  const char* names[] = {"embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight",
                         "decoder.layers.0.mlp.linear_fc1.bias"};
  for (int i = 0; i < 3; ++i) {
    ps[i].name = names[i];
    ps[i].param = i == 2 ? Tensor::zeros({4}, DType::kFloat32) : Tensor::zeros({4, 2}, DType::kFloat32);
    ps[i].main_grad = Tensor::zeros(ps[i].param.shape(), DType::kFloat32);
  }
  ps[0].is_embedding_or_output = true;
  OptimizerConfig c;
  c.lr = 1e-3;
  c.min_lr = 1e-5;
  c.decoupled_lr = 5e-4;
  c.decoupled_min_lr = 4.5e-5;
  MegatronOptimizer opt(c, ps);
  ASSERT_EQ(opt.param_groups().size(), 3u);
  EXPECT_TRUE(opt.param_groups()[0].is_decoupled_lr);
  EXPECT_EQ(opt.param_groups()[0].max_lr, 5e-4);
  EXPECT_EQ(opt.param_groups()[0].min_lr, 4.5e-5);
  OptimizerParamScheduler::Options o;
  o.max_lr = 1e-3;
  o.min_lr = 1e-5;
  o.lr_decay_steps = 100;
  o.lr_decay_style = "linear";
  OptimizerParamScheduler s(o);
  s.step(50);
  opt.apply_schedule(s);
  // linear r = 0.5: default 1e-5 + 0.5 * (1e-3 - 1e-5); decoupled 4.5e-5 + 0.5 * (5e-4 - 4.5e-5).
  EXPECT_NEAR(opt.param_groups()[1].lr, 1e-5 + 0.5 * (1e-3 - 1e-5), 1e-18);
  EXPECT_NEAR(opt.param_groups()[0].lr, 4.5e-5 + 0.5 * (5e-4 - 4.5e-5), 1e-18);
  EXPECT_EQ(opt.logged_lr(), opt.param_groups()[1].lr);  // first non-decoupled group
  EXPECT_EQ(opt.param_groups()[2].weight_decay, 0.0);     // bias group
}

TEST(MegatronOptimizer, Bf16ParamsKeepFp32Master) {
  std::vector<OptimizerParam> ps(1);
  ps[0].name = "w";
  ps[0].param = Tensor::from_vector({1.0f, 1.0f}, {1, 2}).to(DType::kBFloat16);
  ps[0].main_grad = Tensor::from_vector({1.0f, -1.0f}, {1, 2});
  OptimizerConfig c;
  c.bf16 = true;
  c.lr = 1e-4;  // far below bf16 resolution at 1.0 (2^-7): the model param must not move
  c.weight_decay = 0.0;
  c.clip_grad = 0.0;
  MegatronOptimizer opt(c, ps);
  StepResult r = opt.step();
  EXPECT_DOUBLE_EQ(*r.grad_norm, std::sqrt(2.0));  // computed even without clipping (ChainedOptimizer)
  EXPECT_FALSE(r.num_zeros_in_grad.has_value());     // None without --log-num-zeros-in-grad
  // Adam's first step moves by lr * sign(g) (m̂/sqrt(v̂) = ±1): master = 1 ∓ 1e-4 in fp32.
  EXPECT_FLOAT_EQ(opt.main_param(0).data<float>()[0], 1.0f - 1e-4f);
  EXPECT_FLOAT_EQ(opt.main_param(0).data<float>()[1], 1.0f + 1e-4f);
  auto model = opt.params()[0].param.to_float_vector();
  EXPECT_EQ(model[0], 1.0f);
  EXPECT_EQ(model[1], 1.0f);
  EXPECT_DOUBLE_EQ(opt.get_loss_scale(), 1.0);
}

TEST(DynamicGradScaler, StateMachineHandComputed) {
  // docs/megatron-reference.md#loss-scaling with window 3, hysteresis 2, min 1, start 16.
  DynamicGradScaler s(16.0, 1.0, 2.0, 0.5, 3, 2);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);  // 3 clean steps -> x2
  EXPECT_EQ(s.scale(), 32.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(true);  // hysteresis 2 -> 1: no backoff yet
  EXPECT_EQ(s.scale(), 32.0);
  EXPECT_EQ(s.hysteresis_tracker(), 1);
  s.update(true);  // hysteresis 0 -> halve
  EXPECT_EQ(s.scale(), 16.0);
  s.update(true);  // still <= 0 -> halve again
  EXPECT_EQ(s.scale(), 8.0);
  s.update(false);
  s.update(false);
  s.update(false);  // growth resets the hysteresis tracker
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.hysteresis_tracker(), 2);
  DynamicGradScaler m(2.0, 1.0, 2.0, 0.5, 1000, 1);
  m.update(true);
  m.update(true);
  m.update(true);
  EXPECT_EQ(m.scale(), 1.0);  // floored at min_scale
}

TEST(MegatronOptimizer, Fp16SkipsStepOnInf) {
  std::vector<OptimizerParam> ps(1);
  ps[0].name = "w";
  ps[0].param = Tensor::from_vector({1.0f, 2.0f}, {1, 2}).to(DType::kFloat16);
  ps[0].main_grad = Tensor::from_vector({INFINITY, 1.0f}, {1, 2});
  OptimizerConfig c;
  c.fp16 = true;
  c.lr = 0.1;
  c.initial_loss_scale = 1024;
  c.hysteresis = 1;
  c.clip_grad = 0;
  MegatronOptimizer opt(c, ps);
  StepResult r = opt.step();
  EXPECT_FALSE(r.update_successful);
  EXPECT_FALSE(r.grad_norm.has_value());
  EXPECT_EQ(opt.get_loss_scale(), 512.0);
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_EQ(opt.main_param(0).data<float>()[0], 1.0f);
  // A finite grad is unscaled by 1/scale before use: 512 -> 1.
  float* g = opt.params()[0].main_grad.data<float>();
  g[0] = 512.0f;
  g[1] = 0.0f;
  r = opt.step();
  EXPECT_TRUE(r.update_successful);
  EXPECT_FLOAT_EQ(g[0], 1.0f);
}

// Megatron's ChainedOptimizer grad statistics with expert-parallel params (set_expert_grad_stats),
// on 2 in-process ranks = 2 EP ranks. Each holds the same dense grad (as after the DP all-reduce;
// its grad-stats group is this rank alone, like a tp-pp group of size 1) and its own expert's grad
// (expert r on rank r; the expert group spans both ranks, like tp-ep-pp). Hand-computed: dense
// [3, 0] -> 9; expert 0 [1, 2] -> 5, expert 1 [0, 2] -> 4; norm sqrt(9 + 5 + 4) on both ranks,
// zeros 1 (dense, counted once) + 1 (expert 1). Without the expert group the expert part would
// count locally only (sqrt(14) on rank 0). Then one shared group (the distributed optimizer's
// world): each rank's disjoint shards, one norm over all of them. And an expert weight not split
// over expert-TP counts on expert-TP rank 0 only.
TEST(MegatronOptimizer, ChainedExpertGradNormHandComputed) {
  auto groups = megatron::testing::make_thread_groups(2);
  std::vector<double> norm(2), shared_norm(2);
  std::vector<int64_t> zeros(2);
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> errs(2);
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      try {
        auto make = [&] {
          std::vector<OptimizerParam> ps(2);
          ps[0].name = "decoder.layers.0.mlp.router.weight";
          ps[0].main_grad = Tensor::from_vector({3, 0}, {2});
          ps[1].name = "decoder.layers.0.mlp.experts.local_experts." + std::to_string(r) + ".linear_fc1.weight";
          ps[1].main_grad = r == 0 ? Tensor::from_vector({1, 2}, {2}) : Tensor::from_vector({0, 2}, {2});
          ps[1].expert_parallel = true;
          for (auto& p : ps) {
            p.param = Tensor::zeros({2}, DType::kFloat32);
            p.tensor_parallel = true;
          }
          return ps;
        };
        OptimizerConfig c;
        c.lr = 0.0;
        c.log_num_zeros_in_grad = true;
        MegatronOptimizer opt(c, make(), /*dense group: this rank*/ nullptr, 0);
        opt.set_expert_grad_stats(groups[r], /*expert_tp_rank=*/0);
        StepResult s = opt.step();
        norm[r] = *s.grad_norm;
        zeros[r] = *s.num_zeros_in_grad;
        // Shared group: rank r holds the dense shard [3, 0] (rank 0) or nothing dense (rank 1).
        auto ps = make();
        if (r == 1) ps[0].main_grad = Tensor::zeros({2}, DType::kFloat32);
        MegatronOptimizer dist(c, ps, groups[r], 0);
        dist.set_expert_grad_stats(groups[r], 0);
        shared_norm[r] = *dist.step().grad_norm;
        // Replicated over expert-TP (tensor_parallel false): expert-TP rank 1 leaves it out.
        auto rep = make();
        rep[1].tensor_parallel = false;
        MegatronOptimizer etp1(c, rep, nullptr, 0);
        etp1.set_expert_grad_stats(groups[r], /*expert_tp_rank=*/r);
        const double n = *etp1.step().grad_norm;
        if (std::abs(n - std::sqrt(9.0 + 5.0)) > 1e-12) throw std::runtime_error("expert-TP duplicate counted: " + std::to_string(n));
      } catch (...) {
        errs[r] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  for (int r = 0; r < 2; ++r) {
    EXPECT_DOUBLE_EQ(norm[r], std::sqrt(18.0)) << "rank " << r;
    EXPECT_EQ(zeros[r], 2) << "rank " << r;
    EXPECT_DOUBLE_EQ(shared_norm[r], std::sqrt(18.0)) << "rank " << r;
  }
}
