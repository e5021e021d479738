// Context parallelism end to end: a tiny GPT and a tiny LLaMA (GQA 4 heads / 2 groups, RoPE,
// SwiGLU, untied output) with the sequence split over CP ranks (ring attention, load-balanced
// chunks) reproduce the single-rank model: per-iteration loss, every gradient (gathered over TP
// where TP > 1) and the parameters after SGD steps. Layouts: CP2 (2 ranks), CP2 x TP2 and CP4
// (4 ranks). Run by tests/functional_tests/dist_cp.sh; skipped as a single process.
// Reference: a single-rank copy of the same model in every process, fed the whole sequence (no
// chunking, no ring: the plain attention kernel, itself tested against PyTorch). Gradients go
// through DistributedDataParallel over the dp-cp group exactly as pretrain_gpt does (pre-scaled by
// 1/(DP*CP), summed), with the micro-batch loss seed CP / (tokens of the whole sequence) on every
// CP rank (Megatron's loss x CP, docs/megatron-reference.md#loss-normalisation). Plain SGD (p -= 0.1 g) as in the TP test:
// Adam would amplify rounding noise of exactly-zero gradients. Tolerance 1e-5 relative to the
// largest magnitude: CP only changes the order of fp32 sums (online-softmax merge, dK/dV ring).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "test_utils/dist_test_util.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/distributed/gather_params.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/transformer/context_parallel.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
constexpr int64_t kVocab = 128, kSeq = 16, kBatch = 2;

transformer::TransformerConfig gpt_config(int tp) {
  transformer::TransformerConfig c = megatron::testing::tiny_gpt_config(32);
  c.tensor_model_parallel_size = tp;
  return c;
}

transformer::TransformerConfig llama_config(int tp) {
  transformer::TransformerConfig c = gpt_config(tp);
  megatron::testing::make_llama(c, 2, 64);
  return c;
}

datasets::GPTBatch sample(int iter) { return testing::random_gpt_batch(777 + iter, kBatch, kSeq, kVocab); }
using testing::max_rel_err;
using testing::sgd_step;

void run_cp_equivalence(int tp, int cp, transformer::TransformerConfig (*make)(int), const std::string& comm = "p2p") {
  auto world = testing::dist_world();
  namespace ps = parallel_state;
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = tp;
  pc.context_parallel_size = cp;
  ps::initialize_model_parallel(world, pc);
  auto tpg = ps::get_tensor_model_parallel_group();
  auto cpg = ps::get_context_parallel_group();
  auto dpcp = ps::get_data_parallel_group(/*with_context_parallel=*/true);
  ASSERT_EQ(cpg->size(), cp);
  ASSERT_EQ(dpcp->size(), cp);  // DP = 1
  GPTModel ref(make(1), kVocab, kSeq, 31);
  models::gpt::GPTModelParallel par;
  par.tp_group = tpg;
  par.cp_group = cpg;
  par.cp_comm_type = comm;
  GPTModel model(make(tp), kVocab, kSeq, 31, Device::cpu(), par);
  distributed::DistributedDataParallel ddp({}, model.buffers(), model.parameters(), dpcp);
  ASSERT_EQ(ref.parameters().size(), model.parameters().size());
  const double n_tokens = kBatch * kSeq;
  for (int it = 1; it <= 3; ++it) {
    const auto batch = sample(it);
    // Reference: mean loss over all tokens of the whole sequence.
    ref.zero_grad();
    Tensor lref_t = ref.forward(batch, true);
    double lref = 0;
    for (float x : lref_t.to_float_vector()) lref += x / n_tokens;
    ref.backward(Tensor::from_vector(std::vector<float>(lref_t.numel(), float(1.0 / n_tokens)), lref_t.shape()));
    // CP: this rank's chunks; seed CP / n_tokens (the DDP divides by DP x CP).
    ddp.zero_grad_buffer();
    const auto local = transformer::get_batch_on_this_cp_rank(batch, cp, cpg->rank());
    Tensor l_t = model.forward(local, true);
    ASSERT_EQ(l_t.shape(), (Shape{kBatch, kSeq / cp}));
    double lsum = 0;
    for (float x : l_t.to_float_vector()) lsum += x;
    model.backward(Tensor::from_vector(std::vector<float>(l_t.numel(), float(cp / n_tokens)), l_t.shape()));
    distributed::FinalizeGroups fg;
    fg.tp_group = tpg;
    fg.dp_group = dpcp;
    distributed::finalize_model_grads({&ddp}, fg);
    Tensor l = Tensor::from_vector({float(lsum)}, {1});
    cpg->all_reduce(l, comm::ReduceOp::kSum);
    EXPECT_NEAR(l.item() / n_tokens, lref, 1e-5 * std::fabs(lref)) << "loss, iteration " << it;
    for (size_t i = 0; i < ref.parameters().size(); ++i) {
      const auto& p = model.parameters()[i];
      ASSERT_EQ(p.name, ref.parameters()[i].name);
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

TEST(DistCP, Cp2TinyGPTAndLlamaMatchSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  if (testing::dist_world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  run_cp_equivalence(1, 2, gpt_config);
  run_cp_equivalence(1, 2, llama_config);
  run_cp_equivalence(1, 2, gpt_config, "a2a");
  run_cp_equivalence(1, 2, llama_config, "a2a");
}

TEST(DistCP, Cp2Tp2TinyGPTAndLlamaMatchSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  if (testing::dist_world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  run_cp_equivalence(2, 2, gpt_config);
  run_cp_equivalence(2, 2, llama_config);
  run_cp_equivalence(2, 2, gpt_config, "a2a");
}

TEST(DistCP, Cp4TinyLlamaMatchesSingleRank) {
  SKIP_UNLESS_MULTI_RANK();
  if (testing::dist_world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  run_cp_equivalence(1, 4, llama_config);
}

}  // namespace
}  // namespace megatron
