// AlignedFileWriter (O_DIRECT staging writer of checkpoint files): the file's bytes must be
// exactly the bytes handed to write(), whatever the size (the O_DIRECT tail is padded to 4 KiB and
// truncated back) and however the writes are split across staging-buffer boundaries. References:
// the same bytes written with C stdio (fwrite, independent of our code), and our buffered path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "megatron/core/dist_checkpointing/file_utils.h"

namespace dc = megatron::dist_checkpointing;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {  // xorshift64: bytes with no 4 KiB periodicity
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x >> 32);
  }
  return v;
}

std::vector<uint8_t> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes `data` in pieces of odd sizes (1, 4095, 5 MiB+7, then the rest) so that writes straddle
// the staging buffers' boundaries.
void write_split(dc::AlignedFileWriter& w, const std::vector<uint8_t>& data) {
  const size_t cuts[] = {1, 4095, (5u << 20) + 7};
  size_t at = 0;
  for (size_t c : cuts) {
    const size_t k = std::min(c, data.size() - at);
    w.write(data.data() + at, k);
    at += k;
  }
  w.write(data.data() + at, data.size() - at);
  EXPECT_EQ(w.position(), data.size());
}

class AlignedWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("megatron_aw_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Checks one size in directory `d`; returns whether O_DIRECT stayed on.
  bool check_size(const fs::path& d, size_t n) {
    const auto data = pattern(n, n);
    const std::string ref = (d / "fwrite.bin").string();
    std::FILE* f = std::fopen(ref.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    if (n) EXPECT_EQ(std::fwrite(data.data(), 1, n, f), n);
    std::fclose(f);

    dc::IoOptions o;
    o.chunk_bytes = 8u << 20;  // 3·8 MiB+13 → three full chunks and a 13-byte tail
    o.buffers = 3;
    o.writer_threads = 2;
    o.direct = true;
    const std::string direct_path = (d / "direct.bin").string();
    bool direct_on;
    {
      dc::AlignedFileWriter w(direct_path, o);
      write_split(w, data);
      w.close();
      direct_on = w.direct();
    }
    o.direct = false;
    const std::string buffered_path = (d / "buffered.bin").string();
    {
      dc::AlignedFileWriter w(buffered_path, o);
      EXPECT_FALSE(w.direct());
      write_split(w, data);
      w.close();
    }
    const auto want = slurp(ref);
    EXPECT_EQ(want.size(), n);
    EXPECT_EQ(fs::file_size(direct_path), n) << "size " << n;
    EXPECT_TRUE(slurp(direct_path) == want) << "O_DIRECT file differs from fwrite's, size " << n;
    EXPECT_TRUE(slurp(buffered_path) == want) << "buffered file differs from fwrite's, size " << n;
    return direct_on;
  }
  fs::path dir_;
};

const size_t kSizes[] = {0, 1, 4095, 4096, 4097, 3 * (8u << 20) + 13};

TEST_F(AlignedWriterTest, OddSizesMatchFwriteAndBufferedPath) {
  for (size_t n : kSizes) {
    const bool direct = check_size(dir_, n);
    std::printf("size %zu: O_DIRECT %s on %s\n", n, direct ? "used" : "refused (buffered fallback)", dir_.c_str());
  }
}

// tmpfs refused O_DIRECT before Linux 6.6 (EINVAL on open); either way the bytes must be right.
TEST_F(AlignedWriterTest, TmpfsFallbackKeepsBytes) {
  const fs::path shm = "/dev/shm";
  if (!fs::is_directory(shm)) GTEST_SKIP() << "no /dev/shm";
  const fs::path d = shm / ("megatron_aw_" + std::to_string(::getpid()));
  fs::create_directories(d);
  for (size_t n : {size_t(4097), size_t(3 * (8u << 20) + 13)}) {
    const bool direct = check_size(d, n);
    std::printf("size %zu: O_DIRECT %s on %s\n", n, direct ? "used" : "refused (buffered fallback)", d.c_str());
  }
  fs::remove_all(d);
}

// A filesystem that refuses O_DIRECT at the first write (EINVAL): the writer clears O_DIRECT and
// carries on buffered; the file is still exact.
TEST_F(AlignedWriterTest, EinvalOnFirstDirectWriteFallsBackToBuffered) {
  for (size_t n : {size_t(4097), size_t(3 * (8u << 20) + 13)}) {
    const auto data = pattern(n, 7);
    dc::IoOptions o;
    o.chunk_bytes = 8u << 20;
    o.inject_direct_einval = true;
    const std::string path = (dir_ / "fallback.bin").string();
    dc::AlignedFileWriter w(path, o);
    write_split(w, data);
    w.close();
    EXPECT_FALSE(w.direct()) << "size " << n;
    EXPECT_EQ(fs::file_size(path), n);
    EXPECT_TRUE(slurp(path) == data) << "size " << n;
  }
}

TEST_F(AlignedWriterTest, ReusedWriterBuffersStartClean) {
  // A second file written after a larger one (pooled staging buffers) holds only its own bytes.
  check_size(dir_, 3 * (8u << 20) + 13);
  check_size(dir_, 4097);  // the byte comparisons are inside check_size
}

TEST_F(AlignedWriterTest, CreateFailureNamesPath) {
  const std::string bad = (dir_ / "missing" / "x.bin").string();
  try {
    dc::AlignedFileWriter w(bad);
    FAIL() << "expected UserError";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

}  // namespace
