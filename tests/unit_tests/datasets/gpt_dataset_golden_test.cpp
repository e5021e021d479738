// GPTDataset / BlendedDataset / masks against the golden vectors of docs/megatron-reference.md#golden-vectors
// Appendix A (produced by running Megatron-LM's own dataset code), and numpy's RNG streams
// (values printed by numpy 1.24: RandomState(1234).shuffle, default_rng(0).integers).
// All comparisons are exact (integer index arrays, hashes, 0/1 masks).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/gpt_dataset.h"
#include "megatron/core/datasets/helpers.h"
#include "megatron/core/datasets/numpy_random.h"
#include "megatron/core/tokenizers/null_tokenizer.h"

namespace fs = std::filesystem;
using namespace megatron::datasets;

namespace {
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
// Appendix A data: doc i has (i%4)+3 tokens 10i+1.. then EOD 999; one sequence per document.
void write_tiny(const std::string& prefix) {
  IndexedDatasetBuilder b(prefix + ".bin", IndexDType::kUInt16);
  for (int i = 0; i < 10; ++i) {
    std::vector<int64_t> t;
    for (int k = 0; k < (i % 4) + 3; ++k) t.push_back(10 * i + 1 + k);
    t.push_back(999);
    b.add_item(t);
    b.end_document();
  }
  b.finalize(prefix + ".idx");
}
std::shared_ptr<GPTDatasetConfig> tiny_config(const std::string& prefix, const std::string& cache) {
  auto c = std::make_shared<GPTDatasetConfig>();
  c->random_seed = 1234;
  c->sequence_length = 8;
  c->blend = Blend{{prefix}, std::nullopt};
  c->split = "80,20,0";
  c->path_to_cache = cache;
  c->tokenizer = std::make_shared<megatron::tokenizers::NullTokenizer>(1000, std::nullopt, -1);
  c->finalize();
  return c;
}
std::vector<int64_t> flat(std::initializer_list<std::pair<int, int>> rows) {
  std::vector<int64_t> v;
  for (auto [a, b] : rows) {
    v.push_back(a);
    v.push_back(b);
  }
  return v;
}
}  // namespace

TEST(NumpyRandom, RandomStateShuffleMatchesNumpy) {
  NumpyRandomState rs(1234);
  std::vector<int> a(20), b(20);
  for (int i = 0; i < 20; ++i) a[i] = b[i] = i;
  rs.shuffle(a);
  rs.shuffle(b);
  EXPECT_EQ(a, (std::vector<int>{3, 13, 2, 16, 14, 5, 4, 0, 8, 18, 17, 11, 10, 9, 7, 1, 19, 12, 6, 15}));
  EXPECT_EQ(b, (std::vector<int>{8, 19, 13, 1, 4, 17, 14, 11, 9, 0, 7, 3, 10, 6, 2, 5, 12, 16, 18, 15}));
}

TEST(NumpyRandom, DefaultRngIntegersMatchesNumpy) {
  NumpyDefaultRng r(0);
  auto v = r.integers_int32(1, 4096, 100000);
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.begin() + 8), (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68}));
  int64_t sum = 0;
  for (auto x : v) sum += x;
  EXPECT_EQ(sum, 204637097);
}

