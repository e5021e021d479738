// Data parallelism end to end: DP ranks training a tiny GPT with DistributedDataParallel (and the
// distributed optimizer's reduce-scatter / all-gather) reproduce the single-rank run of the same
// model on the same global batch. Runs under tests/functional_tests/dist_ddp.sh (mpirun -np 2/4);
// skipped as a single process.
//
// Reference: every rank also trains a single-rank copy of the model on the WHOLE global batch
// (no communication). The optimizer in both runs is Adam written out from its formula
// (docs/megatron-reference.md#adam), applied by the test -- the DP run applies it only to this rank's shard
// when the distributed optimizer is on, then all-gathers.
// Tolerance 1e-5 relative (losses; parameters relative to the largest |parameter|): the two runs
// differ only in fp32 summation order of the gradient (per-rank partial sums then a reduction).
// Why this holds on any CPU: both runs back-propagate each sample alone with the same shapes and
// kernels, with loss scales 1/global vs 1/per_rank (then the DP average 1/dp), powers of two for
// DP 2 and 4, so the per-sample gradients are bitwise proportional whatever kernels OpenBLAS
// picks; only the association of the 2*dp per-sample terms differs, ~2*dp*u (u = 2^-24) of the
// largest term. Adam turns a gradient difference dg into a step difference <= lr*dg*eps/(|g|+eps)^2:
// with dg ~ 5e-7 of the terms, that stays below 1e-5 unless an element's gradient cancels to
// ~eps = 1e-8 from terms above ~1e-3, which the exact-zero gradients (the key bias: softmax ignores
// a per-query constant) do not do: their terms are rounding noise themselves (~1e-9).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_utils/dist_test_util.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/optimizer/distributed_optimizer.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using distributed::DistributedDataParallel;
using distributed::DistributedDataParallelConfig;
using models::gpt::GPTModel;

constexpr int64_t kVocab = 128, kSeq = 16;

transformer::TransformerConfig tiny_config() { return megatron::testing::tiny_gpt_config(32); }

datasets::GPTBatch sample(int iter, int index) {
  std::mt19937 gen(1000 * iter + index);
  std::uniform_int_distribution<int64_t> tok(0, kVocab - 1);
  std::vector<int64_t> t(kSeq + 1), pos(kSeq);
  for (auto& x : t) x = tok(gen);
  std::vector<float> mask(kSeq, 1.0f);
  mask[index % kSeq] = 0.0f;  // one masked token per sample, varying
  for (int64_t i = 0; i < kSeq; ++i) pos[i] = i;
  datasets::GPTBatch b;
  b.tokens = Tensor::from_vector_i64(std::vector<int64_t>(t.begin(), t.end() - 1), {1, kSeq});
  b.labels = Tensor::from_vector_i64(std::vector<int64_t>(t.begin() + 1, t.end()), {1, kSeq});
  b.position_ids = Tensor::from_vector_i64(pos, {1, kSeq});
  b.loss_mask = Tensor::from_vector(mask, {1, kSeq});
  return b;
}

// Forward+backward of one micro-batch; returns its loss Σ(loss·mask)/Σmask (Megatron's default).
double micro_step(GPTModel& m, const datasets::GPTBatch& b, int num_microbatches) {
  Tensor loss = m.forward(b, true);
  std::vector<float> l = loss.to_float_vector(), mask = b.loss_mask.to_float_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    num += double(l[i]) * mask[i];
    den += mask[i];
  }
  std::vector<float> d(mask.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = float(mask[i] / den / num_microbatches);
  m.backward(Tensor::from_vector(d, loss.shape()));
  return num / den;
}

// Adam (decoupled weight decay) on elements [lo, hi) of the flat fp32 buffers.
struct Adam {
  std::vector<float> m, v;
  int step = 0;
  void update(Tensor& p, const Tensor& g, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    if (m.empty()) m.assign(p.numel(), 0.f), v.assign(p.numel(), 0.f);
    ++step;
    float* P = p.data<float>();
    const float* G = g.data<float>();
    const float c1 = 1.f - std::pow(b1, float(step)), c2 = 1.f - std::pow(b2, float(step));
    for (auto [lo, hi] : ranges)
      for (int64_t i = lo; i < hi; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * G[i];
        v[i] = b2 * v[i] + (1 - b2) * G[i] * G[i];
        P[i] -= lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + eps) + wd * P[i]);
      }
  }
};

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}

