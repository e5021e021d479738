// Trainer-side checkpointing: directory conventions, Megatron's log lines, load flags, SwiGLU and
// stacked-layer global layouts (expected layouts from megatron.md §8.1-8.2, built by hand).
#include "megatron/training/checkpointing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "thread_group_util.h"

using namespace megatron;
using namespace megatron::training;
namespace fs = std::filesystem;
namespace dc = megatron::dist_checkpointing;

namespace {
std::string tmp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("megatron_tc_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

struct Toy {
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});     // decoder.layers.0.mlp.linear_fc2.weight
  Tensor emb = Tensor::from_vector({7, 8, 9, 10}, {2, 2});        // embedding.word_embeddings.weight
  Tensor m = Tensor::from_vector({.1f, .2f, .3f, .4f, .5f, .6f}, {2, 3});
  Tensor v = Tensor::from_vector({.01f, .02f, .03f, .04f, .05f, .06f}, {2, 3});
  TrainingState st;
  Toy() {
    ParallelRanks r;
    st.model = model_sharded_tensors("decoder.layers.0.mlp.linear_fc2.weight", w, {}, 1, r);
    auto e = model_sharded_tensors("embedding.word_embeddings.weight", emb, {0, false}, 2, r);
    st.model.insert(st.model.end(), e.begin(), e.end());
    add_optimizer_state(st, st.model[0], Tensor(), m, v);
    st.optimizer_common = {{"step", 5}};
    st.opt_param_scheduler = {{"num_steps", 40}, {"max_lr", 1e-3}};
    st.rng_state = {{"seed", 1234}};
    st.iteration = 5;
    st.consumed_train_samples = 40;
    st.num_floating_point_operations_so_far = 1.5e12;
    st.args = {{"seq_length", 64}};
  }
};
}  // namespace

TEST(TrainingCheckpointing, StackedLayerKeys) {
  EXPECT_EQ(stacked_layer_key("decoder.layers.12.self_attention.linear_qkv.weight"),
            (std::pair<std::string, int64_t>{"decoder.layers.self_attention.linear_qkv.weight", 12}));
  EXPECT_EQ(stacked_layer_key("decoder.final_layernorm.weight"),
            (std::pair<std::string, int64_t>{"decoder.final_layernorm.weight", -1}));
  EXPECT_EQ(checkpoint_dir_name("/ck", 1000), "/ck/iter_0001000");
  EXPECT_EQ(checkpoint_dir_name("/ck", 0, true), "/ck/release");
}

TEST(TrainingCheckpointing, SaveWritesTrackerAndMegatronLinesThenLoads) {
  std::string root = tmp_dir("save");
  Toy t;
  CheckpointConfig cfg;
  cfg.save = cfg.load = root;
  ::testing::internal::CaptureStdout();
  save_checkpoint(t.st, cfg, {});
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("] saving checkpoint at iteration       5 to " + root + " in torch_dist format"), std::string::npos) << out;
  EXPECT_NE(out.find("] successfully saved checkpoint from iteration       5 to " + root +
                     " [ t 1/1, gtp_remat 1/1, p 1/1 ]"),
            std::string::npos)
      << out;
  EXPECT_EQ(dc::read_text_file(root + "/latest_checkpointed_iteration.txt"), "5");  // no newline
  EXPECT_TRUE(fs::exists(root + "/iter_0000005/metadata.json"));
  auto idx = dc::load_index(root + "/iter_0000005");
  EXPECT_EQ(idx.tensors.at("decoder.layers.mlp.linear_fc2.weight").global_shape, (Shape{1, 2, 3}));
  EXPECT_TRUE(idx.tensors.count("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight"));
  auto common = dc::load_common_state(root + "/iter_0000005");
  EXPECT_EQ(common["checkpoint_version"], 3.0);
  EXPECT_EQ(common["args"]["consumed_train_samples"], 40);

  Toy u;  // fresh state with other values: everything must come back
  u.w.fill_(0);
  u.m.fill_(0);
  ::testing::internal::CaptureStdout();
  LoadResult r = load_checkpoint(u.st, cfg, {});
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find(" loading distributed checkpoint from " + root + " at iteration 5"), std::string::npos) << out;
  EXPECT_NE(out.find("  successfully loaded checkpoint from " + root + " [ t 1/1, p 1/1 ] at iteration 5"), std::string::npos);
  EXPECT_TRUE(r.loaded && r.optimizer_loaded && r.rng_loaded);
  EXPECT_EQ(r.iteration, 5);
  EXPECT_EQ(r.consumed_train_samples, 40);
  EXPECT_EQ(r.num_floating_point_operations_so_far, 1.5e12);
  EXPECT_EQ(r.optimizer_common["step"], 5);
  EXPECT_EQ(r.opt_param_scheduler["num_steps"], 40);
  EXPECT_EQ(r.rng_state["seed"], 1234);
  EXPECT_EQ(u.w.to_float_vector(), t.w.to_float_vector());
  EXPECT_EQ(u.m.to_float_vector(), t.m.to_float_vector());
  fs::remove_all(root);
}

