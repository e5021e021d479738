// The worker-side token conversion of preprocess_data (encode_token_ids / encode_tokens) and the
// builder's add_document_encoded path: same bytes as the add_document path, little-endian values
// checked by hand, out-of-range ids reported at their index, and code-point counting.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/datasets/preprocess/preprocess_pipeline.h"
#include "megatron/core/utils/errors.h"
#include "preprocess_test_util.h"

namespace megatron::datasets {
namespace {

TEST(PreprocessEncodedTokens, LittleEndianBytesByHand) {
  const std::vector<int64_t> ids = {0, 1, 258, 65535};
  std::vector<char> out;
  encode_tokens(IndexDType::kUInt16, ids, out);
  // hand-written: 0 -> 00 00, 1 -> 01 00, 258 = 0x0102 -> 02 01, 65535 -> ff ff
  const std::string expect("\x00\x00\x01\x00\x02\x01\xff\xff", 8);
  EXPECT_EQ(std::string(out.begin(), out.end()), expect);

  const std::vector<int64_t> ids32 = {128000, -1};
  encode_tokens(IndexDType::kInt32, ids32, out);
  // 128000 = 0x0001F400 -> 00 f4 01 00; -1 -> ff ff ff ff
  EXPECT_EQ(std::string(out.begin(), out.end()), std::string("\x00\xf4\x01\x00\xff\xff\xff\xff", 8));
}

TEST(PreprocessEncodedTokens, FirstOutOfRangeIdIsReported) {
  const std::vector<int64_t> ids = {5, 65535, 70000, 3};
  std::vector<char> buf(ids.size() * 2);
  EXPECT_EQ(encode_token_ids(IndexDType::kUInt16, ids.data(), ids.size(), buf.data()), 2u);
  const std::vector<int64_t> neg = {-1};
  EXPECT_EQ(encode_token_ids(IndexDType::kUInt16, neg.data(), 1, buf.data()), 0u);
  std::vector<char> out;
  EXPECT_THROW(encode_tokens(IndexDType::kUInt16, ids, out), UserError);
}

TEST(PreprocessEncodedTokens, EncodedDocumentsEqualPlainDocuments) {
  testing::TempDir dir;
  const std::vector<int64_t> tokens = {7, 8, 9, 10, 11, 12};
  const std::vector<int64_t> lengths = {2, 4};
  for (IndexDType t : {IndexDType::kUInt16, IndexDType::kInt32}) {
    {
      IndexedDatasetBuilder a(dir / "a.bin", t);
      a.add_document(tokens, lengths);
      a.add_document({}, {});  // empty document: boundary only
      a.finalize(dir / "a.idx");
    }
    {
      std::vector<char> bytes;
      encode_tokens(t, tokens, bytes);
      IndexedDatasetBuilder b(dir / "b.bin", t);
      b.add_document_encoded(bytes.data(), tokens.size(), lengths.data(), lengths.size());
      b.add_document_encoded(nullptr, 0, nullptr, 0);
      b.finalize(dir / "b.idx");
    }
    EXPECT_EQ(testing::read_file(dir / "a.bin"), testing::read_file(dir / "b.bin"));
    EXPECT_EQ(testing::read_file(dir / "a.idx"), testing::read_file(dir / "b.idx"));
    EXPECT_EQ(testing::read_file(dir / "b.bin").size(), tokens.size() * index_dtype_size(t));
  }
}

TEST(PreprocessEncodedTokens, CodePointCountMatchesHandCount) {
  // "aé€😀" = 1 + 2 + 3 + 4 bytes, 4 code points; repeated to cross the 8-byte blocks.
  const std::string s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  std::string t;
  for (int i = 0; i < 7; ++i) t += s;
  EXPECT_EQ(preprocess::count_code_points(s.data(), s.size()), 4u);
  EXPECT_EQ(preprocess::count_code_points(t.data(), t.size()), 28u);
  EXPECT_EQ(preprocess::count_code_points(t.data() + 1, t.size() - 1), 27u);  // starts at 'é'
  EXPECT_EQ(preprocess::count_code_points("", 0), 0u);
}

}  // namespace
}  // namespace megatron::datasets
