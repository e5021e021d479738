#include "megatron/training/tensorboard/summary_writer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "megatron/core/utils/crc32c.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron::training {

namespace {
std::atomic<int> g_writer_count{0};

// Protobuf wire format (developers.google.com/protocol-buffers/docs/encoding) for the messages of
// tensorboard_event.proto: key = field << 3 | wire type; 0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32; little-endian fixed-width values.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<uint64_t>(field) << 3 | wire); }
void put_bytes(std::string& out, int field, const std::string& b) {
  put_key(out, field, 2);
  put_varint(out, b.size());
  out += b;
}
template <class T>
void put_fixed(std::string& out, int field, T v) {
  put_key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
// Event header: wall_time = 1 (double), step = 2 (int64; proto3 omits 0).
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_fixed<double>(e, 1, wall_time);
  if (step != 0) {
    put_key(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

SummaryWriter::SummaryWriter(const std::string& log_dir, double flush_secs, int64_t max_queue)
    : flush_secs_(flush_secs), max_queue_(max_queue) {
  if (max_queue < 1) user_error("--tensorboard-queue-size ", max_queue, ": must be >= 1");
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) user_error("--tensorboard-dir ", log_dir, ": cannot create directory (", ec.message(), ")");
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double now = unix_now();
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d", static_cast<long long>(now), host,
                static_cast<int>(::getpid()), g_writer_count.fetch_add(1));
  path_ = log_dir + "/" + name;
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) user_error("--tensorboard-dir: cannot create ", path_, ": ", std::strerror(errno));
  // A file that cannot even take its header (full disk) is not left behind empty.
  TempFileGuard guard(path_);
  try {
    std::string ev = event_header(now, 0);
    put_bytes(ev, 3, "brain.Event:2");  // Event.file_version
    write_record(ev);
    flush();
  } catch (...) {
    std::fclose(f_);
    f_ = nullptr;
    throw;
  }
  guard.release();
}

SummaryWriter::~SummaryWriter() {
  if (f_) std::fclose(f_);
}

void SummaryWriter::write_record(const std::string& data) {
  if (!f_) user_error("SummaryWriter: ", path_, " is closed");
  unsigned char head[12];
  const uint64_t len = data.size();
  std::memcpy(head, &len, 8);  // little-endian host
  const uint32_t len_crc = crc32c_mask(crc32c(head, 8));
  std::memcpy(head + 8, &len_crc, 4);
  const uint32_t data_crc = crc32c_mask(crc32c(data.data(), data.size()));
  if (std::fwrite(head, 1, 12, f_) != 12 || std::fwrite(data.data(), 1, data.size(), f_) != data.size() ||
      std::fwrite(&data_crc, 1, 4, f_) != 4)
    user_error("cannot write ", path_, ": ", std::strerror(errno));
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::string val;  // Summary.Value {tag = 1, simple_value = 2}
  put_bytes(val, 1, tag);
  put_fixed<float>(val, 2, static_cast<float>(value));
  std::string summary;  // Summary {repeated Value value = 1}
  put_bytes(summary, 1, val);
  std::string ev = event_header(wall_time >= 0 ? wall_time : unix_now(), step);
  put_bytes(ev, 5, summary);  // Event.summary
  write_record(ev);
  if (++pending_ >= max_queue_ || unix_now() - last_flush_ >= flush_secs_) flush();
}

void SummaryWriter::flush() {
  if (f_ && std::fflush(f_) != 0) user_error("cannot write ", path_, ": ", std::strerror(errno));
  last_flush_ = unix_now();
  pending_ = 0;
}

void SummaryWriter::close() {
  if (!f_) return;
  flush();
  std::fclose(f_);
  f_ = nullptr;
}

}  // namespace megatron::training