void run_dp_equivalence(const DistributedDataParallelConfig& cfg, bool simulate_overlap_hooks, int iters = 3) {
  auto world = testing::dist_world();
  const int dp = world->size(), r = world->rank();
  const int per_rank = 2, global = per_rank * dp;
  GPTModel ref(tiny_config(), kVocab, kSeq, /*seed=*/77);
  GPTModel model(tiny_config(), kVocab, kSeq, /*seed=*/77);
  ASSERT_EQ(ref.param_buffer().to_float_vector(), model.param_buffer().to_float_vector()) << "same init";
  DistributedDataParallel ddp(cfg, model.buffers(), model.parameters(), world);
  if (cfg.bucket_size) EXPECT_GT(ddp.buckets().size(), 1u);
  Adam ref_opt, opt;
  const int64_t N = ref.param_buffer().numel();
  for (int it = 0; it < iters; ++it) {
    // Reference: the whole global batch on one model.
    ref.zero_grad();
    double ref_loss = 0;
    for (int i = 0; i < global; ++i) ref_loss += micro_step(ref, sample(it, i), global) / global;
    ref_opt.update(ref.param_buffer(), ref.grad_buffer(), {{0, N}});
    // DP: this rank's consecutive slice of the global batch.
    ddp.zero_grad_buffer();
    double loss = 0;
    for (int i = 0; i < per_rank; ++i) loss += micro_step(model, sample(it, r * per_rank + i), per_rank) / per_rank;
    if (simulate_overlap_hooks)  // what the model's backward hooks report: params in backward order
      for (size_t p = model.parameters().size(); p-- > 0;) ddp.register_grad_ready(p);
    ddp.finish_grad_sync();
    Tensor l = Tensor::from_vector({float(loss)}, {1});
    world->all_reduce(l, comm::ReduceOp::kAvg);  // Megatron's logged loss: DP average
    EXPECT_NEAR(l.item(), ref_loss, 1e-5 * std::fabs(ref_loss)) << "iteration " << it;
    std::vector<std::pair<int64_t, int64_t>> mine;
    if (cfg.use_distributed_optimizer) {
      for (const auto& b : ddp.buckets()) mine.push_back({b.shard_start, b.shard_end});
      // The reduced slice must equal the reference gradient there.
      auto g = model.grad_buffer().to_float_vector(), gr = ref.grad_buffer().to_float_vector();
      double err = 0;
      for (auto [lo, hi] : mine)
        for (int64_t i = lo; i < hi; ++i) err = std::max(err, double(std::fabs(g[i] - gr[i])));
      EXPECT_LE(err, 1e-5 * max_abs(gr)) << "grad shard, iteration " << it;
    } else {
      mine.push_back({0, N});
      auto g = model.grad_buffer().to_float_vector(), gr = ref.grad_buffer().to_float_vector();
      double err = 0;
      for (int64_t i = 0; i < N; ++i) err = std::max(err, double(std::fabs(g[i] - gr[i])));
      EXPECT_LE(err, 1e-5 * max_abs(gr)) << "grads, iteration " << it;
    }
    opt.update(model.param_buffer(), model.grad_buffer(), mine);
    if (cfg.use_distributed_optimizer) {
      ddp.start_param_sync();
      ddp.finish_param_sync();
    }
  }
  auto p = model.param_buffer().to_float_vector(), pr = ref.param_buffer().to_float_vector();
  double err = 0;
  for (int64_t i = 0; i < N; ++i) err = std::max(err, double(std::fabs(p[i] - pr[i])));
  EXPECT_LE(err, 1e-5 * max_abs(pr)) << "final parameters";
  // Every DP replica holds identical parameters.
  Tensor mx = model.param_buffer().clone(), mn = model.param_buffer().clone();
  world->all_reduce(mx, comm::ReduceOp::kMax);
  world->all_reduce(mn, comm::ReduceOp::kMin);
  EXPECT_EQ(mx.to_float_vector(), mn.to_float_vector());
}

TEST(DistDDP, AllReduceSingleBucketMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  run_dp_equivalence(DistributedDataParallelConfig{}, false);
}

TEST(DistDDP, OverlapGradReduceSmallBucketsMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  DistributedDataParallelConfig c;
  c.overlap_grad_reduce = true;
  c.bucket_size = 3000;
  run_dp_equivalence(c, true);
}

