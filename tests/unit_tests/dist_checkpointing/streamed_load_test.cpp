// The streamed loader with tiny read chunks (8, 24, 4096 bytes), so chunk boundaries fall inside
// every stored piece: same-layout loads (read in place), resharded loads (copied per chunk),
// flat ranges, and a corruption caught by the CRC accumulated across chunks. Expected values come
// from construction: element i of every global tensor holds i (exact in fp32 and bf16 below 256).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "megatron/core/dist_checkpointing/serialization.h"
#include "test_utils/thread_group_util.h"

using namespace megatron;
using namespace megatron::dist_checkpointing;
namespace fs = std::filesystem;
using megatron::testing::run_ranks;

namespace {

constexpr int64_t kRows = 6, kCols = 40;  // [6, 40] fp32: 960 bytes per global tensor

std::vector<float> iota(int64_t b, int64_t e) {
  std::vector<float> v;
  for (int64_t i = b; i < e; ++i) v.push_back(static_cast<float>(i));
  return v;
}

// Rank r of 2 saves rows [3r, 3r+3) of "w" (fp32) and of "e" (bf16), and elements
// [120r, 120r+120) of the flat "opt" (fp32).
ShardedStateDict saved_state(int r) {
  ShardedStateDict sd;
  Tensor w = Tensor::from_vector(iota(r * 3 * kCols, (r + 1) * 3 * kCols), {3, kCols});
  sd.tensors.push_back(ShardedTensor::from_rank_offsets("w", w, {{0, r, 2}}));
  sd.tensors.push_back(ShardedTensor::from_rank_offsets("e", w.to(DType::kBFloat16), {{0, r, 2}}));
  ShardedTensor fl;
  fl.key = "opt";
  fl.global_shape = fl.local_shape = {kRows, kCols};
  fl.global_offset = {0, 0};
  fl.flattened_range = std::make_pair(int64_t(120) * r, int64_t(120) * (r + 1));
  fl.data = Tensor::from_vector(iota(120 * r, 120 * (r + 1)), {120});
  sd.tensors.push_back(fl);
  return sd;
}

class StreamedLoad : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("megatron_sl_" + std::to_string(::getpid()) + "_" + std::to_string(GetParam()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = (root_ / "ckpt").string();
    run_ranks(2, [&](int r, comm::ProcessGroup& g) { save(saved_state(r), dir_, &g); });
    opts_.read_chunk_bytes = GetParam();
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
  std::string dir_;
  LoadOptions opts_;
};

TEST_P(StreamedLoad, SameLayoutReadsInPlace) {
  for (int r = 0; r < 2; ++r) {
    ShardedStateDict sd = saved_state(r);
    for (auto& t : sd.tensors) t.data = Tensor::zeros(t.data.shape(), t.data.dtype());
    load(sd, dir_, opts_);
    EXPECT_EQ(sd.tensors[0].data.to_float_vector(), iota(r * 3 * kCols, (r + 1) * 3 * kCols));
    EXPECT_EQ(sd.tensors[1].data.to_float_vector(), iota(r * 3 * kCols, (r + 1) * 3 * kCols));
    EXPECT_EQ(sd.tensors[2].data.to_float_vector(), iota(120 * r, 120 * (r + 1)));
  }
}

TEST_P(StreamedLoad, ReshardedAndConvertedLoads) {
  // Whole tensors (two stored pieces each), bf16 stored -> fp32 target.
  ShardedStateDict sd;
  sd.tensors.push_back(ShardedTensor::from_tensor("w", Tensor::zeros({kRows, kCols}, DType::kFloat32)));
  sd.tensors.push_back(ShardedTensor::from_tensor("e", Tensor::zeros({kRows, kCols}, DType::kFloat32)));
  sd.tensors.push_back(ShardedTensor::from_tensor("opt", Tensor::zeros({kRows, kCols}, DType::kFloat32)));
  load(sd, dir_, opts_);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sd.tensors[i].data.to_float_vector(), iota(0, kRows * kCols)) << i;
  // Three row blocks of 2 (straddling the stored split at row 3), and flat ranges of 77 elements.
  for (int p = 0; p < 3; ++p) {
    ShardedStateDict s3;
    s3.tensors.push_back(ShardedTensor::from_rank_offsets("w", Tensor::zeros({2, kCols}, DType::kFloat32), {{0, p, 3}}));
    ShardedTensor f;
    f.key = "w";
    f.global_shape = f.local_shape = {kRows, kCols};
    f.global_offset = {0, 0};
    f.flattened_range = std::make_pair(int64_t(77) * p, int64_t(77) * (p + 1));
    f.data = Tensor::zeros({77}, DType::kFloat32);
    s3.tensors.push_back(f);
    load(s3, dir_, opts_);
    EXPECT_EQ(s3.tensors[0].data.to_float_vector(), iota(p * 2 * kCols, (p + 1) * 2 * kCols)) << p;
    EXPECT_EQ(s3.tensors[1].data.to_float_vector(), iota(77 * p, 77 * (p + 1))) << p;
  }
}

TEST_P(StreamedLoad, CorruptionInALaterChunkIsCaught) {
  // Flip the last byte of rank 1's file (the end of its last stored piece).
  const std::string f = dir_ + "/__1_0.safetensors";
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(-1, std::ios::end);
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  io.seekp(-1, std::ios::end);
  io.write(&c, 1);
  io.close();
  ShardedStateDict sd;
  sd.tensors.push_back(ShardedTensor::from_tensor("w", Tensor::zeros({kRows, kCols}, DType::kFloat32)));
  sd.tensors.push_back(ShardedTensor::from_tensor("e", Tensor::zeros({kRows, kCols}, DType::kFloat32)));
  sd.tensors.push_back(ShardedTensor::from_tensor("opt", Tensor::zeros({kRows, kCols}, DType::kFloat32)));
  try {
    load(sd, dir_, opts_);
    FAIL() << "expected a checksum error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt shard"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("__1_0.safetensors"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(ReadChunks, StreamedLoad, ::testing::Values(size_t(8), size_t(24), size_t(4096)));

}  // namespace
