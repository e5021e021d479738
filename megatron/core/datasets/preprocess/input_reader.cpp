#include "megatron/core/datasets/preprocess/input_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

#include "megatron/core/utils/errors.h"

namespace megatron::datasets::preprocess {

namespace {
constexpr size_t kPadding = 64;  // simdjson::SIMDJSON_PADDING
constexpr size_t kReadChunk = 1 << 20;

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}
}  // namespace

/// A byte source: plain file, gzip or zstd. read() returns decoded bytes, 0 at EOF.
class InputReader::Source {
 public:
  virtual ~Source() = default;
  virtual size_t read(char* dst, size_t n) = 0;
  virtual uint64_t consumed() const = 0;  // raw file bytes consumed
};

class PlainFile final : public InputReader::Source {
 public:
  explicit PlainFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY);
    if (fd_ < 0) user_error(path, ": cannot open input (", std::strerror(errno), "); check --input");
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  ~PlainFile() override { ::close(fd_); }
  size_t read(char* dst, size_t n) override {
    for (;;) {
      ssize_t r = ::read(fd_, dst, n);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) user_error(path_, ": read failed: ", std::strerror(errno));
      consumed_ += static_cast<uint64_t>(r);
      return static_cast<size_t>(r);
    }
  }
  uint64_t consumed() const override { return consumed_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t consumed_ = 0;
};

class GzipFile final : public InputReader::Source {
 public:
  explicit GzipFile(const std::string& path) : path_(path) {
    gz_ = gzopen(path.c_str(), "rb");
    if (!gz_) user_error(path, ": cannot open input (", std::strerror(errno), "); check --input");
    gzbuffer(gz_, 1 << 18);
  }
  ~GzipFile() override { gzclose(gz_); }
  size_t read(char* dst, size_t n) override {
    int r = gzread(gz_, dst, static_cast<unsigned>(n));
    if (r < 0) {
      int err = 0;
      const char* msg = gzerror(gz_, &err);
      user_error(path_, ": gzip decompression failed: ", msg ? msg : "unknown error");
    }
    if (r == 0) {
      // zlib: Z_BUF_ERROR at end of input = the file ended inside a gzip stream (Python's gzip
      // raises EOFError there, so Megatron's run dies too).
      int err = Z_OK;
      gzerror(gz_, &err);
      if (err == Z_BUF_ERROR) user_error(path_, ": truncated gzip stream (the file ends before the end-of-stream marker)");
    }
    return static_cast<size_t>(r);
  }
  uint64_t consumed() const override { return static_cast<uint64_t>(gzoffset(gz_)); }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
};

class ZstdFile final : public InputReader::Source {
 public:
  explicit ZstdFile(const std::string& path) : raw_(path), path_(path), in_buf_(ZSTD_DStreamInSize()) {
    ds_ = ZSTD_createDStream();
    ZSTD_initDStream(ds_);
  }
  ~ZstdFile() override { ZSTD_freeDStream(ds_); }
  size_t read(char* dst, size_t n) override {
    ZSTD_outBuffer out{dst, n, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size) {
        size_t got = raw_.read(in_buf_.data(), in_buf_.size());
        if (got == 0) {
          if (last_ret_ != 0) user_error(path_, ": truncated zstd stream");
          return 0;
        }
        in_ = ZSTD_inBuffer{in_buf_.data(), got, 0};
      }
      size_t ret = ZSTD_decompressStream(ds_, &out, &in_);
      if (ZSTD_isError(ret)) user_error(path_, ": zstd decompression failed: ", ZSTD_getErrorName(ret));
      last_ret_ = ret;
    }
    return out.pos;
  }
  uint64_t consumed() const override { return raw_.consumed(); }

 private:
  PlainFile raw_;
  std::string path_;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  ZSTD_DStream* ds_ = nullptr;
  size_t last_ret_ = 0;
};

