// Text generation with tensor parallelism (run by tests/functional_tests/dist_generate.sh under
// mpirun -np 2): a TP2 model gives the same tokens as the same model on one rank, for greedy and
// for seeded sampling, and the same log-probs within 1e-5. Weights are keyed by parameter name, so
// the TP2 shards and the TP1 copy hold the same values. The logits differ only in the order of the
// row-parallel sums (~1e-6 relative), so a sampled token could only change if a uniform draw fell
// within ~1e-6 of a cumulative-probability boundary; the init std 0.3 keeps greedy margins large.
#include <gtest/gtest.h>

#include <random>

#include "test_utils/dist_test_util.h"
#include "megatron/core/inference/text_generation.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/hf/hf_checkpoint.h"
#include "megatron/training/hf/hf_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;

std::unique_ptr<GPTModel> model_with_tp(const std::string& flavour, std::shared_ptr<comm::ProcessGroup> tp) {
  transformer::TransformerConfig c = hf::transformer_config_from_hf(
      hf::read_hf_config(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/" + flavour + "/config.json"));
  c.init_method_std = 0.3f;
  c.tensor_model_parallel_size = tp->size();
  models::gpt::GPTModelParallel par;
  par.tp_group = tp;
  par.allocate_main_grads = false;
  return std::make_unique<GPTModel>(c, 256, 64, 7, Device::cpu(), par);
}

TEST(DistGenerate, Tp2EqualsTp1ForGreedyAndSeededSampling) {
  SKIP_UNLESS_MULTI_RANK();
  auto world = testing::dist_world();
  ASSERT_EQ(world->size(), 2) << "written for TP2 (mpirun -np 2)";
  for (const std::string flavour : {"llama_tiny", "gpt2_tiny"}) {
    auto tp2 = model_with_tp(flavour, world);
    auto tp1 = model_with_tp(flavour, comm::make_single_rank_group());
    inference::TextGenerator g2(*tp2, world, 1), g1(*tp1, nullptr, 1);
    std::mt19937 rng(5);
    std::vector<std::vector<int64_t>> prompts(3);
    for (size_t i = 0; i < prompts.size(); ++i)
      for (size_t j = 0; j < 3 + 4 * i; ++j) prompts[i].push_back(rng() % 256);
    std::vector<int64_t> lengths;
    auto rows = inference::pad_prompts(prompts, 16, 255, &lengths);
    for (int mode = 0; mode < 3; ++mode) {
      inference::GenerationParams gp;
      gp.tokens_to_generate = 16;
      gp.return_output_log_probs = true;
      gp.use_eod_token_for_early_termination = false;
      gp.vocab_size = 256;
      gp.top_k = mode == 0 ? 1 : mode == 1 ? 0 : 10;
      gp.temperature = mode == 1 ? 1.3 : 1.0;
      g1.rng().manual_seed(100 + mode);
      g2.rng().manual_seed(100 + mode);
      auto a = g1.generate(rows, lengths, gp);
      auto b = g2.generate(rows, lengths, gp);
      EXPECT_EQ(a.tokens, b.tokens) << flavour << " mode " << mode << " rank " << world->rank();
      EXPECT_EQ(a.lengths, b.lengths);
      for (size_t i = 0; i < a.log_probs.size(); ++i)
        for (size_t j = 0; j < a.log_probs[i].size(); ++j)
          EXPECT_NEAR(a.log_probs[i][j], b.log_probs[i][j], 1e-5) << flavour << " " << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace megatron