TEST(GPTDatasetGolden, AppendixA) {
  // The description hash includes the dataset path, so the files live at Appendix A's path.
  const std::string dir = "/tmp/verify/g";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = dir + "/tiny_text_document";
  write_tiny(prefix);
  const std::string cache = dir + "/cache_" + std::to_string(::getpid());
  auto cfg = tiny_config(prefix, cache);
  BlendedMegatronDatasetBuilder builder({12, 4, 0}, nullptr, cfg);
  auto ds = builder.build();
  ASSERT_TRUE(ds[0] && ds[1]);
  EXPECT_FALSE(ds[2]);
  auto* train = dynamic_cast<GPTDataset*>(ds[0].get());
  auto* valid = dynamic_cast<GPTDataset*>(ds[1].get());
  ASSERT_TRUE(train && valid);
  EXPECT_EQ(train->unique_description_hash(), "5e3acf55dd0112e05b6bfb58f3d3acf0");
  EXPECT_EQ(train->document_index().to_vector(), (std::vector<int64_t>{5, 3, 0, 4, 6, 2, 2, 7, 1, 1, 0, 4, 5, 6, 3, 7, 5, 1, 3, 4, 0, 7, 6, 2}));
  EXPECT_EQ(train->sample_index().to_vector(), flat({{0, 0}, {1, 3}, {3, 0}, {4, 4}, {6, 0}, {7, 2}, {8, 3}, {10, 1}, {12, 1}, {13, 4},
                                         {14, 6}, {16, 0}, {17, 3}, {18, 6}, {20, 3}, {22, 0}, {23, 2}}));
  EXPECT_EQ(train->shuffle_index().to_vector(), (std::vector<int64_t>{7, 4, 1, 5, 3, 9, 2, 8, 6, 0, 15, 11, 10, 14, 13, 12}));
  EXPECT_EQ(train->size(), 16);
  EXPECT_EQ(train->sample_index().dtype(), NpyDType::kInt32);
  EXPECT_EQ(train->shuffle_index().dtype(), NpyDType::kUInt32);
  GPTSample s0 = train->get(0);
  EXPECT_EQ(s0.tokens, (std::vector<int64_t>{2, 3, 999, 41, 42, 43, 999, 51}));
  EXPECT_EQ(s0.labels, (std::vector<int64_t>{3, 999, 41, 42, 43, 999, 51, 52}));
  EXPECT_EQ(s0.loss_mask, std::vector<float>(8, 1.0f));
  EXPECT_EQ(s0.position_ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  ASSERT_EQ(s0.attention_mask.size(), 64u);
  for (int q = 0; q < 8; ++q)
    for (int k = 0; k < 8; ++k) EXPECT_EQ(s0.attention_mask[q * 8 + k], k > q ? 1 : 0);

  EXPECT_EQ(valid->unique_description_hash(), "ce16281b8c0a6150e410a604a6531989");
  EXPECT_EQ(valid->document_index().to_vector(), (std::vector<int64_t>{8, 9, 8, 8, 8, 9, 9, 9}));
  EXPECT_EQ(valid->sample_index().to_vector(), flat({{0, 0}, {1, 4}, {3, 3}, {5, 3}, {7, 1}}));
  EXPECT_EQ(valid->shuffle_index().to_vector(), (std::vector<int64_t>{0, 2, 1, 3}));
  GPTSample v0 = valid->get(0);
  EXPECT_EQ(v0.tokens, (std::vector<int64_t>{81, 82, 83, 999, 91, 92, 93, 94}));
  EXPECT_EQ(v0.labels, (std::vector<int64_t>{82, 83, 999, 91, 92, 93, 94, 999}));

  // The cache files exist under Megatron's names and a second build reads them back.
  const std::string base = cache + "/5e3acf55dd0112e05b6bfb58f3d3acf0-GPTDataset-train-";
  for (const char* f : {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"})
    EXPECT_TRUE(fs::exists(base + f)) << base + f;
  EXPECT_EQ(slurp(base + "description.txt"), train->unique_description());
  auto again = BlendedMegatronDatasetBuilder({12, 4, 0}, nullptr, cfg).build();
  auto* t2 = dynamic_cast<GPTDataset*>(again[0].get());
  ASSERT_TRUE(t2);
  EXPECT_TRUE(t2->loaded_from_cache());
  EXPECT_EQ(t2->document_index().to_vector(), train->document_index().to_vector());
  EXPECT_EQ(t2->sample_index().to_vector(), train->sample_index().to_vector());
  EXPECT_EQ(t2->shuffle_index().to_vector(), train->shuffle_index().to_vector());
  fs::remove_all(dir);
}

TEST(GPTDatasetGolden, BlendingIndices) {
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices({0.3, 0.7}, 10, di, dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
  build_exhaustive_blending_indices({3, 4}, di, dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3}));
}

TEST(GPTDatasetGolden, ResetMasks) {
  const std::vector<int64_t> tok{5, 6, 999, 7, 8, 9, 999, 3};
  std::vector<uint8_t> am(64);
  std::vector<float> lm(8);
  std::vector<int64_t> pos(8);
  get_ltor_masks_and_position_ids(tok.data(), 8, 999, true, true, true, am.data(), lm.data(), pos.data());
  EXPECT_EQ(pos, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(lm, (std::vector<float>{1, 1, 0, 1, 1, 1, 0, 1}));
  EXPECT_EQ(std::vector<uint8_t>(am.begin() + 32, am.begin() + 40), (std::vector<uint8_t>{1, 1, 1, 0, 0, 1, 1, 1}));
}
