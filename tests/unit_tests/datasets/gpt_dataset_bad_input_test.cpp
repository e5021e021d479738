// Bad input to the dataset builder: each case is one UserError whose message names the file or
// flag. (Megatron itself fails on several of these with an assert or, for an empty split, hangs;
// see docs/datasets.md.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/core/utils/errors.h"

namespace fs = std::filesystem;
using namespace megatron::datasets;

namespace {
struct BadInput : ::testing::Test {
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("megatron_ds_bad_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  // n sequences of `len` tokens (last one EOD 999)
  std::string write(const std::string& name, int n, int len, IndexDType dt = IndexDType::kUInt16) {
    const std::string prefix = (dir / name).string();
    IndexedDatasetBuilder b(prefix + ".bin", dt);
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> t;
      for (int k = 0; k < len - 1; ++k) t.push_back((i + k) % 998 + 1);
      t.push_back(999);
      b.add_item(t);
      b.end_document();
    }
    b.finalize(prefix + ".idx");
    return prefix;
  }
  std::shared_ptr<GPTDatasetConfig> cfg(std::vector<std::string> data_path, std::string split = "80,20,0",
                                        int64_t seq = 8) {
    auto c = std::make_shared<GPTDatasetConfig>();
    c->sequence_length = seq;
    c->blend = get_blend_from_list(data_path);
    c->split = split;
    c->path_to_cache = (dir / "cache").string();
    c->tokenizer = std::make_shared<megatron::tokenizers::NullTokenizer>(1000, std::nullopt, -1);
    c->finalize();
    return c;
  }
  // Runs the builder and returns the UserError message ("" if none was thrown).
  std::string build_error(std::shared_ptr<GPTDatasetConfig> c, SplitSizes sizes = {16, 4, 0}) {
    try {
      BlendedMegatronDatasetBuilder(sizes, nullptr, c).build();
    } catch (const megatron::UserError& e) {
      return e.what();
    }
    return "";
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_F(BadInput, MissingIdx) {
  const std::string p = write("a", 10, 6);
  fs::remove(p + ".idx");
  const std::string e = build_error(cfg({p}));
  EXPECT_TRUE(contains(e, p + ".idx")) << e;
}

TEST_F(BadInput, MissingBin) {
  const std::string p = write("a", 10, 6);
  fs::remove(p + ".bin");
  const std::string e = build_error(cfg({p}));
  EXPECT_TRUE(contains(e, p + ".bin")) << e;
}

TEST_F(BadInput, TruncatedIdx) {
  const std::string p = write("a", 10, 6);
  fs::resize_file(p + ".idx", 60);
  const std::string e = build_error(cfg({p}));
  EXPECT_TRUE(contains(e, p + ".idx") && contains(e, "truncated")) << e;
}

TEST_F(BadInput, WrongMagicIdx) {
  const std::string p = write("a", 10, 6);
  {
    std::fstream f(p + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    f.write("NOTMAGIC!", 9);
  }
  const std::string e = build_error(cfg({p}));
  EXPECT_TRUE(contains(e, p + ".idx") && contains(e, "magic")) << e;
}

TEST_F(BadInput, BinSmallerThanIdxSays) {
  const std::string p = write("a", 10, 6);
  fs::resize_file(p + ".bin", 50);
  const std::string e = build_error(cfg({p}));
  EXPECT_TRUE(contains(e, p + ".bin")) << e;
}

TEST_F(BadInput, DtypeMismatchAcrossBlend) {
  const std::string a = write("a", 10, 6, IndexDType::kUInt16);
  const std::string b = write("b", 10, 6, IndexDType::kInt32);
  const std::string e = build_error(cfg({"0.5", a, "0.5", b}));
  EXPECT_TRUE(contains(e, b) && contains(e, "int32") && contains(e, "uint16")) << e;
}

TEST_F(BadInput, ZeroOrNegativeWeight) {
  const std::string a = write("a", 10, 6);
  const std::string b = write("b", 10, 6);
  for (const char* w : {"0", "-0.5"}) {
    try {
      get_blend_from_list({"0.5", a, w, b});
      ADD_FAILURE() << "weight " << w << " accepted";
    } catch (const megatron::UserError& e) {
      EXPECT_TRUE(contains(e.what(), "--data-path") && contains(e.what(), b)) << e.what();
    }
  }
}

TEST_F(BadInput, SplitLeavesNeededSplitEmpty) {
  // 10 sequences, "99,1,0": valid = [round(9.9), 10) = empty while 4 valid samples are requested
  // (Megatron loops forever here).
  const std::string p = write("a", 10, 6);
  const std::string e = build_error(cfg({p}, "99,1,0"), {16, 4, 0});
  EXPECT_TRUE(contains(e, p) && contains(e, "valid") && contains(e, "--split")) << e;
}

TEST_F(BadInput, EmptySplitWithNoRequestIsFine) {
  const std::string p = write("a", 10, 6);
  auto ds = BlendedMegatronDatasetBuilder({16, 0, 0}, nullptr, cfg({p}, "99,1,0")).build();
  ASSERT_TRUE(ds[0] && ds[1]);
  EXPECT_EQ(ds[1]->size(), 0);
}

TEST_F(BadInput, SequenceLongerThanAllTokens) {
  // An unweighted blend builds one epoch per dataset (num_samples None): with --seq-length longer
  // than all tokens of a dataset's split it would yield no sample at all.
  const std::string a = write("a", 200, 6);
  const std::string b = write("b", 4, 5);  // 16 train tokens
  const std::string e = build_error(cfg({a, b}, "80,20,0", 64), {3, 1, 0});
  EXPECT_TRUE(contains(e, b) && contains(e, "--seq-length")) << e;
}

TEST_F(BadInput, SequenceLongerThanSplitWithRequestRepeatsAsMegatron) {
  // With a requested size Megatron tiles epochs instead (e.g. a 1-sequence test split).
  const std::string p = write("a", 4, 5);
  auto ds = BlendedMegatronDatasetBuilder({2, 1, 0}, nullptr, cfg({p}, "80,20,0", 32)).build();
  ASSERT_TRUE(ds[0]);
  EXPECT_GE(ds[0]->size(), 2);
}

TEST_F(BadInput, BadSplitString) {
  EXPECT_THROW(parse_and_normalize_split("0,0,0"), megatron::UserError);
  EXPECT_THROW(parse_and_normalize_split("1,2,3,4"), megatron::UserError);
}

TEST_F(BadInput, CorruptCacheFile) {
  const std::string p = write("a", 10, 6);
  auto c = cfg({p});
  ASSERT_EQ(build_error(c), "");
  for (auto& f : fs::directory_iterator(dir / "cache"))
    if (f.path().string().find("train-shuffle_index.npy") != std::string::npos) fs::resize_file(f.path(), 70);
  const std::string e = build_error(c);
  EXPECT_TRUE(contains(e, "shuffle_index.npy")) << e;
}
