// Multi-token prediction across ranks equals one rank (run by tests/functional_tests/dist_mtp.sh
// under mpirun -np 2; skipped as a single process). A tiny LLaMA (GQA, RoPE, SwiGLU, untied) and
// a tied GPT-style model with D = 2 MTP modules; every rank also holds a single-rank copy as the
// reference. Gradients go through DistributedDataParallel and finalize_model_grads as in
// pretrain_gpt (sequence-parallel norm all-reduce, 1/(DP·CP) pre-scaling).
//  * TP2, and TP2 with --sequence-parallel: loss and the TP-gathered gradients;
//  * DP2: each rank its own micro-batch; the averaged gradients equal the mean of the reference's
//    two single-batch gradients;
//  * CP2 (D = 1): each CP rank normalises its MTP loss by its own rolled-mask count (Megatron's
//    process_mtp_loss uses local counts), so the batch's mask is chosen to give both ranks the same
//    count -- then the DP×CP average equals the single-rank mean.
// Tolerance 1e-5 relative to the largest magnitude: only the order of fp32 sums changes.
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/distributed/gather_params.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/transformer/context_parallel.h"
#include "test_utils/dist_test_util.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
constexpr int64_t kVocab = 128, kSeq = 16, kBatch = 2;

transformer::TransformerConfig with_mtp(transformer::TransformerConfig c, int tp, int64_t mtp) {
  c.tensor_model_parallel_size = tp;
  c.mtp_num_layers = mtp;
  c.mtp_loss_scaling_factor = 0.5f;
  return c;
}
transformer::TransformerConfig llama(int tp, int64_t mtp) { return with_mtp(testing::tiny_llama_config(), tp, mtp); }
// GPT-style with RoPE (MTP refuses learned absolute positions): tied, LayerNorm, GeLU, biases.
transformer::TransformerConfig gpt(int tp, int64_t mtp) {
  transformer::TransformerConfig c = testing::tiny_gpt_config();
  c.position_embedding_type = transformer::PositionEmbeddingType::kRope;
  return with_mtp(c, tp, mtp);
}

/// forward + backward with the main seed mask * k and MTP scale 1; returns Σ(loss · mask).
double fwd_bwd(GPTModel& m, const datasets::GPTBatch& b, double k) {
  Tensor loss = m.forward(b, true);
  auto l = loss.to_float_vector(), mk = b.loss_mask.to_float_vector();
  std::vector<float> seed(l.size());
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i) sum += double(l[i]) * mk[i], seed[i] = float(mk[i] * k);
  m.set_mtp_loss_scale(1.0);
  m.backward(Tensor::from_vector(seed, loss.shape()));
  return sum;
}

double mask_sum(const datasets::GPTBatch& b) {
  double s = 0;
  for (float x : b.loss_mask.to_float_vector()) s += x;
  return s;
}

void check_grads(GPTModel& model, GPTModel& ref, comm::ProcessGroup& tpg, double scale_ref, const std::string& what) {
  ASSERT_EQ(model.parameters().size(), ref.parameters().size());
  for (size_t i = 0; i < ref.parameters().size(); ++i) {
    const auto& p = model.parameters()[i];
    ASSERT_EQ(p.name, ref.parameters()[i].name);
    Tensor g = distributed::gather_tensor_parallel(p, p.main_grad, tpg);
    Tensor r = ref.parameters()[i].main_grad.clone();
    ops::scale_(r, static_cast<float>(scale_ref));
    EXPECT_LE(testing::max_rel_err(g, r), 1e-5) << what << ": " << p.name;
  }
}

void run_tp(transformer::TransformerConfig (*make)(int, int64_t), bool sp) {
  auto world = testing::dist_world();
  namespace ps = parallel_state;
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = 2;
  ps::initialize_model_parallel(world, pc);
  auto tpg = ps::get_tensor_model_parallel_group();
  GPTModel ref(make(1, 2), kVocab, kSeq, 31);
  transformer::TransformerConfig c = make(2, 2);
  c.sequence_parallel = sp;
  models::gpt::GPTModelParallel par;
  par.tp_group = tpg;
  GPTModel model(c, kVocab, kSeq, 31, Device::cpu(), par);
  distributed::DistributedDataParallel ddp({}, model.buffers(), model.parameters(),
                                           ps::get_data_parallel_group(true));
  auto b = testing::random_gpt_batch(5, kBatch, kSeq, kVocab);
  b.loss_mask.data<float>()[3] = 0.0f;
  const double n = mask_sum(b);
  const double lref = fwd_bwd(ref, b, 1.0 / n) / n;
  ddp.zero_grad_buffer();
  const double l = fwd_bwd(model, b, 1.0 / n) / n;
  distributed::FinalizeGroups fg;
  fg.tp_group = tpg;
  fg.dp_group = ps::get_data_parallel_group(true);
  distributed::finalize_model_grads({&ddp}, fg);
  EXPECT_NEAR(l, lref, 1e-5 * lref);
  check_grads(model, ref, *tpg, 1.0, sp ? "TP2 SP" : "TP2");
  const auto mm = model.take_mtp_metrics(), mr = ref.take_mtp_metrics();
  ASSERT_EQ(mm.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_NEAR(mm[k].loss, mr[k].loss, 1e-5 * mr[k].loss) << "mtp_" << k + 1 << " loss";
    EXPECT_EQ(mm[k].total, mr[k].total);
  }
  ps::destroy_model_parallel();
}

