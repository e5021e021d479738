// Every non-shard file of a checkpoint is checksummed (docs/checkpointing.md, "Checksums"):
// metadata.json records the CRC-32C of common.json and .metadata and of its own content. An edit
// of any of them (e.g. consumed_train_samples in common.json) is refused with a line naming the
// file; a checkpoint written before the checksums (no records) still loads. The CRC-32C of the
// edited bytes is recomputed by the test with its own bitwise implementation (RFC 3720
// polynomial 0x82F63B78), independent of megatron/core/utils/crc32c.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/core/utils/errors.h"

namespace fs = std::filesystem;
using namespace megatron;
using namespace megatron::dist_checkpointing;
using nlohmann::json;

namespace {
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

struct Checksums : ::testing::Test {
  std::string dir;
  void SetUp() override {
    const std::string root = (fs::temp_directory_path() / ("megatron_ck_sum_" + std::to_string(::getpid()))).string();
    fs::remove_all(root);
    dir = root + "/iter_0000002";
    ShardedStateDict sd;
    sd.tensors.push_back(ShardedTensor::from_tensor("w", Tensor::zeros({2, 3}, DType::kFloat32)));
    sd.common = {{"args", {{"consumed_train_samples", 64}}}, {"iteration", 2}};
    save(sd, dir);
  }
  void TearDown() override { fs::remove_all(fs::path(dir).parent_path()); }
  std::string load_error() {
    try {
      ShardedStateDict sd;
      sd.tensors.push_back(ShardedTensor::from_tensor("w", Tensor::zeros({2, 3}, DType::kFloat32)));
      load(sd, dir);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
};
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_F(Checksums, RecordedForEveryNonShardFile) {
  const json m = json::parse(slurp(dir + "/metadata.json"));
  for (const char* f : {"common.json", ".metadata"}) {
    char want[11];
    std::snprintf(want, sizeof want, "0x%08x", crc32c_bitwise(slurp(dir + "/" + f)));
    EXPECT_EQ(m.at("megatron_cpp_crc32c").at(f).get<std::string>(), want) << f;
  }
  json rest = m;
  rest.erase("megatron_cpp_crc32c_self");
  char self[11];
  std::snprintf(self, sizeof self, "0x%08x", crc32c_bitwise(rest.dump()));
  EXPECT_EQ(m.at("megatron_cpp_crc32c_self").get<std::string>(), self);
  EXPECT_EQ(load_error(), "");
}

TEST_F(Checksums, EditedCommonStateIsRefused) {
  std::string c = slurp(dir + "/common.json");
  const size_t at = c.find("64");
  ASSERT_NE(at, std::string::npos);
  c.replace(at, 2, "65");  // consumed_train_samples 64 -> 65
  spit(dir + "/common.json", c);
  const std::string e = load_error();
  EXPECT_TRUE(has(e, dir + "/common.json") && has(e, "crc32c") && has(e, "metadata.json")) << e;
  try {
    load_common_state(dir);
    ADD_FAILURE() << "load_common_state accepted the edited common.json";
  } catch (const UserError& x) {
    EXPECT_TRUE(has(x.what(), "common.json")) << x.what();
  }
}

TEST_F(Checksums, EditedIndexIsRefused) {
  std::string m = slurp(dir + "/.metadata");
  m += " ";  // any byte
  spit(dir + "/.metadata", m);
  const std::string e = load_error();
  EXPECT_TRUE(has(e, dir + "/.metadata") && has(e, "crc32c")) << e;
}

TEST_F(Checksums, EditedMarkerIsRefused) {
  json m = json::parse(slurp(dir + "/metadata.json"));
  m["megatron_cpp_crc32c"]["common.json"] = "0x00000000";
  spit(dir + "/metadata.json", m.dump());
  const std::string e = load_error();
  EXPECT_TRUE(has(e, dir + "/metadata.json") && has(e, "crc32c")) << e;
  m.erase("megatron_cpp_crc32c");  // half of the records removed
  spit(dir + "/metadata.json", m.dump());
  EXPECT_TRUE(has(load_error(), "incomplete checksum records")) << load_error();
}

TEST_F(Checksums, OlderCheckpointWithoutRecordsLoads) {
  json m = json::parse(slurp(dir + "/metadata.json"));
  m.erase("megatron_cpp_crc32c");
  m.erase("megatron_cpp_crc32c_self");
  spit(dir + "/metadata.json", m.dump());
  EXPECT_EQ(load_error(), "");
}
