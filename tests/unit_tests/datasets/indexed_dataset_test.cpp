// IndexedDataset writer/reader against the golden vectors of Megatron-LM's own dataset code
// (docs/megatron-reference.md#golden-vectors, produced by running indexed_dataset.py): exact bytes.
#include "megatron/core/datasets/indexed_dataset.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <filesystem>
#include <fstream>
#include <tuple>
#include <iterator>

#include "megatron/core/utils/errors.h"

namespace fs = std::filesystem;
using namespace megatron::datasets;

namespace {
std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) { o += d[c >> 4]; o += d[c & 15]; }
  return o;
}
std::string md5_hex(const std::string& s) {
  unsigned char out[16];
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), out, &n, EVP_md5(), nullptr);
  return hex(std::string(reinterpret_cast<char*>(out), n));
}
fs::path tmpdir(const char* name) {
  fs::path p = fs::temp_directory_path() / ("megatron_test_" + std::string(name) + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}
// Appendix A: doc i has (i%4)+3 tokens 10i+1.. followed by EOD 999, one sequence per document.
void write_golden(const std::string& prefix) {
  IndexedDatasetBuilder b(prefix + ".bin", optimal_index_dtype(1000));
  for (int i = 0; i < 10; ++i) {
    std::vector<int64_t> t;
    for (int k = 0; k < (i % 4) + 3; ++k) t.push_back(10 * i + k + 1);
    t.push_back(999);
    b.add_document(t, {static_cast<int64_t>(t.size())});
  }
  b.finalize(prefix + ".idx");
}
}  // namespace

TEST(IndexedDataset, GoldenBytesFromMegatron) {
  auto d = tmpdir("golden");
  std::string prefix = (d / "tiny_text_document").string();
  write_golden(prefix);
  const std::string expect_idx =
      "4d4d494449445800000100000000000000080a000000000000000b000000000000000400000005000000060000000700"
      "00000400000005000000060000000700000004000000050000000000000000000000080000000000000012000000000000"
      "001e000000000000002c0000000000000034000000000000003e000000000000004a00000000000000580000000000000060"
      "000000000000000000000000000000010000000000000002000000000000000300000000000000040000000000000005000000"
      "0000000006000000000000000700000000000000080000000000000009000000000000000a00000000000000";
  EXPECT_EQ(hex(read_file(prefix + ".idx")), expect_idx);
  EXPECT_EQ(md5_hex(read_file(prefix + ".bin")), "89a5cacce6396cc0bd067b7ae4febd06");
  EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
  fs::remove_all(d);
}

TEST(IndexedDataset, ReadBackMmapAndPread) {
  auto d = tmpdir("read");
  std::string prefix = (d / "x").string();
  write_golden(prefix);
  for (bool mmap : {true, false}) {
    IndexedDataset ds(prefix, mmap);
    ASSERT_EQ(ds.num_sequences(), 10u);
    ASSERT_EQ(ds.num_documents(), 10u);
    EXPECT_EQ(ds.dtype(), IndexDType::kUInt16);
    EXPECT_EQ(ds.get(3), (std::vector<int64_t>{31, 32, 33, 34, 35, 36, 999}));
    EXPECT_EQ(ds.get(3, 2, 3), (std::vector<int64_t>{33, 34, 35}));
  }
  fs::remove_all(d);
}

TEST(IndexedDataset, EmptyDocumentsRepeatBoundaryAndMergeOffsets) {
  auto d = tmpdir("merge");
  std::string a = (d / "a").string(), b = (d / "b").string(), m = (d / "m").string();
  {
    IndexedDatasetBuilder w(a + ".bin", IndexDType::kUInt16);
    w.add_document({1, 2}, {2});
    w.add_document({}, {});  // empty document: boundary repeated
    w.add_document({3, 4, 5}, {1, 2});
    w.finalize(a + ".idx");
  }
  {
    IndexedDatasetBuilder w(b + ".bin", IndexDType::kUInt16);
    w.add_document({7}, {1});
    w.finalize(b + ".idx");
  }
  {
    IndexedDatasetBuilder w(m + ".bin", IndexDType::kUInt16);
    w.add_index(a);
    w.add_index(b);
    w.finalize(m + ".idx");
  }
  IndexedDataset ds(m);
  ASSERT_EQ(ds.num_documents(), 4u);
  std::vector<int64_t> di(ds.document_indices(), ds.document_indices() + 5);
  EXPECT_EQ(di, (std::vector<int64_t>{0, 1, 1, 3, 4}));
  EXPECT_EQ(ds.get(3), (std::vector<int64_t>{7}));
  fs::remove_all(d);
}

TEST(IndexedDataset, BadInputsGiveClearErrors) {
  auto d = tmpdir("bad");
  std::string p = (d / "x").string();
  EXPECT_THROW(IndexedDataset{p}, megatron::UserError);  // missing
  write_golden(p);
  { std::ofstream(p + ".idx", std::ios::binary) << "NOTMAGIC.................................."; }
  try {
    IndexedDataset ds(p);
    FAIL();
  } catch (const megatron::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bad magic"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(p + ".idx"), std::string::npos);
  }
  IndexedDatasetBuilder w(p + "2.bin", IndexDType::kUInt16);
  EXPECT_THROW(w.add_item({70000}), megatron::UserError);
  // A corrupt pointer or length (the MMIDIDX layout: 34-byte header, int32 lengths[S], int64
  // pointers[S], S = 10 here) is a clear error at load time, not a crash or wrong tokens later.
  auto patch = [&](std::streamoff at, const std::string& bytes) {
    write_golden(p);
    std::fstream f(p + ".idx", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(at);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  for (const auto& [at, bytes, seq] : std::vector<std::tuple<std::streamoff, std::string, int>>{
           {34 + 40 + 8 * 8, std::string("\xff\xff\xff\x7f", 4), 8},  // pointer of sequence 8 ~ 2^31
           {34 + 4 * 3, std::string("\x00\x00\x00\x80", 4), 3}}) {     // length of sequence 3 < 0
    patch(at, bytes);
    try {
      IndexedDataset ds(p);
      ADD_FAILURE() << "corrupt sequence " << seq << " accepted";
    } catch (const megatron::UserError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("sequence " + std::to_string(seq) + " "), std::string::npos) << m;
      EXPECT_NE(m.find("corrupt index"), std::string::npos) << m;
    }
  }
  fs::remove_all(d);
}
