// GPTModel parameters through the checkpoint: saved from a TP2 layout (threads as ranks) and
// loaded into a TP1 model. GPTModel's initialization is layout-independent (each global weight
// drawn from an RNG keyed by (seed, name)), so the TP1 model built with the saving seed is an
// independent reference for every loaded value (bitwise).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/checkpointing.h"
#include "test_utils/thread_group_util.h"
#include "test_utils/tiny_model.h"

using namespace megatron;
using namespace megatron::training;
namespace fs = std::filesystem;

namespace {
transformer::TransformerConfig llama_config(int tp) {
  transformer::TransformerConfig c = megatron::testing::tiny_llama_config(64, 2, 176);
  c.tensor_model_parallel_size = tp;
  return c;
}
}  // namespace

TEST(ModelCheckpoint, LlamaTP2SaveLoadsIntoTP1) {
  const std::string root = (fs::temp_directory_path() / ("megatron_mc_" + std::to_string(::getpid()))).string();
  fs::remove_all(root);
  megatron::testing::run_ranks(2, [&](int r, comm::ProcessGroup& g) {
    models::gpt::GPTModelParallel par;
    par.tp_group = std::shared_ptr<comm::ProcessGroup>(&g, [](comm::ProcessGroup*) {});
    models::gpt::GPTModel model(llama_config(2), 256, 64, /*seed=*/7, Device::cpu(), par);
    TrainingState st;
    for (auto& p : model.parameters()) {
      auto v = parameter_sharded_tensors(p, 2, {r, 2, 0, 1, 0, 1});
      st.model.insert(st.model.end(), v.begin(), v.end());
    }
    st.iteration = 3;
    CheckpointConfig cfg;
    cfg.save = root;
    save_checkpoint(st, cfg, {r, 2, 0, 1, 0, 1}, &g);
  });
  models::gpt::GPTModel want(llama_config(1), 256, 64, 7);
  models::gpt::GPTModel got(llama_config(1), 256, 64, 99);
  TrainingState st;
  for (auto& p : got.parameters()) {
    auto v = parameter_sharded_tensors(p, 2);
    st.model.insert(st.model.end(), v.begin(), v.end());
  }
  CheckpointConfig cfg;
  cfg.load = root;
  LoadResult r = load_checkpoint(st, cfg, {});
  EXPECT_EQ(r.iteration, 3);
  for (auto& p : want.parameters())
    EXPECT_EQ(got.parameter(p.name).data.to_float_vector(), p.data.to_float_vector()) << p.name;
  fs::remove_all(root);
}
