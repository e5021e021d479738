// Sharded save/load: multi-rank saves (threads as ranks) reloaded onto other layouts. Expected
// values come from construction: element i of every global tensor holds the value i (exact in
// fp32/bf16 for the sizes used), so any misplaced element is caught without using our code.
#include "megatron/core/dist_checkpointing/serialization.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "test_utils/thread_group_util.h"

using namespace megatron;
using namespace megatron::dist_checkpointing;
namespace fs = std::filesystem;
using megatron::testing::run_ranks;

namespace {

std::string tmp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("megatron_dc_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// Global tensor of `shape` whose element at flat index i is i; returns the sub-box.
Tensor iota_box(const Shape& gshape, const Shape& off, const Shape& lshape, DType dt = DType::kFloat32) {
  std::vector<float> v;
  const int64_t n = shape_numel(lshape);
  Shape idx(lshape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t flat = 0;
    for (size_t a = 0; a < gshape.size(); ++a) flat = flat * gshape[a] + off[a] + idx[a];
    v.push_back(static_cast<float>(flat));
    for (size_t a = lshape.size(); a-- > 0;) {
      if (++idx[a] < lshape[a]) break;
      idx[a] = 0;
    }
  }
  Tensor t = Tensor::from_vector(v, lshape.empty() ? Shape{} : lshape);
  return dt == DType::kFloat32 ? t : t.to(dt);
}

std::vector<float> iota(int64_t b, int64_t e) {
  std::vector<float> v;
  for (int64_t i = b; i < e; ++i) v.push_back(static_cast<float>(i));
  return v;
}

constexpr int64_t L = 4, R = 6, C = 8, V = 10;

// What rank (pp, tp) of a TP2 x PP2 layout holds.
ShardedStateDict tp2pp2_state(int pp, int tp) {
  ShardedStateDict sd;
  for (int64_t l = 2 * pp; l < 2 * pp + 2; ++l) {
    // column-parallel weight: rows split over TP, stacked over layers
    Tensor w = iota_box({L, R, C}, {l, tp * 3, 0}, {1, 3, C}).view({3, C});
    sd.tensors.push_back(ShardedTensor::from_rank_offsets("decoder.layers.linear.weight", w, {{0, tp, 2}}, 0, {{l, L}}));
    // replicated layernorm: only tp 0 writes
    Tensor ln = iota_box({L, C}, {l, 0}, {1, C}).view({C});
    sd.tensors.push_back(ShardedTensor::from_rank_offsets("decoder.layers.norm.weight", ln, {}, tp, {{l, L}}));
  }
  // bf16 embedding, vocab rows split over TP, present on the first stage only
  if (pp == 0) {
    Tensor e = iota_box({V, C}, {tp * 5, 0}, {5, C}, DType::kBFloat16);
    sd.tensors.push_back(ShardedTensor::from_rank_offsets("embedding.word_embeddings.weight", e, {{0, tp, 2}}));
  }
  // optimizer-style flat shard of a [V, C] fp32 tensor: the 4 ranks hold 20 elements each
  int r = pp * 2 + tp;
  ShardedTensor fl;
  fl.key = "optimizer.state.exp_avg.embedding.word_embeddings.weight";
  fl.global_shape = {V, C};
  fl.global_offset = {0, 0};
  fl.local_shape = {V, C};
  fl.flattened_range = std::make_pair(int64_t(20) * r, int64_t(20) * (r + 1));
  fl.data = Tensor::from_vector(iota(20 * r, 20 * (r + 1)), {20});
  sd.tensors.push_back(fl);
  sd.objects.push_back({"rng_state", {{"seed", 100 + r}}, {2, 2}, {pp, tp}});
  sd.common = {{"iteration", 7}, {"note", "rank0"}};
  if (r != 0) sd.common = {{"note", "ignored"}};
  return sd;
}

void save_tp2pp2(const std::string& dir) {
  run_ranks(4, [&](int r, comm::ProcessGroup& g) { save(tp2pp2_state(r / 2, r % 2), dir, &g); });
}

}  // namespace

TEST(DistCheckpointing, SaveTP2PP2LoadWhole) {
  std::string root = tmp_dir("whole");
  std::string dir = root + "/iter_0000007";
  save_tp2pp2(dir);
  EXPECT_TRUE(fs::exists(dir + "/metadata.json"));
  EXPECT_TRUE(fs::exists(dir + "/.metadata"));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(dir + "/__" + std::to_string(r) + "_0.safetensors"));
  for (const auto& e : fs::directory_iterator(root))  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();