TEST(DistDDP, DistributedOptimizerMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  DistributedDataParallelConfig c;
  c.use_distributed_optimizer = true;
  run_dp_equivalence(c, false);
}

TEST(DistDDP, DistributedOptimizerOverlapUnevenBucketsMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  DistributedDataParallelConfig c;
  c.use_distributed_optimizer = true;
  c.overlap_grad_reduce = true;
  c.overlap_param_gather = true;
  c.bucket_size = 2999;  // bucket sizes not divisible by DP: the padded staging path
  run_dp_equivalence(c, true);
}

// The training helper's MegatronOptimizer (Adam + clipping at 0.05, so every step clips) driven
// by DDP: plain (every rank steps all parameters, grad norm local: grads are already reduced) and
// distributed (each rank steps its slices, grad norm all-reduced over the DP group, then the
// parameter all-gather). Reference: the same optimizer on the single-rank model. Checks the loss,
// the reported grad norm (before clipping) and the final parameters within 1e-5.
void run_with_megatron_optimizer(bool distributed_optimizer) {
  auto world = testing::dist_world();
  const int dp = world->size(), r = world->rank();
  const int per_rank = 2, global = per_rank * dp;
  optimizer::OptimizerConfig oc;
  oc.lr = 1e-3;
  oc.weight_decay = 0.1;
  oc.clip_grad = 0.05;
  oc.use_distributed_optimizer = distributed_optimizer;
  OptimizerParamScheduler::Options so;
  so.max_lr = so.min_lr = so.init_lr = 1e-3;
  so.lr_decay_style = "constant";
  so.start_wd = so.end_wd = 0.1;
  so.lr_decay_steps = 100;
  OptimizerParamScheduler sched(so);
  GPTModel ref(tiny_config(), kVocab, kSeq, 31), model(tiny_config(), kVocab, kSeq, 31);
  DistributedDataParallelConfig dc;
  dc.use_distributed_optimizer = distributed_optimizer;
  dc.bucket_size = 2500;
  dc.overlap_grad_reduce = true;
  DistributedDataParallel ddp(dc, model.buffers(), model.parameters(), world);
  optimizer::MegatronOptimizer ref_opt(oc, optimizer::optimizer_params(ref.parameters()));
  optimizer::MegatronOptimizer opt(oc,
                                   distributed_optimizer ? optimizer::distributed_optimizer_params(ddp)
                                                         : optimizer::optimizer_params(model.parameters()),
                                   distributed_optimizer ? world : nullptr);
  ref_opt.apply_schedule(sched);
  opt.apply_schedule(sched);
  for (int it = 0; it < 3; ++it) {
    ref.zero_grad();
    double ref_loss = 0;
    for (int i = 0; i < global; ++i) ref_loss += micro_step(ref, sample(it, i), global) / global;
    auto ref_res = ref_opt.step();
    ddp.zero_grad_buffer();
    double loss = 0;
    for (int i = 0; i < per_rank; ++i) loss += micro_step(model, sample(it, r * per_rank + i), per_rank) / per_rank;
    for (size_t p = model.parameters().size(); p-- > 0;) ddp.register_grad_ready(p);
    distributed::FinalizeGroups fg;
    fg.dp_group = world;
    distributed::finalize_model_grads({&ddp}, fg);
    auto res = opt.step();
    if (distributed_optimizer) {
      ddp.start_param_sync();
      ddp.finish_param_sync();
    }
    Tensor l = Tensor::from_vector({float(loss)}, {1});
    world->all_reduce(l, comm::ReduceOp::kAvg);
    EXPECT_NEAR(l.item(), ref_loss, 1e-5 * std::fabs(ref_loss)) << "loss, iteration " << it;
    ASSERT_TRUE(res.grad_norm && ref_res.grad_norm);
    EXPECT_NEAR(*res.grad_norm, *ref_res.grad_norm, 1e-5 * *ref_res.grad_norm) << "grad norm, iteration " << it;
    EXPECT_GT(*ref_res.grad_norm, oc.clip_grad) << "the test means to exercise clipping";
  }
  auto p = model.param_buffer().to_float_vector(), pr = ref.param_buffer().to_float_vector();
  double err = 0;
  for (size_t i = 0; i < p.size(); ++i) err = std::max(err, double(std::fabs(p[i] - pr[i])));
  EXPECT_LE(err, 1e-5 * max_abs(pr)) << "final parameters";
}

TEST(DistDDP, MegatronOptimizerWithDDPMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  run_with_megatron_optimizer(false);
}

