// MegatronPretrainingSampler order and the prefetching loader (data_samplers.py semantics,
// docs/megatron-reference.md#data-loader-order), the requested sample counts of training.py (#sample-counts), and Python details the
// cache names depend on (float repr). Expected values are worked out by hand from the formulas.
#include "megatron/training/datasets/data_samplers.h"

#include <gtest/gtest.h>

#include <barrier>
#include <filesystem>
#include <thread>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/core/utils/errors.h"

using namespace megatron::datasets;
using megatron::training::DataLoaderOptions;
using megatron::training::GPTDataLoader;
using megatron::training::MegatronPretrainingSampler;

TEST(PretrainingSampler, ChunksAndRankSlices) {
  // total 23, mbs 2, dp 3: chunks [0..5], [6..11], [12..17]; 18..22 dropped. Rank 1 gets 2,3 / 8,9 / 14,15.
  MegatronPretrainingSampler s(23, 0, 2, 1, 3);
  std::vector<int64_t> b;
  std::vector<std::vector<int64_t>> got;
  while (s.next(b)) got.push_back(b);
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{2, 3}, {8, 9}, {14, 15}}));
  // resume from consumed 12: only the third chunk
  MegatronPretrainingSampler r(23, 12, 2, 1, 3);
  got.clear();
  while (r.next(b)) got.push_back(b);
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{14, 15}}));
  // drop_last=false yields the rank's slice of the partial chunk 18..22 -> [20, 21]
  MegatronPretrainingSampler k(23, 12, 2, 1, 3, false);
  got.clear();
  while (k.next(b)) got.push_back(b);
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{14, 15}, {20, 21}}));
  EXPECT_THROW(MegatronPretrainingSampler(10, 10, 1, 0, 1), megatron::UserError);
  EXPECT_THROW(MegatronPretrainingSampler(10, 0, 1, 2, 2), megatron::UserError);
}

TEST(NumSamples, TrainValidTest) {
  NumSamplesArgs a;
  a.train_iters = 1000;
  a.global_batch_size = 8;
  a.eval_interval = 100;
  a.eval_iters = 10;
  auto s = get_train_valid_test_num_samples(a);
  EXPECT_EQ(*s[0], 8000);
  EXPECT_EQ(*s[1], (1000 / 100 + 1) * 10 * 8);
  EXPECT_EQ(*s[2], 80);
  a.train_samples = 4004;  // train_iters = 500
  s = get_train_valid_test_num_samples(a);
  EXPECT_EQ(*s[0], 4004);
  EXPECT_EQ(*s[1], (500 / 100 + 1) * 10 * 8);
  a.start_eval_at_iter = 250;  // skips 2 points
  s = get_train_valid_test_num_samples(a);
  EXPECT_EQ(*s[1], (6 - 2) * 10 * 8);
  a.full_validation = true;
  EXPECT_FALSE(get_train_valid_test_num_samples(a)[1]);
}

TEST(DatasetUtils, PythonFloatRepr) {
  // Python 3: repr of these floats
  EXPECT_EQ(python_float_repr(0.8), "0.8");
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(python_float_repr(969.0 / 1000.0), "0.969");
}

namespace {
std::shared_ptr<GPTDatasetConfig> mock_config(int64_t seq) {
  auto c = std::make_shared<GPTDatasetConfig>();
  c->sequence_length = seq;
  c->tokenizer = std::make_shared<megatron::tokenizers::NullTokenizer>(128, std::nullopt, -1);
  c->finalize();
  return c;
}
}  // namespace