  ShardedStateDict sd;
  sd.tensors.push_back(ShardedTensor::from_tensor("decoder.layers.linear.weight", Tensor::zeros({L, R, C}, DType::kFloat32)));
  sd.tensors.push_back(ShardedTensor::from_tensor("decoder.layers.norm.weight", Tensor::zeros({L, C}, DType::kFloat32)));
  // bf16 stored -> fp32 target (exact: integers < 256)
  sd.tensors.push_back(ShardedTensor::from_tensor("embedding.word_embeddings.weight", Tensor::zeros({V, C}, DType::kFloat32)));
  sd.tensors.push_back(ShardedTensor::from_tensor("optimizer.state.exp_avg.embedding.word_embeddings.weight",
                                                  Tensor::zeros({V, C}, DType::kFloat32)));
  sd.objects.push_back({"rng_state", nullptr, {2, 2}, {1, 0}});
  sd.objects.push_back({"rng_state", nullptr, {1, 1}, {0, 0}});  // other grid: not found
  auto common = load(sd, dir);
  EXPECT_EQ(common["iteration"], 7);
  EXPECT_EQ(common["note"], "rank0");
  EXPECT_EQ(sd.tensors[0].data.to_float_vector(), iota(0, L * R * C));
  EXPECT_EQ(sd.tensors[1].data.to_float_vector(), iota(0, L * C));
  EXPECT_EQ(sd.tensors[2].data.to_float_vector(), iota(0, V * C));
  EXPECT_EQ(sd.tensors[3].data.to_float_vector(), iota(0, V * C));
  EXPECT_TRUE(sd.objects[0].loaded);
  EXPECT_EQ(sd.objects[0].value["seed"], 102);
  EXPECT_FALSE(sd.objects[1].loaded);
  auto idx = load_index(dir);
  EXPECT_EQ(idx.tensors.at("decoder.layers.linear.weight").shards.size(), 8u);  // 4 layers x 2 TP
  EXPECT_EQ(idx.tensors.at("decoder.layers.norm.weight").shards.size(), 4u);    // replicas written once
  EXPECT_EQ(idx.tensors.at("embedding.word_embeddings.weight").dtype, DType::kBFloat16);
  fs::remove_all(root);
}

TEST(DistCheckpointing, ReshardToTP3PP1AndFlatRanges) {
  std::string root = tmp_dir("reshard");
  std::string dir = root + "/ckpt";
  save_tp2pp2(dir);
  // TP3 x PP1 (3 ranks, no collectives needed for load): rows split in 3, all layers.
  for (int tp = 0; tp < 3; ++tp) {
    ShardedStateDict sd;
    for (int64_t l = 0; l < L; ++l)
      sd.tensors.push_back(ShardedTensor::from_rank_offsets("decoder.layers.linear.weight",
                                                            Tensor::zeros({2, C}, DType::kFloat32), {{0, tp, 3}}, 0, {{l, L}}));
    load(sd, dir);
    for (int64_t l = 0; l < L; ++l)
      EXPECT_EQ(sd.tensors[l].data.to_float_vector(), iota_box({L, R, C}, {l, tp * 2, 0}, {1, 2, C}).to_float_vector())
          << "tp " << tp << " layer " << l;
  }
  // Distributed-optimizer style flat ranges over another split (3 DP ranks of a 80-element
  // tensor: 27/27/26), requesting both a stored-flat key and a stored-box key.
  int64_t cuts[] = {0, 27, 54, 80};
  for (int d = 0; d < 3; ++d) {
    for (const char* key : {"optimizer.state.exp_avg.embedding.word_embeddings.weight", "embedding.word_embeddings.weight"}) {
      ShardedStateDict sd;
      ShardedTensor t;
      t.key = key;
      t.global_shape = t.local_shape = {V, C};
      t.global_offset = {0, 0};
      t.flattened_range = std::make_pair(cuts[d], cuts[d + 1]);
      t.data = Tensor::zeros({cuts[d + 1] - cuts[d]}, DType::kFloat32);
      sd.tensors.push_back(t);
      load(sd, dir);
      EXPECT_EQ(sd.tensors[0].data.to_float_vector(), iota(cuts[d], cuts[d + 1])) << key << " dp " << d;
    }
  }
  // A flat range inside a TP box of a stacked tensor: layer 3, rows 1..4 (box [1,3,8]), elements 5..17.
  {
    ShardedStateDict sd;
    ShardedTensor t;
    t.key = "decoder.layers.linear.weight";
    t.global_shape = {L, R, C};
    t.global_offset = {3, 1, 0};
    t.local_shape = {1, 3, C};
    t.flattened_range = std::make_pair(int64_t(5), int64_t(17));
    t.data = Tensor::zeros({12}, DType::kFloat32);
    sd.tensors.push_back(t);
    load(sd, dir);
    auto box = iota_box({L, R, C}, {3, 1, 0}, {1, 3, C}).to_float_vector();
    EXPECT_EQ(sd.tensors[0].data.to_float_vector(), std::vector<float>(box.begin() + 5, box.begin() + 17));
  }
  fs::remove_all(root);
}

