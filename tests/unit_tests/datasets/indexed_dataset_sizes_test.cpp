// The .bin/.idx pair must agree exactly (docs/datasets.md, "Errors"): a .bin larger or smaller
// than its .idx describes, an .idx with trailing bytes, pointers that do not follow each other,
// or the index of another dtype is refused with one line naming both files. Megatron's
// IndexedDataset reads all of these silently (garbage tokens); the expected sizes here come
// from the format's definition (34-byte header, 12 bytes per sequence, 8 per document index,
// itemsize bytes per token), not from our reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/utils/errors.h"

namespace fs = std::filesystem;
using namespace megatron::datasets;

namespace {
struct PairSizes : ::testing::Test {
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("megatron_idx_sizes_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  // 3 documents of 5, 7, 2 tokens
  std::string write(const std::string& name, IndexDType dt) {
    const std::string p = (dir / name).string();
    IndexedDatasetBuilder b(p + ".bin", dt);
    for (int len : {5, 7, 2}) {
      std::vector<int64_t> t(static_cast<size_t>(len), 3);
      b.add_item(t);
      b.end_document();
    }
    b.finalize(p + ".idx");
    return p;
  }
  std::string error(const std::string& p) {
    try {
      IndexedDataset ds(p);
    } catch (const megatron::UserError& e) {
      return e.what();
    }
    return "";
  }
};
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_F(PairSizes, ExactPairLoads) {
  const std::string p = write("a", IndexDType::kUInt16);
  EXPECT_EQ(fs::file_size(p + ".bin"), 14u * 2);
  EXPECT_EQ(fs::file_size(p + ".idx"), 34u + 12 * 3 + 8 * 4);
  EXPECT_EQ(error(p), "");
}

TEST_F(PairSizes, BinLargerThanIndexDescribes) {
  const std::string p = write("a", IndexDType::kUInt16);
  fs::resize_file(p + ".bin", 14 * 2 + 2);  // one token more
  const std::string e = error(p);
  EXPECT_TRUE(has(e, p + ".bin") && has(e, p + ".idx") && has(e, "30 bytes") && has(e, "describes 28")) << e;
}

TEST_F(PairSizes, BinSmallerThanIndexDescribes) {
  const std::string p = write("a", IndexDType::kUInt16);
  fs::resize_file(p + ".bin", 14 * 2 - 2);
  const std::string e = error(p);
  EXPECT_TRUE(has(e, p + ".bin") && has(e, p + ".idx") && has(e, "describes 28")) << e;
}

TEST_F(PairSizes, IndexOfAnotherDtypeOrDataset) {
  // int32 tokens (56 bytes) under the uint16 dataset's index: the wrong-dtype case of the issue
  const std::string a = write("a", IndexDType::kUInt16), b = write("b", IndexDType::kInt32);
  fs::copy_file(b + ".bin", a + ".bin", fs::copy_options::overwrite_existing);
  const std::string e = error(a);
  EXPECT_TRUE(has(e, a + ".bin") && has(e, "56 bytes") && has(e, a + ".idx") && has(e, "uint16")) << e;
}

TEST_F(PairSizes, IndexWithTrailingBytes) {
  const std::string p = write("a", IndexDType::kUInt16);
  { std::ofstream(p + ".idx", std::ios::app | std::ios::binary) << "xyzxyzxyz"; }  // 9 bytes: not 3 modes
  const std::string e = error(p);
  EXPECT_TRUE(has(e, p + ".idx") && has(e, "describes 102")) << e;
}

TEST_F(PairSizes, MultimodalModesAreAccepted) {
  // Megatron's multimodal index appends one int8 mode per sequence after the document indices.
  const std::string p = write("a", IndexDType::kUInt16);
  { std::ofstream(p + ".idx", std::ios::app | std::ios::binary).write("\x00\x01\x02", 3); }
  EXPECT_EQ(error(p), "");
  IndexedDataset ds(p);
  ASSERT_TRUE(ds.has_sequence_modes());
  EXPECT_EQ(ds.sequence_modes()[2], 2);
}

TEST_F(PairSizes, PointersMustFollowEachOther) {
  const std::string p = write("a", IndexDType::kUInt16);
  {
    // sequence 1's pointer (at 34 + 4*3 + 8) from 10 to 12: still inside the .bin
    std::fstream f(p + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(34 + 12 + 8);
    const int64_t v = 12;
    f.write(reinterpret_cast<const char*>(&v), 8);
  }
  const std::string e = error(p);
  EXPECT_TRUE(has(e, p + ".idx") && has(e, "sequence 1") && has(e, "expected pointer 10")) << e;
}

TEST(SequencePointers, SixtyFourBitOffsets) {
  // Megatron's _IndexWriter._sequence_pointers in int64: two int64-token sequences of 2^31 - 1
  // tokens put the third one at 2 * 8 * (2^31 - 1) = 34359738352 bytes, beyond 32 bits.
  const int32_t big = 2147483647;
  const auto p = sequence_pointers({big, big, 5}, 8);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[1], 17179869176LL);
  EXPECT_EQ(p[2], 34359738352LL);
}
