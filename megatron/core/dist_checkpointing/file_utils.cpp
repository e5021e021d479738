#include "megatron/core/dist_checkpointing/file_utils.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <fstream>
#include <map>
#include <sstream>

#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"
#include "megatron/core/utils/parse.h"

namespace megatron::dist_checkpointing {

namespace {
std::string os_error() { return std::strerror(errno); }
}  // namespace

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) user_error("cannot create ", path, ": ", os_error());
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n > (size_t(1) << 30) ? (size_t(1) << 30) : n);
    if (w < 0) {
      if (errno == EINTR) continue;
      user_error("cannot write ", path_, ": ", os_error(), " (disk full?)");
    }
    p += w;
    n -= static_cast<size_t>(w);
    pos_ += static_cast<uint64_t>(w);
    // Start write-back of every completed 64 MiB window right away, so the data streams to the
    // disk while we keep writing instead of piling up as dirty pages for close()'s fsync.
    constexpr uint64_t kWindow = 64ull << 20;
    while (pos_ - synced_ >= kWindow) {
      ::sync_file_range(fd_, static_cast<off_t>(synced_), static_cast<off_t>(kWindow), SYNC_FILE_RANGE_WRITE);
      synced_ += kWindow;
    }
  }
}

void FileWriter::close() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) user_error("cannot fsync ", path_, ": ", os_error());
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) user_error("cannot close ", path_, ": ", os_error());
}

namespace {
// A whole decimal integer in [lo, hi] from environment variable `name`, else a one-line error.
long env_int(const char* name, const char* v, long lo, long hi, const char* what) {
  const auto x = parse_whole_integer(v);
  if (!x || *x < lo || *x > hi) user_error(name, "=", v, ": expected ", what);
  return static_cast<long>(*x);
}
}  // namespace

IoOptions io_options_from_env() {
  IoOptions o;
  if (const char* v = std::getenv("MEGATRON_CKPT_IO_CHUNK_MB"))
    o.chunk_bytes = static_cast<size_t>(env_int("MEGATRON_CKPT_IO_CHUNK_MB", v, 1, 4096, "1..4096 (MiB)")) << 20;
  if (const char* v = std::getenv("MEGATRON_CKPT_READ_CHUNK_MB"))
    o.read_chunk_bytes = static_cast<size_t>(env_int("MEGATRON_CKPT_READ_CHUNK_MB", v, 1, 4096, "1..4096 (MiB)")) << 20;
  if (const char* v = std::getenv("MEGATRON_CKPT_IO_THREADS")) {
    const int t = static_cast<int>(env_int("MEGATRON_CKPT_IO_THREADS", v, 1, 64, "1..64"));
    o.writer_threads = t;
    o.buffers = std::max(o.buffers, t + 2);
  }
  if (const char* v = std::getenv("MEGATRON_CKPT_O_DIRECT"))
    o.direct = env_int("MEGATRON_CKPT_O_DIRECT", v, 0, 1, "0 (buffered writes) or 1 (O_DIRECT)") != 0;
  return o;
}

namespace {
constexpr size_t kAlign = 4096;  // O_DIRECT alignment of buffers, offsets and lengths
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct BufferPool {
  std::mutex mu;
  std::multimap<size_t, uint8_t*> free;
};
BufferPool& buffer_pool() {
  static BufferPool* p = new BufferPool();  // never destroyed: buffers may be returned at exit
  return *p;
}
}  // namespace

uint8_t* take_aligned_buffer(size_t bytes) {
  {
    BufferPool& bp = buffer_pool();
    std::lock_guard<std::mutex> g(bp.mu);
    auto it = bp.free.find(bytes);
    if (it != bp.free.end()) {
      uint8_t* p = it->second;
      bp.free.erase(it);
      return p;
    }
  }
  void* p = nullptr;
  if (::posix_memalign(&p, kAlign, bytes) != 0) user_error("cannot allocate ", bytes, " bytes of checkpoint I/O buffer");
  return static_cast<uint8_t*>(p);
}

void give_aligned_buffer(uint8_t* p, size_t bytes) {
  if (!p) return;
  BufferPool& bp = buffer_pool();
  std::lock_guard<std::mutex> g(bp.mu);
  if (bp.free.count(bytes) >= 8) {
    std::free(p);
    return;
  }
  bp.free.emplace(bytes, p);
}

AlignedFileWriter::AlignedFileWriter(const std::string& path, const IoOptions& opts) : path_(path), opts_(opts) {
  MEGATRON_CHECK(opts_.chunk_bytes >= kAlign && opts_.chunk_bytes % kAlign == 0 && opts_.buffers >= 2 &&
                 opts_.writer_threads >= 1)
      << "AlignedFileWriter options: chunk " << opts_.chunk_bytes << " buffers " << opts_.buffers;
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (opts_.direct) {
    fd_ = ::open(path.c_str(), flags | O_DIRECT, 0644);
    direct_ = fd_ >= 0;
  }
  if (fd_ < 0) fd_ = ::open(path.c_str(), flags, 0644);  // O_DIRECT refused (EINVAL) or not asked for
  if (fd_ < 0) user_error("cannot create ", path, ": ", os_error());
  try {
    for (int i = 0; i < opts_.buffers; ++i) {
      bufs_.push_back(take_aligned_buffer(opts_.chunk_bytes));
      free_.push_back(i);
    }
  } catch (...) {
    for (auto* b : bufs_) give_aligned_buffer(b, opts_.chunk_bytes);
    ::close(fd_);
    throw;
  }
  for (int i = 0; i < opts_.writer_threads; ++i) threads_.emplace_back([this] { writer_loop(); });
}