TEST(DistCheckpointing, CorruptMissingAndIncompleteCheckpointsNameTheProblem) {
  std::string root = tmp_dir("corrupt");
  std::string dir = root + "/ckpt";
  save_tp2pp2(dir);
  auto want_error = [&](const std::string& d, const std::string& needle1, const std::string& needle2) {
    ShardedStateDict sd;
    sd.tensors.push_back(ShardedTensor::from_tensor("decoder.layers.linear.weight", Tensor::zeros({L, R, C}, DType::kFloat32)));
    try {
      load(sd, d);
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(needle1), std::string::npos) << m;
      EXPECT_NE(m.find(needle2), std::string::npos) << m;
    }
  };
  // flip one byte inside a shard of rank 1's file (located through the index)
  std::string f1 = dir + "/__1_0.safetensors";
  auto idx = load_index(dir);
  uint64_t at = 0;
  for (const auto& s : idx.tensors.at("decoder.layers.linear.weight").shards)
    if (s.file == "__1_0.safetensors") at = s.byte_begin + 5;
  ASSERT_GT(at, 0u);
  {
    std::fstream f(f1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x40));
  }
  {
    ShardedStateDict sd;
    sd.tensors.push_back(ShardedTensor::from_tensor("decoder.layers.linear.weight", Tensor::zeros({L, R, C}, DType::kFloat32)));
    try {
      load(sd, dir);
      ADD_FAILURE() << "corruption not detected";
    } catch (const UserError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("corrupt shard"), std::string::npos) << m;
      EXPECT_NE(m.find("__1_0.safetensors"), std::string::npos) << m;
      EXPECT_NE(m.find("decoder.layers.linear.weight"), std::string::npos) << m;
    }
  }
  fs::remove(f1);
  want_error(dir, "__1_0.safetensors", "missing");
  fs::remove(dir + "/metadata.json");
  want_error(dir, "no metadata.json", dir);
  want_error(root + "/nope", "does not exist", "nope");
  fs::remove_all(root);
}