TEST(DistDDP, DistributedMegatronOptimizerMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  run_with_megatron_optimizer(true);
}

TEST(DDPConfig, BucketsFollowMegatronRules) {
  // One process: layout only. Megatron: no overlap and no size -> one bucket; otherwise close a
  // bucket once it holds >= bucket_size elements, walking the buffer front to back.
  GPTModel m(tiny_config(), kVocab, kSeq, 1);
  auto single = comm::make_single_rank_group();
  DistributedDataParallel one({}, m.buffers(), m.parameters(), single);
  ASSERT_EQ(one.buckets().size(), 1u);
  EXPECT_EQ(one.buckets()[0].start, 0);
  EXPECT_EQ(one.buckets()[0].end, m.param_buffer().numel());
  DistributedDataParallelConfig c;
  c.bucket_size = 1000;
  DistributedDataParallel many(c, m.buffers(), m.parameters(), single);
  int64_t expect_start = 0;
  for (const auto& b : many.buckets()) {
    EXPECT_EQ(b.start, expect_start);
    // Closed at the first parameter boundary at or beyond 1000 elements (except the last).
    const auto& last = m.buffers().range(b.params.back());
    EXPECT_EQ(b.end, last.second);
    if (&b != &many.buckets().back()) {
      EXPECT_GE(b.end - b.start, 1000);
      EXPECT_LT(b.end - b.start - (last.second - last.first), 1000);
    }
    expect_start = b.end;
  }
  EXPECT_EQ(expect_start, m.param_buffer().numel());
  DistributedDataParallelConfig bad;
  bad.overlap_param_gather = true;
  EXPECT_THROW(DistributedDataParallel(bad, m.buffers(), m.parameters(), single), UserError);
}

// Megatron's buffer grouping by is_expert_parallel: an `include` mask lays out only the held
// params (reverse registration order, contiguous from 0) and leaves the others untouched; the DDP
// buckets only what its buffer holds, and an expert-parallel DDP pre-scales by 1/(DP x CP) even
// when its expt-dp group is a single rank (EP = world: expt-DP 1, DP 2 -> grads halved).
TEST(DDPConfig, ExpertParallelBufferHoldsItsParamsAndScalesByDpCp) {
  std::vector<Parameter> ps(3);
  for (size_t i = 0; i < ps.size(); ++i) ps[i].name = "p" + std::to_string(i);
  const std::vector<Shape> shapes{{2}, {3}, {4}};
  distributed::ParamAndGradBuffer dense(ps, shapes, DType::kFloat32, DType::kFloat32, Device::cpu(), true, {},
                                        {true, false, true});
  distributed::ParamAndGradBuffer expert(ps, shapes, DType::kFloat32, DType::kFloat32, Device::cpu(), true, {},
                                         {false, true, false});
  EXPECT_EQ(dense.numel(), 6);
  EXPECT_EQ(dense.range(2), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(dense.range(0), (std::pair<int64_t, int64_t>{4, 6}));
  EXPECT_FALSE(dense.has(1));
  EXPECT_EQ(expert.numel(), 3);
  EXPECT_TRUE(expert.has(1));
  EXPECT_EQ(ps[1].main_grad.data_ptr(), expert.grad_data().data_ptr());
  EXPECT_EQ(ps[0].main_grad.data_ptr(), static_cast<char*>(dense.grad_data().data_ptr()) + 4 * sizeof(float));
  auto single = comm::make_single_rank_group();
  DistributedDataParallel d({}, dense, ps, single), e({}, expert, ps, single, /*expert_dp_cp_size=*/2);
  ASSERT_EQ(d.buckets().size(), 1u);
  EXPECT_EQ(d.buckets()[0].params, (std::vector<size_t>{2, 0}));
  EXPECT_EQ(e.buckets()[0].params, (std::vector<size_t>{1}));
  EXPECT_TRUE(e.expert_parallel() && e.holds(1) && !e.holds(0));
  expert.grad_data().fill_(3.0f);
  dense.grad_data().fill_(3.0f);
  d.finish_grad_sync();
  e.finish_grad_sync();
  EXPECT_EQ(dense.grad_data().to_float_vector(), std::vector<float>(6, 3.0f));  // DP 1: untouched
  EXPECT_EQ(expert.grad_data().to_float_vector(), std::vector<float>(3, 1.5f));
}

}  // namespace
}  // namespace megatron
