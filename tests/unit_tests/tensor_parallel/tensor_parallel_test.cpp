// Tensor parallelism end to end: a tiny GPT and a tiny LLaMA (GQA, SwiGLU fc1 with partition
// stride 2, untied output layer) split over TP = world size reproduce the single-rank model:
// per-iteration loss, every gathered gradient and the gathered parameters after Adam steps.
// Run by tests/functional_tests/dist_tp.sh (mpirun -np 2 / 4); skipped as a single process.
// Reference: a single-rank copy of the same model in every process (the model draws each global
// weight from (seed, name), so both start from identical global weights). The update is plain SGD
// (p -= 0.1 g) written out in the test: Adam would turn the pure rounding noise of gradients that
// are exactly zero in exact arithmetic (the key bias: softmax ignores a per-query constant) into
// full +-lr steps of arbitrary sign, which says nothing about TP. Tolerance 1e-5 relative to the
// largest magnitude: TP changes only fp32 summation order (partial GEMM sums, vocab-parallel
// softmax).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "test_utils/dist_test_util.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/distributed/gather_params.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
constexpr int64_t kVocab = 128, kSeq = 12;

transformer::TransformerConfig gpt_config(int tp, int /*query_groups*/) {
  transformer::TransformerConfig c = megatron::testing::tiny_gpt_config(32);
  c.tensor_model_parallel_size = tp;
  return c;
}

transformer::TransformerConfig llama_config(int tp, int query_groups) {
  transformer::TransformerConfig c = gpt_config(tp, query_groups);
  megatron::testing::make_llama(c, query_groups, 64);  // GQA (2 groups for 4 heads) where TP allows
  return c;
}

datasets::GPTBatch sample(int iter) { return testing::random_gpt_batch(4242 + iter, 2, kSeq, kVocab); }
using testing::max_rel_err;
using testing::sgd_step;

double step(GPTModel& m, const datasets::GPTBatch& b) {
  m.zero_grad();
  Tensor loss = m.forward(b, true);
  auto l = loss.to_float_vector();
  double mean = 0;
  for (float x : l) mean += x / l.size();
  m.backward(Tensor::from_vector(std::vector<float>(l.size(), 1.f / l.size()), loss.shape()));
  return mean;
}

void run_tp_equivalence(transformer::TransformerConfig (*make)(int, int)) {
  auto world = testing::dist_world();
  const int tp = world->size();
  if (4 % tp != 0) GTEST_SKIP() << "4 heads need TP in {2, 4}";
  const int groups = std::max(tp, 2);  // same model for the reference and the TP run
  GPTModel ref(make(1, groups), kVocab, kSeq, 99);
  models::gpt::GPTModelParallel par;
  par.tp_group = world;
  GPTModel model(make(tp, groups), kVocab, kSeq, 99, Device::cpu(), par);
  ASSERT_EQ(ref.parameters().size(), model.parameters().size());
  for (int it = 1; it <= 3; ++it) {
    const auto b = sample(it);
    const double lref = step(ref, b), l = step(model, b);
    EXPECT_NEAR(l, lref, 1e-5 * std::fabs(lref)) << "loss, iteration " << it;
    for (size_t i = 0; i < ref.parameters().size(); ++i) {
      const auto& p = model.parameters()[i];
      ASSERT_EQ(p.name, ref.parameters()[i].name);
      Tensor g = distributed::gather_tensor_parallel(p, p.main_grad, *world);
      EXPECT_LE(max_rel_err(g, ref.parameters()[i].main_grad), 1e-5) << p.name << " grad, iteration " << it;
    }
    sgd_step(ref.param_buffer(), ref.grad_buffer());
    sgd_step(model.param_buffer(), model.grad_buffer());
  }
  for (size_t i = 0; i < ref.parameters().size(); ++i) {
    const auto& p = model.parameters()[i];
    Tensor w = distributed::gather_tensor_parallel(p, p.data, *world);
    EXPECT_LE(max_rel_err(w, ref.parameters()[i].data), 1e-5) << p.name << " final parameter";
  }
}