TEST(GPTDataLoader, YieldsSamplerOrderAsBatches) {
  auto ds = BlendedMegatronDatasetBuilder({64, 8, 8}, nullptr, mock_config(256)).build();
  std::shared_ptr<const TopLevelDataset> train = ds[0];
  DataLoaderOptions o;
  o.micro_batch_size = 2;
  o.data_parallel_rank = 1;
  o.data_parallel_size = 2;
  o.consumed_samples = 8;
  GPTDataLoader loader(train, o);
  GPTBatch b;
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.tokens.shape(), (megatron::Shape{2, 256}));
  EXPECT_FALSE(b.attention_mask.defined());
  // first batch of rank 1 after 8 consumed: samples 10, 11
  for (int r = 0; r < 2; ++r) {
    GPTSample s = train->get(10 + r);
    for (int k = 0; k < 256; ++k) {
      ASSERT_EQ(b.tokens.data<int64_t>()[r * 256 + k], s.tokens[k]);
      ASSERT_EQ(b.labels.data<int64_t>()[r * 256 + k], s.labels[k]);
      ASSERT_EQ(b.position_ids.data<int64_t>()[r * 256 + k], s.position_ids[k]);
      ASSERT_EQ(b.loss_mask.data<float>()[r * 256 + k], s.loss_mask[k]);
    }
  }
  EXPECT_EQ(loader.consumed_samples(), 12);
  // second batch: samples 14, 15
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.tokens.data<int64_t>()[0], train->get(14).tokens[0]);
  EXPECT_EQ(b.tokens.data<int64_t>()[256], train->get(15).tokens[0]);
}

TEST(GPTDataLoader, EndsAfterLastCompleteChunk) {
  // A blend-free small dataset: 10 sequences of 9 tokens, seq 8 -> (90 - 1) // 8 = 11 samples in one
  // epoch of the whole split; mbs 2, dp 2 -> chunks [0..3], [4..7]; 8..10 dropped: 2 batches.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("megatron_ds_loader_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = (dir / "d").string();
  {
    IndexedDatasetBuilder w(prefix + ".bin", IndexDType::kUInt16);
    for (int i = 0; i < 10; ++i) {
      w.add_item(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 127});
      w.end_document();
    }
    w.finalize(prefix + ".idx");
  }
  auto c = std::make_shared<GPTDatasetConfig>();
  c->sequence_length = 8;
  c->blend = Blend{{prefix}, std::nullopt};
  c->split = "100,0,0";
  c->path_to_cache = (dir / "cache").string();
  c->tokenizer = std::make_shared<megatron::tokenizers::NullTokenizer>(128, std::nullopt, -1);
  c->finalize();
  auto ds = BlendedMegatronDatasetBuilder({std::nullopt, std::nullopt, std::nullopt}, nullptr, c).build();
  ASSERT_EQ(ds[0]->size(), 11);
  DataLoaderOptions o;
  o.micro_batch_size = 2;
  o.data_parallel_size = 2;
  o.num_workers = 0;
  GPTDataLoader loader(ds[0], o);
  GPTBatch b;
  int n = 0;
  while (loader.next(b)) ++n;
  EXPECT_EQ(n, 2);
  EXPECT_EQ(loader.consumed_samples(), 8);
  fs::remove_all(dir);
}

TEST(GPTDataLoader, AttentionMaskOnRequest) {
  auto c = mock_config(64);
  c->reset_attention_mask = true;
  auto ds = BlendedMegatronDatasetBuilder({8, 0, 0}, nullptr, c).build();
  DataLoaderOptions o;
  o.micro_batch_size = 2;
  o.attention_mask = true;
  GPTDataLoader loader(ds[0], o);
  GPTBatch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_EQ(b.attention_mask.shape(), (megatron::Shape{2, 1, 64, 64}));
  const GPTSample s = ds[0]->get(0);
  for (int k = 0; k < 64 * 64; ++k) ASSERT_EQ(b.attention_mask.data<uint8_t>()[k], s.attention_mask[k]) << k;
  EXPECT_EQ(s.attention_mask[0 * 64 + 1], 1);  // row 0 cannot see column 1
}

