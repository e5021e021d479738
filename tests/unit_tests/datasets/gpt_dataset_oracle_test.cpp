// Index files and samples equal to what Megatron-LM's own dataset code writes, for the
// configurations of tests/reference/datasets/generate.py (different seeds, splits and sequence
// lengths, a weighted blend of three datasets, an unweighted blend, per-split blends, more than
// one epoch with and without a separate final epoch, zero-length sequences, int32 tokens without
// the extra token, mock data). Every cache file must be byte-identical (MD5 of the whole file,
// header included), and the sampled __getitem__ outputs equal exactly.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/tokenizers/null_tokenizer.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace megatron::datasets;

namespace {
const std::string kRef = std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/datasets";

std::string file_md5(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  return md5_hex(s);
}

json manifest() {
  std::ifstream f(kRef + "/manifest.json");
  return json::parse(f);
}

// Same formulas as generate.py.
int64_t seq_len(const json& p, int64_t i) {
  if (p["lo"].get<int64_t>() == 0 && i % 3 == 0) return 0;
  return (p["a"].get<int64_t>() * i * i + p["b"].get<int64_t>() * i + p["c"].get<int64_t>()) % p["m"].get<int64_t>() +
         std::max<int64_t>(p["lo"].get<int64_t>(), 1);
}

void write_datasets(const json& m) {
  const int64_t vocab = m["vocab_size"];
  for (auto& [name, p] : m["datasets"].items()) {
    const std::string prefix = m["root"].get<std::string>() + "/data/" + name;
    fs::create_directories(fs::path(prefix).parent_path());
    IndexedDatasetBuilder b(prefix + ".bin", p["dtype"] == "int32" ? IndexDType::kInt32 : IndexDType::kUInt16);
    for (int64_t i = 0; i < p["n"].get<int64_t>(); ++i) {
      const int64_t n = seq_len(p, i);
      std::vector<int64_t> t;
      for (int64_t j = 0; j < n; ++j) t.push_back(j == n - 1 ? vocab - 1 : (i * 31 + j * 17) % (vocab - 1));
      b.add_item(t);
      b.end_document();
    }
    b.finalize(prefix + ".idx");
    ASSERT_EQ(file_md5(prefix + ".bin"), p["bin_md5"]) << name;
    ASSERT_EQ(file_md5(prefix + ".idx"), p["idx_md5"]) << name;
  }
}

std::vector<std::string> subst(const json& m, const json& list) {
  std::vector<std::string> out;
  for (auto& e : list) {
    std::string s = e;
    if (m["datasets"].contains(s)) s = m["root"].get<std::string>() + "/data/" + s;
    out.push_back(s);
  }
  return out;
}

class Oracle : public ::testing::TestWithParam<std::string> {};

TEST_P(Oracle, IndexFilesAndSamplesEqualMegatron) {
  const json m = manifest();
  write_datasets(m);
  const std::string name = GetParam();
  const json& c = m["configs"][name];
  auto cfg = std::make_shared<GPTDatasetConfig>();
  cfg->random_seed = c["seed"];
  cfg->sequence_length = c["seq"];
  cfg->tokenizer = std::make_shared<megatron::tokenizers::NullTokenizer>(m["vocab_size"].get<int64_t>(), std::nullopt, -1);
  const std::string cache = m["root"].get<std::string>() + "/cache_cpp/" + name;
  fs::remove_all(cache);
  cfg->path_to_cache = cache;
  const bool reset = c.value("reset", false);
  cfg->reset_position_ids = cfg->reset_attention_mask = cfg->eod_mask_loss = reset;
  cfg->add_extra_token_to_sequence = c.value("add_extra_token", true);
  if (c.contains("per_split")) {
    std::array<std::optional<Blend>, 3> per;
    for (int i = 0; i < 3; ++i) per[i] = get_blend_from_list(subst(m, c["per_split"][i]));
    cfg->blend_per_split = per;
  } else if (c.contains("data_path")) {
    cfg->blend = get_blend_from_list(subst(m, c["data_path"]));
    cfg->split = c["split"].get<std::string>();
  }
  cfg->finalize();
  SplitSizes sizes;
  for (int i = 0; i < 3; ++i)
    if (!c["sizes"][i].is_null()) sizes[i] = c["sizes"][i].get<int64_t>();
  auto ds = BlendedMegatronDatasetBuilder(sizes, nullptr, cfg).build();

  // every file Megatron wrote, byte-identical, and no extra ones
  size_t ours = 0;
  for (auto& e : fs::directory_iterator(cache)) ours += e.path().extension() != ".tmp";
  EXPECT_EQ(ours, c["files"].size());
  for (auto& [f, md5] : c["files"].items()) {
    ASSERT_TRUE(fs::exists(cache + "/" + f)) << f;
    EXPECT_EQ(file_md5(cache + "/" + f), md5.get<std::string>()) << f;
  }

  const char* names[3] = {"train", "valid", "test"};
  std::ifstream sf(kRef + "/" + name + "/samples.json");
  const json samples = json::parse(sf);
  for (int i = 0; i < 3; ++i) {
    const json& len = c["lengths"][names[i]];
    if (len.is_null()) {
      EXPECT_FALSE(ds[i]) << names[i];
      continue;
    }
    ASSERT_TRUE(ds[i]) << names[i];
    EXPECT_EQ(ds[i]->size(), len.get<int64_t>()) << names[i];
    for (const json& s : samples[names[i]]) {
      GPTSample g = ds[i]->get(s["index"].get<int64_t>());
      const std::string where = std::string(names[i]) + " sample " + std::to_string(s["index"].get<int64_t>());
      EXPECT_EQ(g.tokens, s["tokens"].get<std::vector<int64_t>>()) << where;
      EXPECT_EQ(g.labels, s["labels"].get<std::vector<int64_t>>()) << where;
      EXPECT_EQ(g.position_ids, s["position_ids"].get<std::vector<int64_t>>()) << where;
      EXPECT_EQ(g.loss_mask, s["loss_mask"].get<std::vector<float>>()) << where;
      if (s.contains("dataset_id")) EXPECT_EQ(g.dataset_id, s["dataset_id"].get<int>()) << where;
      if (s.contains("attention_mask_md5")) {
        std::string bytes(g.attention_mask.begin(), g.attention_mask.end());
        EXPECT_EQ(md5_hex(bytes), s["attention_mask_md5"].get<std::string>()) << where;
      }
    }
  }
  // a second build reads the cache back and gives the same samples
  auto again = BlendedMegatronDatasetBuilder(sizes, nullptr, cfg).build();
  for (int i = 0; i < 3; ++i) {
    if (!ds[i]) continue;
    ASSERT_EQ(again[i]->size(), ds[i]->size());
    const int64_t k = ds[i]->size() / 3;
    EXPECT_EQ(again[i]->get(k).tokens, ds[i]->get(k).tokens);
  }
  fs::remove_all(cache);
}

std::vector<std::string> config_names() {
  std::vector<std::string> v;
  const json m = manifest();
  for (auto it = m["configs"].begin(); it != m["configs"].end(); ++it) v.push_back(it.key());
  return v;
}

INSTANTIATE_TEST_SUITE_P(GPTDatasetOracle, Oracle, ::testing::ValuesIn(config_names()),
                         [](const auto& info) { return info.param; });
}  // namespace