AlignedFileWriter::~AlignedFileWriter() {
  stop_threads();
  if (fd_ >= 0) ::close(fd_);
  for (auto* b : bufs_) give_aligned_buffer(b, opts_.chunk_bytes);
}

void AlignedFileWriter::stop_threads() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void AlignedFileWriter::pwrite_all(const uint8_t* p, size_t len, uint64_t off) {
  while (len > 0) {
    ssize_t w;
    if (opts_.inject_direct_einval && direct_.load() && !injected_.exchange(true)) {
      w = -1;
      errno = EINVAL;
    } else {
      w = ::pwrite(fd_, p, std::min(len, size_t(1) << 30), static_cast<off_t>(off));
    }
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_.load()) {
        // The filesystem refuses O_DIRECT (alignment or not supported): continue buffered.
        int fl = ::fcntl(fd_, F_GETFL);
        if (fl >= 0 && ::fcntl(fd_, F_SETFL, fl & ~O_DIRECT) == 0) {
          direct_ = false;
          continue;
        }
      }
      throw std::runtime_error("cannot write " + path_ + ": " + os_error() + " (disk full?)");
    }
    if (w == 0) throw std::runtime_error("cannot write " + path_ + ": no progress (disk full?)");
    p += w;
    len -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

void AlignedFileWriter::writer_loop() {
  while (true) {
    Job job{};
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = jobs_.front();
      jobs_.pop_front();
      ++busy_;
    }
    std::string err;
    if (!failed_.load()) {  // after a failure, drain without writing
      try {
        pwrite_all(bufs_[job.buf], job.len, job.offset);
        if (!direct_.load())  // start write-back now instead of piling dirty pages for fdatasync
          ::sync_file_range(fd_, static_cast<off_t>(job.offset), static_cast<off_t>(job.len), SYNC_FILE_RANGE_WRITE);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!err.empty() && error_.empty()) {
        error_ = err;
        failed_ = true;
      }
      free_.push_back(job.buf);
      --busy_;
    }
    cv_.notify_all();
  }
}

void AlignedFileWriter::rethrow_if_failed() {
  std::lock_guard<std::mutex> g(mu_);
  if (!error_.empty()) user_error(error_);
}

int AlignedFileWriter::take_free_buffer() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !free_.empty() || !error_.empty(); });
  if (!error_.empty()) user_error(error_);
  int b = free_.back();
  free_.pop_back();
  return b;
}

void AlignedFileWriter::submit(size_t len) {
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back({cur_, file_off_, len});
  }
  cv_.notify_all();
  file_off_ += len;
  cur_ = -1;
  fill_ = 0;
}

void AlignedFileWriter::write(const void* data, size_t n) {
  MEGATRON_CHECK(fd_ >= 0) << "write after close: " << path_;
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    if (cur_ < 0) {
      cur_ = take_free_buffer();
      fill_ = 0;
    }
    const size_t k = std::min(n, opts_.chunk_bytes - fill_);
    std::memcpy(bufs_[cur_] + fill_, p, k);
    fill_ += k;
    pos_ += k;
    p += k;
    n -= k;
    if (fill_ == opts_.chunk_bytes) submit(fill_);
  }
  rethrow_if_failed();
}

void AlignedFileWriter::close() {
  if (fd_ < 0) return;
  bool padded = false;
  if (cur_ >= 0 && fill_ > 0) {
    size_t len = fill_;
    if (direct_.load()) {
      len = round_up(fill_, kAlign);
      std::memset(bufs_[cur_] + fill_, 0, len - fill_);  // cut again by ftruncate below
      padded = len != fill_;
    }
    submit(len);
  }
  stop_threads();  // writers drain the queue before they exit
  rethrow_if_failed();
  if (padded && ::ftruncate(fd_, static_cast<off_t>(pos_)) != 0)
    user_error("cannot truncate ", path_, " to ", pos_, " bytes: ", os_error());
  if (::fdatasync(fd_) != 0) user_error("cannot fdatasync ", path_, ": ", os_error());
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) user_error("cannot close ", path_, ": ", os_error());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) user_error("cannot open directory ", dir, ": ", os_error());
  ::fsync(fd);  // some filesystems refuse fsync on directories; the rename is still ordered
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  TempFileGuard guard(tmp);  // removed on every failure below (ENOSPC, EFBIG, EIO, rename)
  {
    FileWriter w(tmp);
    w.write(contents.data(), contents.size());
    w.close();
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) user_error("cannot rename ", tmp, " to ", path, ": ", os_error());
  guard.release();
  auto parent = std::filesystem::path(path).parent_path();
  fsync_dir(parent.empty() ? std::string(".") : parent.string());
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) user_error("cannot read ", path, ": ", os_error());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) user_error("cannot open ", path, ": ", os_error());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = os_error();
    ::close(fd);
    user_error("cannot stat ", path, ": ", err);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string err = os_error();
      ::close(fd);
      user_error("cannot mmap ", path, ": ", err);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace megatron::dist_checkpointing