TEST(DistCheckpointing, LoadErrorsForWrongModel) {
  std::string dir = tmp_dir("wrong") + "/ckpt";
  save(ShardedStateDict{{ShardedTensor::from_tensor("a", Tensor::zeros({2, 3}, DType::kFloat32))}, {}, {}}, dir);
  ShardedStateDict sd{{ShardedTensor::from_tensor("a", Tensor::zeros({3, 2}, DType::kFloat32))}, {}, {}};
  EXPECT_THROW(
      {
        try {
          load(sd, dir);
        } catch (const UserError& e) {
          EXPECT_NE(std::string(e.what()).find("global shape [2, 3]"), std::string::npos) << e.what();
          throw;
        }
      },
      UserError);
  ShardedStateDict sd2{{ShardedTensor::from_tensor("b", Tensor::zeros({2, 3}, DType::kFloat32))}, {}, {}};
  EXPECT_THROW(load(sd2, dir), UserError);
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(DistCheckpointing, SaveRejectsMissingAndDuplicatePieces) {
  std::string dir = tmp_dir("pieces") + "/ckpt";
  // rank 1 forgets its half: coverage error on every rank, nothing published
  EXPECT_THROW(run_ranks(2,
                         [&](int r, comm::ProcessGroup& g) {
                           ShardedStateDict sd;
                           if (r == 0)
                             sd.tensors.push_back(ShardedTensor::from_rank_offsets("w", Tensor::zeros({2}, DType::kFloat32), {{0, 0, 2}}));
                           save(sd, dir, &g);
                         }),
               UserError);
  EXPECT_FALSE(fs::exists(dir));
  // both ranks claim replica 0 of the same piece
  EXPECT_THROW(run_ranks(2,
                         [&](int, comm::ProcessGroup& g) {
                           save(ShardedStateDict{{ShardedTensor::from_tensor("w", Tensor::zeros({2}, DType::kFloat32))}, {}, {}},
                                dir, &g);
                         }),
               UserError);
  EXPECT_FALSE(fs::exists(dir));
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(DistCheckpointing, AsyncSaveWritesTheSnapshotAndReplacesAtomically) {
  std::string dir = tmp_dir("async") + "/ckpt";
  Tensor w = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  save(ShardedStateDict{{ShardedTensor::from_tensor("w", w.clone())}, {}, {{"v", 1}}}, dir);
  ShardedStateDict sd{{ShardedTensor::from_tensor("w", w)}, {}, {{"v", 2}}};
  auto req = save_async(sd, dir);
  w.fill_(-1.0f);  // training continues: the snapshot must not see this
  bool ran = false;
  req->add_finalize_fn([&] { ran = true; });
  req->finalize();
  EXPECT_TRUE(ran);
  ShardedStateDict back{{ShardedTensor::from_tensor("w", Tensor::zeros({2, 2}, DType::kFloat32))}, {}, {}};
  auto common = load(back, dir);
  EXPECT_EQ(common["v"], 2);  // the new checkpoint replaced the old one
  EXPECT_EQ(back.tensors[0].data.to_float_vector(), (std::vector<float>{1, 2, 3, 4}));
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(DistCheckpointing, CopyBoxOverlapScalarAndConversion) {
  float s = 3.5f, d = 0.0f;
  EXPECT_EQ(copy_box_overlap(reinterpret_cast<const uint8_t*>(&s), DType::kFloat32, {}, {}, 0, 1,
                             reinterpret_cast<uint8_t*>(&d), DType::kFloat32, {}, {}, 0, 1), 1);
  EXPECT_EQ(d, 3.5f);
  // src box rows 2..3 of a [4, 3] tensor (bf16), dst box rows 1..2 (fp32): overlap = row 2
  uint16_t src[6] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0};  // 1..6 in bf16
  float dst[6] = {};
  EXPECT_EQ(copy_box_overlap(reinterpret_cast<const uint8_t*>(src), DType::kBFloat16, {2, 0}, {2, 3}, 0, 6,
                             reinterpret_cast<uint8_t*>(dst), DType::kFloat32, {1, 0}, {2, 3}, 0, 6), 3);
  EXPECT_EQ(std::vector<float>(dst, dst + 6), (std::vector<float>{0, 0, 0, 1, 2, 3}));
}

// A save never deletes what is not a checkpoint (Megatron's dist_checkpointing.save refuses a
// non-empty destination); an earlier checkpoint at the same path is replaced. Expected values:
// the user's file content as written here, and the error naming the file.
TEST(DistCheckpointing, SaveRefusesToReplaceForeignFilesButReplacesACheckpoint) {
  const std::string root = tmp_dir("foreign");
  const std::string dir = root + "/ckpt";
  fs::create_directories(dir);
  { std::ofstream(dir + "/important.txt") << "precious"; }
  ShardedStateDict sd;
  sd.tensors.push_back(ShardedTensor::from_tensor("w", iota_box({4, 3}, {0, 0}, {4, 3})));
  try {
    save(sd, dir);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("important.txt"), std::string::npos) << e.what();
  }
  std::ifstream in(dir + "/important.txt");
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "precious");
  for (const auto& e : fs::directory_iterator(root))  // nothing half-written is left beside it
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // A regular file at the destination is refused too.
  const std::string file_dst = root + "/plainfile";
  { std::ofstream(file_dst) << "x"; }
  EXPECT_THROW(save(sd, file_dst), UserError);
  EXPECT_TRUE(fs::is_regular_file(file_dst));
  // An earlier checkpoint is replaced (re-saving the same step).
  fs::remove(dir + "/important.txt");
  save(sd, dir);
  save(sd, dir);
  ShardedStateDict back;
  back.tensors.push_back(ShardedTensor::from_tensor("w", Tensor::zeros({4, 3}, DType::kFloat32)));
  load(back, dir);
  EXPECT_EQ(back.tensors[0].data.data<float>()[11], 11.0f);
  fs::remove_all(root);
}

// MEGATRON_CKPT_* settings accept whole numbers in range only (strtol with trailing text used
// to pass "32MB" as 32 and any value but "0" as O_DIRECT on).
TEST(DistCheckpointing, IoEnvironmentValuesAreStrict) {
  auto rejects = [](const char* var, const char* val) {
    ::setenv(var, val, 1);
    EXPECT_THROW(io_options_from_env(), UserError) << var << "=" << val;
    ::unsetenv(var);
  };
  rejects("MEGATRON_CKPT_O_DIRECT", "false");
  rejects("MEGATRON_CKPT_O_DIRECT", "2");
  rejects("MEGATRON_CKPT_IO_CHUNK_MB", "32MB");
  rejects("MEGATRON_CKPT_IO_THREADS", "2x");
  rejects("MEGATRON_CKPT_READ_CHUNK_MB", "0");
  ::setenv("MEGATRON_CKPT_O_DIRECT", "0", 1);
  EXPECT_FALSE(io_options_from_env().direct);
  ::unsetenv("MEGATRON_CKPT_O_DIRECT");
}