TEST(TrainingCheckpointing, NoLoadOptimFinetuneAndRngMismatch) {
  std::string root = tmp_dir("flags");
  Toy t;
  CheckpointConfig cfg;
  cfg.save = cfg.load = root;
  ::testing::internal::CaptureStdout();
  save_checkpoint(t.st, cfg, {});
  {
    Toy u;
    u.m.fill_(0);
    cfg.no_load_optim = true;
    LoadResult r = load_checkpoint(u.st, cfg, {});
    EXPECT_FALSE(r.optimizer_loaded);
    EXPECT_TRUE(r.rng_loaded);
    EXPECT_EQ(u.m.to_float_vector(), std::vector<float>(6, 0.0f));  // untouched
    EXPECT_EQ(r.iteration, 5);
    cfg.no_load_optim = false;
  }
  {
    Toy u;
    u.w.fill_(0);
    u.m.fill_(0);
    cfg.finetune = true;
    LoadResult r = load_checkpoint(u.st, cfg, {});
    EXPECT_EQ(r.iteration, 0);
    EXPECT_EQ(r.consumed_train_samples, 0);
    EXPECT_FALSE(r.optimizer_loaded || r.rng_loaded);
    EXPECT_EQ(u.w.to_float_vector(), t.w.to_float_vector());  // weights loaded
    EXPECT_EQ(u.m.to_float_vector(), std::vector<float>(6, 0.0f));
    cfg.finetune = false;
  }
  std::string out = ::testing::internal::GetCapturedStdout();
  // RNG is per (PP, TP): loading with TP2 must ignore it with Megatron's message (TP-split model not
  // needed for this: the toy's tensors are replicated, so load them as replicas).
  ::testing::internal::CaptureStdout();
  {
    Toy u;
    LoadResult r = load_checkpoint(u.st, cfg, {0, 2, 0, 1, 0, 1});
    EXPECT_FALSE(r.rng_loaded);
  }
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("(TP, PP) mismatch after resume ((2, 1) vs (1, 1) from checkpoint): RNG state will be ignored"),
            std::string::npos)
      << out;
  fs::remove_all(root);
}

TEST(TrainingCheckpointing, MissingTrackerAndBadTracker) {
  std::string root = tmp_dir("missing");
  Toy u;
  CheckpointConfig cfg;
  cfg.load = root;
  ::testing::internal::CaptureStdout();
  LoadResult r = load_checkpoint(u.st, cfg, {});
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_FALSE(r.loaded);
  EXPECT_NE(out.find("WARNING: could not find the metadata file " + root + "/latest_checkpointed_iteration.txt"),
            std::string::npos);
  cfg.exit_on_missing_checkpoint = true;
  EXPECT_THROW(load_checkpoint(u.st, cfg, {}), UserError);
  dc::write_file_atomic(root + "/latest_checkpointed_iteration.txt", "12x");
  try {
    read_tracker(root);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("latest_checkpointed_iteration.txt"), std::string::npos);
  }
  fs::remove_all(root);
}

TEST(TrainingCheckpointing, AsyncSaveFinalizesTrackerLater) {
  std::string root = tmp_dir("async");
  Toy t;
  CheckpointConfig cfg;
  cfg.save = cfg.load = root;
  cfg.async_save = true;
  ::testing::internal::CaptureStdout();
  save_checkpoint(t.st, cfg, {});
  t.w.fill_(-5);  // modified while the save is in flight
  EXPECT_FALSE(fs::exists(root + "/latest_checkpointed_iteration.txt") && !fs::exists(root + "/iter_0000005"));
  EXPECT_TRUE(maybe_finalize_async_save(nullptr, /*blocking=*/true));
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("successfully saved checkpoint from iteration       5"), std::string::npos);
  EXPECT_EQ(dc::read_text_file(root + "/latest_checkpointed_iteration.txt"), "5");
  Toy u;
  ::testing::internal::CaptureStdout();
  load_checkpoint(u.st, cfg, {});
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(u.w.to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  fs::remove_all(root);
}

// SwiGLU fc1 with TP2: rank r holds [gate rows 2r..2r+1; up rows 2r..2r+1]; the stored global
// tensor must be [gate rows 0..3; up rows 0..3] (megatron.md §8.2), and reload at TP1 and TP4.
TEST(TrainingCheckpointing, SwigluFc1GlobalLayoutAcrossTP) {
  std::string root = tmp_dir("swiglu");
  // gate row g has value 10+g, up row u has value 20+u (hidden size 1)
  megatron::testing::run_ranks(2, [&](int r, distributed::ProcessGroup& g) {
    ParallelRanks pr{r, 2, 0, 1, 0, 1};
    Tensor local = Tensor::from_vector({10.0f + 2 * r, 11.0f + 2 * r, 20.0f + 2 * r, 21.0f + 2 * r}, {4, 1});
    TrainingState st;
    st.model = model_sharded_tensors("decoder.layers.0.mlp.linear_fc1.weight", local, {0, true}, 1, pr);
    st.iteration = 1;
    CheckpointConfig cfg;
    cfg.save = root;
    save_checkpoint(st, cfg, pr, &g);
  });
  dc::ShardedStateDict whole;
  whole.tensors.push_back(dc::ShardedTensor::from_tensor("decoder.layers.mlp.linear_fc1.weight",
                                                         Tensor::zeros({1, 8, 1}, DType::kFloat32)));
  dc::load(whole, root + "/iter_0000001");
  EXPECT_EQ(whole.tensors[0].data.to_float_vector(), (std::vector<float>{10, 11, 12, 13, 20, 21, 22, 23}));
  for (int r = 0; r < 4; ++r) {  // TP4: rank r = [gate r; up r]
    TrainingState st;
    Tensor local = Tensor::zeros({2, 1}, DType::kFloat32);
    st.model = model_sharded_tensors("decoder.layers.0.mlp.linear_fc1.weight", local, {0, true}, 1, {r, 4, 0, 1, 0, 1});
    CheckpointConfig cfg;
    cfg.load = root;
    cfg.no_load_optim = cfg.no_load_rng = true;
    ::testing::internal::CaptureStdout();
    load_checkpoint(st, cfg, {r, 4, 0, 1, 0, 1});
    ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(local.to_float_vector(), (std::vector<float>{10.0f + r, 20.0f + r})) << r;
  }
  fs::remove_all(root);
}