TEST(DistTP, TinyGPTMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  run_tp_equivalence(gpt_config);
}

TEST(DistTP, TinyLlamaMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  run_tp_equivalence(llama_config);
}

// TP2 x DP2 on 4 ranks with --overlap-grad-reduce (small buckets, launched as the backward
// order reports parameters) against the single-rank model on the whole global batch (SGD).
TEST(DistTPxDP, Tp2Dp2OverlapMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  auto world = testing::dist_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  namespace ps = parallel_state;
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = 2;
  ps::initialize_model_parallel(world, pc);
  auto tpg = ps::get_tensor_model_parallel_group();
  auto dpg = ps::get_data_parallel_group(true);
  GPTModel ref(gpt_config(1, 2), kVocab, kSeq, 5);
  models::gpt::GPTModelParallel par;
  par.tp_group = tpg;
  GPTModel model(gpt_config(2, 2), kVocab, kSeq, 5, Device::cpu(), par);
  distributed::DistributedDataParallelConfig dc;
  dc.overlap_grad_reduce = true;
  dc.bucket_size = 2000;
  distributed::DistributedDataParallel ddp(dc, model.buffers(), model.parameters(), dpg);
  ASSERT_GT(ddp.buckets().size(), 1u);
  const int dp = dpg->size(), dr = dpg->rank();
  for (int it = 1; it <= 3; ++it) {
    // Global batch: 2 x dp micro-batches of 2 sequences; DP rank d takes micro-batches 2d, 2d+1.
    ref.zero_grad();
    double lref = 0;
    for (int mb = 0; mb < 2 * dp; ++mb) {
      Tensor loss = ref.forward(sample(10 * it + mb), true);
      auto l = loss.to_float_vector();
      for (float x : l) lref += x / l.size() / (2 * dp);
      ref.backward(Tensor::from_vector(std::vector<float>(l.size(), 1.f / l.size() / (2 * dp)), loss.shape()));
    }
    ddp.zero_grad_buffer();
    double lsum = 0;
    for (int k = 0; k < 2; ++k) {
      Tensor loss = model.forward(sample(10 * it + 2 * dr + k), true);
      auto l = loss.to_float_vector();
      for (float x : l) lsum += x / l.size() / 2;
      model.backward(Tensor::from_vector(std::vector<float>(l.size(), 1.f / l.size() / 2), loss.shape()));
    }
    for (size_t p = model.parameters().size(); p-- > 0;) ddp.register_grad_ready(p);
    distributed::FinalizeGroups fg;
    fg.tp_group = tpg;
    fg.dp_group = dpg;
    distributed::finalize_model_grads({&ddp}, fg);
    Tensor l = Tensor::from_vector({float(lsum)}, {1});
    dpg->all_reduce(l, comm::ReduceOp::kAvg);
    EXPECT_NEAR(l.item(), lref, 1e-5 * std::fabs(lref)) << "loss, iteration " << it;
    for (size_t i = 0; i < ref.parameters().size(); ++i) {
      const auto& p = model.parameters()[i];
      Tensor g = distributed::gather_tensor_parallel(p, p.main_grad, *tpg);
      EXPECT_LE(max_rel_err(g, ref.parameters()[i].main_grad), 1e-5) << p.name << " grad, iteration " << it;
    }
    sgd_step(ref.param_buffer(), ref.grad_buffer());
    sgd_step(model.param_buffer(), model.grad_buffer());
  }
  for (size_t i = 0; i < ref.parameters().size(); ++i) {
    const auto& p = model.parameters()[i];
    Tensor w = distributed::gather_tensor_parallel(p, p.data, *tpg);
    EXPECT_LE(max_rel_err(w, ref.parameters()[i].data), 1e-5) << p.name << " final parameter";
  }
  ps::destroy_model_parallel();
}

}  // namespace
}  // namespace megatron
