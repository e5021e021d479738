// Trainer-side checkpointing: directory conventions, Megatron's log lines, load flags, SwiGLU and
// stacked-layer global layouts (expected layouts from docs/megatron-reference.md#distributed-checkpoint, built by hand).
#include "megatron/training/checkpointing.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/tensor/parameter.h"
#include "test_utils/thread_group_util.h"

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
  // No --ckpt-format on the command line: our layout is written, and the line says so (it must not
  // claim torch_dist, the default value of --ckpt-format, which only the explicit flag writes).
  EXPECT_NE(out.find("] saving checkpoint at iteration       5 to " + root +
                     " in megatron.cpp's distributed (per-rank safetensors + metadata; --ckpt-format torch_dist "
                     "writes torch_dist) format"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("in torch_dist format"), std::string::npos) << out;
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
  // Past INT64_MAX (9223372036854775807): a user error naming the tracker, not std::stoll's throw.
  dc::write_file_atomic(root + "/latest_checkpointed_iteration.txt", "99999999999999999999");
  try {
    read_tracker(root);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(root + "/latest_checkpointed_iteration.txt: iteration number "
                                         "'99999999999999999999' is out of range"),
              std::string::npos)
        << e.what();
  }
  // The largest value still reads exactly.
  dc::write_file_atomic(root + "/latest_checkpointed_iteration.txt", "9223372036854775807");
  EXPECT_EQ(read_tracker(root)->first, INT64_MAX);
  // A tracker that is a directory (or a FIFO: it would block) is refused, not read.
  fs::remove(root + "/latest_checkpointed_iteration.txt");
  fs::create_directory(root + "/latest_checkpointed_iteration.txt");
  try {
    read_tracker(root);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("latest_checkpointed_iteration.txt: not a regular file"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

// An iteration directory that is a symlink loop, and checkpoint files that are not regular files
// (a FIFO would block a reader, /dev/zero never ends): user errors naming the path.
TEST(TrainingCheckpointing, SymlinkLoopAndNonRegularFilesAreUserErrors) {
  std::string root = tmp_dir("loop");
  Toy u;
  CheckpointConfig cfg;
  cfg.load = root;
  dc::write_file_atomic(root + "/latest_checkpointed_iteration.txt", "3");
  fs::create_symlink(root + "/iter_0000003", root + "/iter_0000003");  // points at itself: ELOOP
  try {
    ::testing::internal::CaptureStdout();
    load_checkpoint(u.st, cfg, {});
    ::testing::internal::GetCapturedStdout();
    ADD_FAILURE();
  } catch (const UserError& e) {
    ::testing::internal::GetCapturedStdout();
    EXPECT_NE(std::string(e.what()).find("checkpoint directory " + root + "/iter_0000003: "), std::string::npos) << e.what();
  }
  fs::remove(root + "/iter_0000003");
  fs::create_directory(root + "/iter_0000003");
  fs::create_symlink("/dev/zero", root + "/iter_0000003/metadata.json");
  try {
    dc::check_is_distributed_checkpoint(root + "/iter_0000003");
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(root + "/iter_0000003/metadata.json is not a regular file (a device or socket)"),
              std::string::npos)
        << e.what();
  }
  fs::remove(root + "/iter_0000003/metadata.json");
  ASSERT_EQ(::mkfifo((root + "/iter_0000003/metadata.json").c_str(), 0600), 0);
  try {
    dc::check_is_distributed_checkpoint(root + "/iter_0000003");
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("metadata.json is not a regular file (a FIFO)"), std::string::npos) << e.what();
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
// tensor must be [gate rows 0..3; up rows 0..3] (docs/megatron-reference.md#distributed-checkpoint), and reload at TP1 and TP4.
TEST(TrainingCheckpointing, SwigluFc1GlobalLayoutAcrossTP) {
  std::string root = tmp_dir("swiglu");
  // gate row g has value 10+g, up row u has value 20+u (hidden size 1)
  megatron::testing::run_ranks(2, [&](int r, comm::ProcessGroup& g) {
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

// model_and_optimizer_state: the distributed optimizer's flat slices are stored in global
// coordinates, so a save with DP2 slices loads into one rank without the distributed optimizer,
// and a save without it loads into DP3 slices whose boundaries fall elsewhere. Model: W [4, 3]
// (decoder layer 0, elements 0..11 of a 15-element buffer) and b [3] (elements 12..14). Expected
// values are set by hand from the global flat index: W[k] = k, b[k] = 50 + k, exp_avg = 100 + buffer
// index, exp_avg_sq = 0.5 * buffer index.
namespace {
struct SlicedModel {
  Tensor buf = Tensor::zeros({15}, DType::kFloat32);
  Tensor grad = Tensor::zeros({15}, DType::kFloat32);
  std::vector<Parameter> params;
  std::unique_ptr<optimizer::MegatronOptimizer> opt;
  // `slices`: this rank's buffer ranges (the distributed optimizer's), or empty = whole params.
  // `cfg`: Adam by default; with SGD the momentum buffer takes exp_avg's hand-made values.
  explicit SlicedModel(const std::vector<std::pair<int64_t, int64_t>>& slices,
                       const optimizer::OptimizerConfig& cfg = optimizer::OptimizerConfig{}) {
    Parameter w, b;
    w.name = "decoder.layers.0.mlp.linear_fc2.weight";
    w.data = buf.flat_slice(0, {4, 3});
    w.main_grad = grad.flat_slice(0, {4, 3});
    w.global_shape = {4, 3};
    b.name = "decoder.layers.0.mlp.linear_fc2.bias";
    b.data = buf.flat_slice(12, {3});
    b.main_grad = grad.flat_slice(12, {3});
    b.global_shape = {3};
    params = {w, b};
    std::vector<optimizer::OptimizerParam> ops;
    auto add = [&](const std::string& name, int64_t lo, int64_t hi, bool matrix) {
      const Shape s = matrix ? Shape{1, hi - lo} : Shape{hi - lo};
      ops.push_back({name, buf.flat_slice(lo, s), grad.flat_slice(lo, s)});
    };
    if (slices.empty()) {
      ops.push_back({w.name, w.data, w.main_grad});
      ops.push_back({b.name, b.data, b.main_grad});
    } else {
      for (auto [lo, hi] : slices) {  // split at the W/b boundary (12) as distributed_optimizer_params does
        if (lo < 12) add(w.name, lo, std::min<int64_t>(hi, 12), true);
        if (hi > 12) add(b.name, std::max<int64_t>(lo, 12), hi, false);
      }
    }
    opt = std::make_unique<optimizer::MegatronOptimizer>(cfg, ops);
  }
  void fill_expected() {
    float* p = buf.data<float>();
    for (int k = 0; k < 12; ++k) p[k] = static_cast<float>(k);
    for (int k = 0; k < 3; ++k) p[12 + k] = 50.0f + k;
    for (size_t j = 0; j < opt->params().size(); ++j) {
      const int64_t at = (static_cast<const char*>(opt->params()[j].param.data_ptr()) -
                          static_cast<const char*>(buf.data_ptr())) / 4;
      Tensor m = opt->exp_avg(j).defined() ? opt->exp_avg(j) : opt->momentum_buffer(j), v = opt->exp_avg_sq(j);
      for (int64_t e = 0; e < m.numel(); ++e) {
        m.data<float>()[e] = 100.0f + static_cast<float>(at + e);
        if (v.defined()) v.data<float>()[e] = 0.5f * static_cast<float>(at + e);
      }
    }
  }
  // Checks this rank's values against the hand-made global values.
  void expect_expected() {
    const float* p = buf.data<float>();
    for (int k = 0; k < 12; ++k) EXPECT_EQ(p[k], static_cast<float>(k)) << "W[" << k << "]";
    for (int k = 0; k < 3; ++k) EXPECT_EQ(p[12 + k], 50.0f + k) << "b[" << k << "]";
    for (size_t j = 0; j < opt->params().size(); ++j) {
      const int64_t at = (static_cast<const char*>(opt->params()[j].param.data_ptr()) -
                          static_cast<const char*>(buf.data_ptr())) / 4;
      const bool sgd = !opt->exp_avg(j).defined();
      auto m = (sgd ? opt->momentum_buffer(j) : opt->exp_avg(j)).to_float_vector();
      for (size_t e = 0; e < m.size(); ++e)
        EXPECT_EQ(m[e], 100.0f + static_cast<float>(at + static_cast<int64_t>(e))) << "exp_avg/momentum at " << at + e;
      if (sgd) continue;
      auto v = opt->exp_avg_sq(j).to_float_vector();
      for (size_t e = 0; e < v.size(); ++e)
        EXPECT_EQ(v[e], 0.5f * static_cast<float>(at + static_cast<int64_t>(e))) << "exp_avg_sq at " << at + e;
    }
  }
};
}  // namespace

TEST(TrainingCheckpointing, DistributedOptimizerStateReshardsAcrossDP) {
  std::string root = tmp_dir("distopt");
  CheckpointConfig cfg;
  cfg.save = cfg.load = root;
  ::testing::internal::CaptureStdout();
  // DP2 with the distributed optimizer: rank 0 owns buffer [0, 8), rank 1 [8, 15).
  megatron::testing::run_ranks(2, [&](int r, comm::ProcessGroup& g) {
    SlicedModel m(r == 0 ? std::vector<std::pair<int64_t, int64_t>>{{0, 8}} : std::vector<std::pair<int64_t, int64_t>>{{8, 15}});
    m.fill_expected();
    ParallelRanks pr{0, 1, 0, 1, r, 2};
    TrainingState st = model_and_optimizer_state(m.params, *m.opt, 1, pr, /*distributed_optimizer=*/true, true);
    st.iteration = 7;
    save_checkpoint(st, cfg, pr, &g);
  });
  // ... loads into one rank without the distributed optimizer.
  {
    SlicedModel m({});
    TrainingState st = model_and_optimizer_state(m.params, *m.opt, 1, {}, false, true);
    LoadResult r = load_checkpoint(st, cfg, {});
    EXPECT_TRUE(r.optimizer_loaded);
    m.expect_expected();
    // and saves again (iteration 8) without it ...
    m.fill_expected();
    st.iteration = 8;
    save_checkpoint(st, cfg, {});
  }
  // ... which DP3 slices of 5 elements (boundaries inside W and at b) load.
  megatron::testing::run_ranks(3, [&](int r, comm::ProcessGroup& g) {
    SlicedModel m({{5 * r, 5 * r + 5}});
    ParallelRanks pr{0, 1, 0, 1, r, 3};
    TrainingState st = model_and_optimizer_state(m.params, *m.opt, 1, pr, true, true);
    LoadResult res = load_checkpoint(st, cfg, pr, &g);
    EXPECT_EQ(res.iteration, 8);
    m.expect_expected();
  });
  ::testing::internal::GetCapturedStdout();
  // The DP2 save wrote every optimizer element exactly once, as flat ranges of the global boxes.
  dc::CheckpointIndex idx = dc::load_index(root + "/iter_0000007");
  const auto& e = idx.tensors.at("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight");
  EXPECT_EQ(e.global_shape, (Shape{1, 4, 3}));
  ASSERT_EQ(e.shards.size(), 2u);
  int64_t n = 0;
  for (const auto& s : e.shards) {
    ASSERT_TRUE(s.flattened_range.has_value());
    n += s.flattened_range->second - s.flattened_range->first;
  }
  EXPECT_EQ(n, 12);
  fs::remove_all(root);
}

// --optimizer sgd: the momentum buffers are saved as "optimizer.state.momentum_buffer.<key>"
// (torch.optim.SGD's state key, as Megatron's optim_state_to_sharding_state names it) with the
// distributed optimizer's flat ranges, and reshard like exp_avg. As in torch they exist only after
// the first step: a save at step 0 has none, and loading such a checkpoint leaves the buffers at
// zero (listed in missing_optimizer).
TEST(TrainingCheckpointing, SgdMomentumBufferSavedAndResharded) {
  std::string root = tmp_dir("sgd");
  CheckpointConfig cfg;
  cfg.save = cfg.load = root;
  optimizer::OptimizerConfig oc;
  oc.optimizer = "sgd";
  oc.sgd_momentum = 0.9;
  ::testing::internal::CaptureStdout();
  megatron::testing::run_ranks(2, [&](int r, comm::ProcessGroup& g) {
    SlicedModel m(r == 0 ? std::vector<std::pair<int64_t, int64_t>>{{0, 8}} : std::vector<std::pair<int64_t, int64_t>>{{8, 15}}, oc);
    m.fill_expected();
    m.opt->set_step_count(3);  // the buffers hold state
    ParallelRanks pr{0, 1, 0, 1, r, 2};
    TrainingState st = model_and_optimizer_state(m.params, *m.opt, 1, pr, /*distributed_optimizer=*/true, true);
    st.iteration = 7;
    save_checkpoint(st, cfg, pr, &g);
  });
  {
    SlicedModel m({}, oc);  // fresh optimizer (step 0), one rank, no distributed optimizer
    TrainingState st = model_and_optimizer_state(m.params, *m.opt, 1, {}, false, true);
    EXPECT_EQ(st.optimizer_if_present.size(), 2u);
    LoadResult r = load_checkpoint(st, cfg, {});
    EXPECT_TRUE(r.optimizer_loaded);
    EXPECT_TRUE(r.missing_optimizer.empty());
    m.expect_expected();
  }
  dc::CheckpointIndex idx = dc::load_index(root + "/iter_0000007");
  const auto& e = idx.tensors.at("optimizer.state.momentum_buffer.decoder.layers.mlp.linear_fc2.weight");
  EXPECT_EQ(e.global_shape, (Shape{1, 4, 3}));
  EXPECT_EQ(e.shards.size(), 2u);
  EXPECT_TRUE(idx.tensors.count("optimizer.state.momentum_buffer.decoder.layers.mlp.linear_fc2.bias"));
  EXPECT_FALSE(idx.tensors.count("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight"));
  // Step 0: no buffers saved; a load finds none and leaves them at zero.
  {
    SlicedModel m({}, oc);
    TrainingState st = model_and_optimizer_state(m.params, *m.opt, 1, {}, false, true);
    st.iteration = 9;
    save_checkpoint(st, cfg, {});
  }
  EXPECT_FALSE(dc::load_index(root + "/iter_0000009").tensors.count(
      "optimizer.state.momentum_buffer.decoder.layers.mlp.linear_fc2.weight"));
  {
    SlicedModel m({}, oc);
    TrainingState st = model_and_optimizer_state(m.params, *m.opt, 1, {}, false, true);
    LoadResult r = load_checkpoint(st, cfg, {});
    EXPECT_EQ(r.iteration, 9);
    EXPECT_EQ(r.missing_optimizer.size(), 2u);
    for (size_t j = 0; j < m.opt->params().size(); ++j)
      for (float x : m.opt->momentum_buffer(j).to_float_vector()) EXPECT_EQ(x, 0.0f);
  }
  ::testing::internal::GetCapturedStdout();
  fs::remove_all(root);
}

// The last pipeline stage's copy of the tied word embedding (Megatron's GPTModel.sharded_state_dict
// maps it to the embedding's key as a non-written replica): loaded from the embedding, never saved.
TEST(TrainingCheckpointing, TiedOutputLayerCopyIsALoadOnlyEmbeddingReplica) {
  Parameter p;
  p.name = "output_layer.weight";
  p.init_key = "embedding.word_embeddings.weight";
  p.shared = true;
  p.data = Tensor::from_vector({1, 2, 3, 4}, {2, 2});  // TP rank 1 of 2: rows 2..3 of [4, 2]
  p.global_shape = {4, 2};
  p.partition_dim = 0;
  p.tp_rank = 1;
  p.tp_size = 2;
  auto v = parameter_sharded_tensors(p, 2, {1, 2, 1, 2, 0, 1});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].key, "embedding.word_embeddings.weight");
  EXPECT_EQ(v[0].global_shape, (Shape{4, 2}));
  EXPECT_EQ(v[0].global_offset, (Shape{2, 0}));
  EXPECT_NE(v[0].replica_id, 0);  // DP rank 0, TP-sharded: still not written
}

// Routed experts as Megatron's SequentialMLP / TEGroupedMLP sharded_state_dict: the expert key
// (both parameter names map to it), an expert axis at the global index after the layer axis (or
// no layer axis with per-layer keys), the expert-TP split from the parameter, replicas over
// expt-dp only. Expected boxes written out by hand.
TEST(TrainingCheckpointing, ExpertWeightsUseMegatronKeysAndExpertAxis) {
  EXPECT_EQ(expert_checkpoint_key("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"),
            "decoder.layers.1.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(expert_checkpoint_key("decoder.layers.mlp.experts.linear_fc2.weight12"),
            "decoder.layers.mlp.experts.experts.linear_fc2.weight");
  Parameter p;
  p.name = "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight";
  p.data = Tensor::zeros({8, 3}, DType::kFloat32);  // expert-TP rank 1 of 2: columns 3..5 of [8, 6]
  p.global_shape = {8, 6};
  p.partition_dim = 1;
  p.tp_rank = 1;
  p.tp_size = 2;
  p.tensor_parallel = true;
  p.allreduce = false;
  p.expert_index = 3;
  p.num_experts = 4;
  ParallelRanks r{0, 1, 0, 1, 1, 4};  // dense TP rank 0 of 1, DP rank 1 of 4
  r.edp_rank = 0;                       // expert-DP rank 0: this rank writes its expert
  auto v = parameter_sharded_tensors(p, 2, r);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].key, "decoder.layers.mlp.experts.experts.linear_fc2.weight");
  EXPECT_EQ(v[0].global_shape, (Shape{2, 4, 8, 6}));
  EXPECT_EQ(v[0].global_offset, (Shape{1, 3, 0, 3}));
  EXPECT_EQ(v[0].replica_id, 0);
  r.edp_rank = 1;
  EXPECT_NE(parameter_sharded_tensors(p, 2, r)[0].replica_id, 0);
  p.stack_layers = false;  // --moe-layer-freq a list: per-layer key, no layer axis
  r.edp_rank = 0;
  v = parameter_sharded_tensors(p, 2, r);
  EXPECT_EQ(v[0].key, "decoder.layers.1.mlp.experts.experts.linear_fc2.weight");
  EXPECT_EQ(v[0].global_shape, (Shape{4, 8, 6}));
  EXPECT_EQ(v[0].global_offset, (Shape{3, 0, 3}));
}

// CheckpointConfig::expected_args: load_checkpoint runs check_checkpoint_args before reading any
// tensor (Megatron's load_checkpoint does so unless --finetune); old-style args are not checked.
TEST(TrainingCheckpointing, ExpectedArgsRefuseAnotherArchitectureBeforeLoading) {
  std::string root = tmp_dir("arch");
  Toy t;
  t.st.args = {{"seq_length", 64}, {"num_layers", 1}, {"squared_relu", true}};
  CheckpointConfig cfg;
  cfg.save = cfg.load = root;
  ::testing::internal::CaptureStdout();
  save_checkpoint(t.st, cfg, {});
  Toy u;
  u.w.fill_(0);
  cfg.expected_args = {{"num_layers", 1}, {"squared_relu", false}};
  std::string err;
  try {
    load_checkpoint(u.st, cfg, {});
  } catch (const UserError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find(root + "/iter_0000005: squared_relu (--squared-relu) is False in this run but True in the checkpoint"),
            std::string::npos)
      << err;
  EXPECT_EQ(u.w.to_float_vector(), std::vector<float>(6, 0.0f));  // nothing was read
  cfg.finetune = true;  // weights only: not checked (Megatron)
  EXPECT_TRUE(load_checkpoint(u.st, cfg, {}).loaded);
  EXPECT_EQ(u.w.to_float_vector(), t.w.to_float_vector());
  // A checkpoint that recorded only the old keys (no squared_relu): loads.
  cfg.finetune = false;
  t.st.args = {{"seq_length", 64}, {"num_layers", 1}};
  t.st.iteration = 6;
  save_checkpoint(t.st, cfg, {});
  EXPECT_TRUE(load_checkpoint(u.st, cfg, {}).loaded);
  ::testing::internal::GetCapturedStdout();
  fs::remove_all(root);
}