TEST(DistMTP, Tp2MatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  if (testing::dist_world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  run_tp(llama, false);
  run_tp(gpt, false);
}

TEST(DistMTP, Tp2SequenceParallelMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  if (testing::dist_world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  run_tp(llama, true);
  run_tp(gpt, true);
}

TEST(DistMTP, Dp2MatchesTheMeanOfTwoBatches) {
  SKIP_UNLESS_MULTI_RANK();
  auto world = testing::dist_world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  namespace ps = parallel_state;
  ps::initialize_model_parallel(world, ps::ParallelConfig{});
  auto dp = ps::get_data_parallel_group(true);
  ASSERT_EQ(dp->size(), 2);
  GPTModel ref(llama(1, 2), kVocab, kSeq, 31), model(llama(1, 2), kVocab, kSeq, 31);
  distributed::DistributedDataParallel ddp({}, model.buffers(), model.parameters(), dp);
  const auto b0 = testing::random_gpt_batch(40, kBatch, kSeq, kVocab), b1 = testing::random_gpt_batch(41, kBatch, kSeq, kVocab);
  fwd_bwd(ref, b0, 1.0 / mask_sum(b0));
  fwd_bwd(ref, b1, 1.0 / mask_sum(b1));
  const auto& mine = dp->rank() == 0 ? b0 : b1;
  ddp.zero_grad_buffer();
  fwd_bwd(model, mine, 1.0 / mask_sum(mine));
  distributed::FinalizeGroups fg;
  fg.dp_group = dp;
  distributed::finalize_model_grads({&ddp}, fg);
  check_grads(model, ref, *ps::get_tensor_model_parallel_group(), 0.5, "DP2");
  ps::destroy_model_parallel();
}

TEST(DistMTP, Cp2WithEqualLocalCountsMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  auto world = testing::dist_world();
  if (world->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  namespace ps = parallel_state;
  ps::ParallelConfig pc;
  pc.context_parallel_size = 2;
  ps::initialize_model_parallel(world, pc);
  auto cpg = ps::get_context_parallel_group();
  auto dpcp = ps::get_data_parallel_group(true);
  for (auto make : {llama, gpt}) {
    GPTModel ref(make(1, 1), kVocab, kSeq, 31);
    models::gpt::GPTModelParallel par;
    par.cp_group = cpg;
    GPTModel model(make(1, 1), kVocab, kSeq, 31, Device::cpu(), par);
    distributed::DistributedDataParallel ddp({}, model.buffers(), model.parameters(), dpcp);
    // Chunks of 4: rank 0 holds 0 and 3, rank 1 holds 1 and 2. The rolled mask loses the global
    // last position (rank 0); a zero at position 5 loses position 4 (rank 1): 7 + 7 per row.
    auto b = testing::random_gpt_batch(9, kBatch, kSeq, kVocab);
    for (int64_t r = 0; r < kBatch; ++r) b.loss_mask.data<float>()[r * kSeq + 5] = 0.0f;
    const double n = mask_sum(b);
    const double lref = fwd_bwd(ref, b, 1.0 / n) / n;
    ddp.zero_grad_buffer();
    const auto local = transformer::get_batch_on_this_cp_rank(b, 2, cpg->rank());
    Tensor lsum = Tensor::from_vector({float(fwd_bwd(model, local, 2.0 / n))}, {1});  // seed CP / n, as the main loss under CP (docs/training.md)
    distributed::FinalizeGroups fg;
    fg.dp_group = dpcp;
    distributed::finalize_model_grads({&ddp}, fg);
    cpg->all_reduce(lsum, comm::ReduceOp::kSum);
    EXPECT_NEAR(lsum.item() / n, lref, 1e-5 * lref);
    check_grads(model, ref, *ps::get_tensor_model_parallel_group(), 1.0, "CP2");
    const auto mm = model.take_mtp_metrics();
    ASSERT_EQ(mm.size(), 1u);
    EXPECT_EQ(mm[0].total, 14.0) << "rolled-mask positions on this CP rank";
  }
  ps::destroy_model_parallel();
}

}  // namespace
}  // namespace megatron