TEST(DatasetDistributed, RankZeroBuildsOthersLoad) {
  // Two "ranks" as threads sharing a barrier: rank 0 writes the caches, rank 1 reads them.
  namespace fs = std::filesystem;
  const fs::path cache = fs::temp_directory_path() / ("megatron_ds_dist_" + std::to_string(::getpid()));
  fs::remove_all(cache);
  std::barrier bar(2);
  std::array<std::array<std::shared_ptr<TopLevelDataset>, 3>, 2> out;
  auto run = [&](int rank) {
    auto c = std::make_shared<GPTDatasetConfig>(*mock_config(256));
    c->path_to_cache = cache.string();
    c->distributed.initialized = true;
    c->distributed.rank = rank;
    c->distributed.barrier = [&] { bar.arrive_and_wait(); };
    out[rank] = BlendedMegatronDatasetBuilder({16, 4, 4}, nullptr, c).build();
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  for (int i = 0; i < 3; ++i) {
    auto* a = dynamic_cast<GPTDataset*>(out[0][i].get());
    auto* b = dynamic_cast<GPTDataset*>(out[1][i].get());
    ASSERT_TRUE(a && b);
    EXPECT_FALSE(a->loaded_from_cache());
    EXPECT_TRUE(b->loaded_from_cache());
    EXPECT_EQ(a->shuffle_index().to_vector(), b->shuffle_index().to_vector());
    EXPECT_EQ(a->get(3).tokens, b->get(3).tokens);
  }
  fs::remove_all(cache);
}

TEST(DatasetUtils, BlendFromFlags) {
  // get_blend_from_list: weights and prefixes, prefixes only, strip()
  Blend b = get_blend_from_list({"30", " a ", "70", "b"});
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(b.weights);
  EXPECT_EQ(*b.weights, (std::vector<double>{30.0, 70.0}));
  b = get_blend_from_list({"a", "b"});
  EXPECT_FALSE(b.weights);
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  // Megatron: a non-float among the even entries -> all entries are prefixes
  b = get_blend_from_list({"1", "a", "b", "c"});
  EXPECT_FALSE(b.weights);
  EXPECT_EQ(b.prefixes.size(), 4u);
  DataPathArgs a;
  a.train_data_path = std::vector<std::string>{"t1"};
  a.test_data_path = std::vector<std::string>{"0.5", "x", "0.5", "y"};
  auto [blend, per] = get_blend_and_blend_per_split(a);
  EXPECT_FALSE(blend);
  ASSERT_TRUE(per);
  EXPECT_TRUE((*per)[0] && !(*per)[1] && (*per)[2]);
  EXPECT_EQ((*per)[2]->prefixes, (std::vector<std::string>{"x", "y"}));
  a.data_path = std::vector<std::string>{"z"};
  EXPECT_THROW(get_blend_and_blend_per_split(a), megatron::UserError);
}

TEST(DatasetUtils, SplitMatrix) {
  // "99,1,0" -> [(0, 0.99), (0.99, 1.0), None]; bounds over 10 elements round half to even
  auto m = convert_split_vector_to_split_matrix(parse_and_normalize_split("99,1,0"));
  ASSERT_TRUE(m[0] && m[1]);
  EXPECT_FALSE(m[2]);
  EXPECT_TRUE(m[0]->lo_is_int);
  EXPECT_EQ(m[0]->hi, 0.99);
  EXPECT_EQ(m[1]->hi, 1.0);
  EXPECT_EQ(json_dumps_indent4(split_matrix_json(m)), "[\n    [\n        0,\n        0.99\n    ],\n    [\n        0.99,\n        1.0\n    ],\n    null\n]");
  // 0.25 * 10 = 2.5 -> 2, 0.75 * 10 = 7.5 -> 8 (Python round)
  EXPECT_EQ(split_range(SplitBookend{0.25, 0.75, false}, 10), (std::pair<int64_t, int64_t>{2, 8}));
}

TEST(DatasetUtils, JsonDumpsLikePython) {
  // expected string printed by Python 3.11:
  // json.dumps({'a':'é\t"x\x7f😀','b':[],'c':{},'d':None,'e':[1e-05, 0.1]}, indent=4)
  JsonValue o = JsonValue::make_object();
  o.add("a", JsonValue::string("\xc3\xa9\t\"x\x7f\xf0\x9f\x98\x80"));
  o.add("b", JsonValue::make_list());
  o.add("c", JsonValue::make_object());
  o.add("d", JsonValue::null());
  o.add("e", JsonValue::make_list().push(JsonValue::real(1e-05)).push(JsonValue::real(0.1)));
  EXPECT_EQ(json_dumps_indent4(o),
            "{\n    \"a\": \"\\u00e9\\t\\\"x\\u007f\\ud83d\\ude00\",\n    \"b\": [],\n    \"c\": {},\n    \"d\": null,\n"
            "    \"e\": [\n        1e-05,\n        0.1\n    ]\n}");
}
