// TensorBoard event files read back by an independent parser written here from the public formats:
// TFRecord framing (length, masked CRC-32C of length, data, masked CRC-32C of data; CRC computed
// bit by bit below, not with our crc32c.cpp) and the protobuf wire format of TensorBoard's Event
// (wall_time=1 double, step=2 int64, file_version=3 string, summary=5) / Summary.Value (tag=1,
// simple_value=2 float). No libprotobuf, no code of the writer.
#include "megatron/training/tensorboard/summary_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "megatron/core/utils/errors.h"

using namespace megatron::training;
namespace fs = std::filesystem;

namespace {

uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

struct ParsedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
};

uint64_t varint(const std::string& b, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    unsigned char c = static_cast<unsigned char>(b.at(i++));
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
}

// Iterates over (field, wire type, payload) of one message.
template <class F>
void fields(const std::string& m, F f) {
  size_t i = 0;
  while (i < m.size()) {
    uint64_t key = varint(m, i);
    int field = static_cast<int>(key >> 3), wt = static_cast<int>(key & 7);
    std::string payload;
    uint64_t v = 0;
    if (wt == 0) v = varint(m, i);
    else if (wt == 1) payload = m.substr(i, 8), i += 8;
    else if (wt == 5) payload = m.substr(i, 4), i += 4;
    else if (wt == 2) {
      uint64_t n = varint(m, i);
      payload = m.substr(i, n);
      i += n;
    } else FAIL() << "unexpected wire type " << wt;
    f(field, wt, payload, v);
  }
}

ParsedEvent parse_event(const std::string& m) {
  ParsedEvent e;
  fields(m, [&](int field, int wt, const std::string& p, uint64_t v) {
    if (field == 1 && wt == 1) std::memcpy(&e.wall_time, p.data(), 8);
    else if (field == 2 && wt == 0) e.step = static_cast<int64_t>(v);
    else if (field == 3 && wt == 2) e.file_version = p;
    else if (field == 5 && wt == 2) {
      fields(p, [&](int f2, int wt2, const std::string& val, uint64_t) {
        ASSERT_TRUE(f2 == 1 && wt2 == 2) << "Summary.value";
        std::string tag;
        float x = NAN;
        fields(val, [&](int f3, int wt3, const std::string& q, uint64_t) {
          if (f3 == 1 && wt3 == 2) tag = q;
          else if (f3 == 2 && wt3 == 5) std::memcpy(&x, q.data(), 4);
        });
        e.values.push_back({tag, x});
      });
    } else ADD_FAILURE() << "unexpected Event field " << field;
  });
  return e;
}

std::vector<ParsedEvent> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string b = ss.str();
  std::vector<ParsedEvent> out;
  size_t i = 0;
  while (i < b.size()) {
    EXPECT_LE(i + 12, b.size());
    uint64_t len;
    uint32_t lcrc, dcrc;
    std::memcpy(&len, b.data() + i, 8);
    std::memcpy(&lcrc, b.data() + i + 8, 4);
    EXPECT_EQ(lcrc, masked(crc32c_bitwise(reinterpret_cast<const unsigned char*>(b.data() + i), 8)));
    std::string data = b.substr(i + 12, len);
    std::memcpy(&dcrc, b.data() + i + 12 + len, 4);
    EXPECT_EQ(dcrc, masked(crc32c_bitwise(reinterpret_cast<const unsigned char*>(data.data()), data.size())));
    out.push_back(parse_event(data));
    i += 12 + len + 4;
  }
  return out;
}

}  // namespace

TEST(TensorBoard, WritesScalarsTensorBoardCanRead) {
  const char* keep = std::getenv("MEGATRON_TB_KEEP_DIR");  // set by tests/functional_tests/tb_python_reader.sh
  std::string dir = keep ? std::string(keep) : (fs::temp_directory_path() / ("megatron_tb_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  std::string path;
  {
    SummaryWriter w(dir);
    path = w.path();
    w.add_scalar("lm loss", 10.5, 1, 1700000000.25);
    w.add_scalar("learning-rate", 3e-4, 1, 1700000000.5);
    w.add_scalar("lm loss", 9.25, 2, 1700000001.0);
    w.flush();
  }
  std::string name = fs::path(path).filename().string();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.)" + std::string(host) + "\\." +
                                                std::to_string(::getpid()) + R"(\.\d+)")))
      << name;
  auto ev = read_events(path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_GT(ev[0].wall_time, 1.6e9);
  EXPECT_EQ(ev[1].step, 1);
  EXPECT_EQ(ev[1].wall_time, 1700000000.25);
  ASSERT_EQ(ev[1].values.size(), 1u);
  EXPECT_EQ(ev[1].values[0].first, "lm loss");
  EXPECT_EQ(ev[1].values[0].second, 10.5f);
  EXPECT_EQ(ev[2].values[0].first, "learning-rate");
  EXPECT_EQ(ev[2].values[0].second, 3e-4f);  // simple_value is float32
  EXPECT_EQ(ev[3].step, 2);
  EXPECT_EQ(ev[3].values[0].second, 9.25f);
  if (!keep) fs::remove_all(dir);
}

TEST(TensorBoard, UnwritableDirectoryIsAUserError) {
  EXPECT_THROW({ SummaryWriter w("/proc/no_such_dir/tb"); }, megatron::UserError);
}

// --tensorboard-queue-size (torch's SummaryWriter max_queue): the events reach the file when that
// many are pending, not before (flush_secs far away). The stdio buffer (4 KiB+) holds the three
// ~40-byte records until then, so the file's size on disk shows when they were flushed.
TEST(TensorBoard, QueueSizeFlushesEveryNEvents) {
  const fs::path dir = fs::temp_directory_path() / ("megatron_tbq_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    SummaryWriter w(dir.string(), /*flush_secs=*/1e9, /*max_queue=*/3);
    const auto header = fs::file_size(w.path());
    w.add_scalar("a", 1.0, 1);
    w.add_scalar("a", 2.0, 2);
    EXPECT_EQ(fs::file_size(w.path()), header);  // 2 pending
    w.add_scalar("a", 3.0, 3);
    const auto after3 = fs::file_size(w.path());
    EXPECT_GT(after3, header);  // the 3rd forced the flush
    w.add_scalar("a", 4.0, 4);
    EXPECT_EQ(fs::file_size(w.path()), after3);  // the count restarted
  }
  EXPECT_THROW(SummaryWriter(dir.string(), 120.0, 0), megatron::UserError);
  fs::remove_all(dir);
}