InputReader::InputReader(const std::string& path, size_t batch_bytes) : path_(path), batch_bytes_(batch_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) user_error(path, ": cannot open input (", std::strerror(errno), "); check --input");
  if (S_ISDIR(st.st_mode)) user_error(path, ": is a directory; --input takes a .jsonl, .jsonl.gz or .jsonl.zst file");
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (ends_with(path, ".gz"))
    src_ = std::make_unique<GzipFile>(path);
  else if (ends_with(path, ".zst") || ends_with(path, ".zstd"))
    src_ = std::make_unique<ZstdFile>(path);
  else
    src_ = std::make_unique<PlainFile>(path);
}

InputReader::~InputReader() = default;

size_t InputReader::fill() {
  if (eof_) return 0;
  // compact
  if (pending_start_ > 0) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(pending_start_));
    pending_start_ = 0;
  }
  size_t old = pending_.size();
  pending_.resize(old + kReadChunk);
  size_t got = src_->read(pending_.data() + old, kReadChunk);
  pending_.resize(old + got);
  if (got == 0) eof_ = true;
  return got;
}

bool InputReader::next(LineBatch& out) {
  // Gather at least batch_bytes_ (or until EOF), then cut at the last complete line.
  while (!eof_ && pending_.size() - pending_start_ < batch_bytes_) fill();
  for (;;) {
    const char* base = pending_.data() + pending_start_;
    size_t avail = pending_.size() - pending_start_;
    if (avail == 0 && eof_) return false;
    // Find the end of the last complete line within avail. A trailing '\r' at the very end is
    // only complete at EOF (it could be the start of "\r\n").
    size_t cut = std::string::npos;
    // bytes [0, scanned_) were already found to hold no usable terminator (long lines)
    {
      // last '\n' (memrchr) and any later '\r'
      const void* nl = avail > scanned_ ? ::memrchr(base + scanned_, '\n', avail - scanned_) : nullptr;
      const size_t from = nl ? static_cast<size_t>(static_cast<const char*>(nl) - base) + 1 : scanned_;
      if (nl) cut = from;
      for (size_t i = avail; i-- > from;) {
        if (base[i] == '\r') {
          if (i + 1 < avail || eof_) { cut = i + 1; break; }
        }
      }
    }
    if (cut == std::string::npos && eof_) cut = avail;  // last line without terminator
    if (cut == std::string::npos) {  // a line longer than what we have: read more
      // keep the last byte unscanned: a '\r' there may turn out to be a complete terminator
      scanned_ = avail > 0 ? avail - 1 : 0;
      fill();  // compaction keeps offsets relative to pending_start_ unchanged
      continue;
    }
    scanned_ = 0;
    out.seq = next_seq_++;
    out.first_line = next_line_;
    out.file = path_;
    out.lines.clear();
    out.data.assign(base, base + cut);
    out.data.resize(cut + kPadding, '\0');
    const char* d = out.data.data();
    // Common case, no '\r' in the batch: memchr for '\n' (vectorized in libc).
    const bool has_cr = std::memchr(d, '\r', cut) != nullptr;
    size_t pos = 0;
    while (pos < cut) {
      size_t e = pos;
      if (!has_cr) {
        const void* nl = std::memchr(d + pos, '\n', cut - pos);
        e = nl ? static_cast<size_t>(static_cast<const char*>(nl) - d) : cut;
      } else {
        while (e < cut && d[e] != '\n' && d[e] != '\r') ++e;
      }
      LineBatch::Line ln{pos, static_cast<uint32_t>(e - pos), e < cut};
      if (e - pos > UINT32_MAX) user_error(path_, ":", next_line_, ": line longer than 4 GiB");
      out.lines.push_back(ln);
      ++next_line_;
      if (e < cut) {
        if (d[e] == '\r' && e + 1 < cut && d[e + 1] == '\n') ++e;
        ++e;
      }
      pos = e;
    }
    pending_start_ += cut;
    out.input_bytes_done = src_->consumed();
    if (eof_ && pending_start_ == pending_.size()) out.input_bytes_done = file_size_;
    return true;
  }
}

}  // namespace megatron::datasets::preprocess
