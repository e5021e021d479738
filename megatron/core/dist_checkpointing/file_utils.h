// Small POSIX file helpers for crash-safe output (docs/architecture.md#errors-and-output-files): write to a
// temporary name, fsync, rename, fsync the directory. Errors are UserErrors naming the path and
// the OS error (strerror).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace megatron::dist_checkpointing {

/// Sequential writer of one file. Data reaches the disk in close() (fsync) — a file is only
/// complete after close() returned. The destructor closes without fsync (for error paths).
class FileWriter {
 public:
  /// Creates/truncates `path` (mode 0644). Throws UserError if it cannot.
  explicit FileWriter(const std::string& path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  /// Appends n bytes (loops over short writes). Throws UserError (e.g. disk full).
  void write(const void* data, size_t n);
  /// Bytes written so far.
  uint64_t position() const { return pos_; }
  /// fsync + close. Throws UserError on failure.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t pos_ = 0;
  uint64_t synced_ = 0;  // bytes handed to write-back with sync_file_range
};

/// Tuning of AlignedFileWriter / the streaming reader. Defaults: 32 MiB write chunks, 4 staging
/// buffers, 2 writer threads, O_DIRECT on, 4 MiB reads. The environment variables
/// MEGATRON_CKPT_IO_CHUNK_MB, MEGATRON_CKPT_READ_CHUNK_MB, MEGATRON_CKPT_IO_THREADS and
/// MEGATRON_CKPT_O_DIRECT=0 override them (io_options_from_env()).
struct IoOptions {
  size_t chunk_bytes = 32ull << 20;  // write chunk, multiple of 4096
  size_t read_chunk_bytes = 4ull << 20;  // load: pread size (cache-resident between read and CRC/copy)
  int buffers = 4;                   // staging buffers (>= 2: one filling, others in flight)
  int writer_threads = 2;            // concurrent pwrite calls
  bool direct = true;                // try O_DIRECT (falls back to buffered where refused)
  bool inject_direct_einval = false; // tests only: the first O_DIRECT pwrite fails with EINVAL
};
IoOptions io_options_from_env();

/// Process-wide pool of 4096-aligned buffers (checkpoint staging), so repeated saves/loads do not
/// pay a page fault per 4 KiB of fresh buffer. take() allocates when none of that size is free
/// (throws UserError when out of memory); give() keeps at most 8 free buffers per size.
uint8_t* take_aligned_buffer(size_t bytes);
void give_aligned_buffer(uint8_t* p, size_t bytes);

/// Sequential writer of large files that bypasses the page cache (O_DIRECT) where the
/// filesystem allows it. write() copies into 4096-aligned staging buffers of chunk_bytes;
/// full buffers are written with pwrite by writer threads while the caller fills the next one
/// (double/multi-buffering). close() writes the last partial buffer padded with zeros to a
/// multiple of 4096, truncates the file to the exact byte count, and fdatasyncs once — the file's
/// bytes are exactly those passed to write(), as with FileWriter. Where O_DIRECT is refused (open
/// or the first pwrite fail with EINVAL, e.g. tmpfs), it clears O_DIRECT and continues with
/// buffered pwrite + sync_file_range write-back of every chunk. Not thread-safe (one caller).
/// Errors (UserError naming the path and strerror): cannot create, write failure (disk full),
/// fdatasync/truncate/close failure; a writer thread's failure is reported by the next
/// write() or by close().
class AlignedFileWriter {
 public:
  explicit AlignedFileWriter(const std::string& path, const IoOptions& opts = io_options_from_env());
  ~AlignedFileWriter();
  AlignedFileWriter(const AlignedFileWriter&) = delete;
  AlignedFileWriter& operator=(const AlignedFileWriter&) = delete;
  /// Appends n bytes (copied; `data` may be reused when this returns).
  void write(const void* data, size_t n);
  /// Bytes accepted so far.
  uint64_t position() const { return pos_; }
  /// True while the file is written with O_DIRECT (false after a fallback or with direct=false).
  bool direct() const { return direct_; }
  /// Writes what is buffered, waits for the writer threads, truncates, fdatasync, close.
  void close();

 private:
  struct Job {
    int buf;
    uint64_t offset;
    size_t len;  // bytes to pwrite (a multiple of 4096 under O_DIRECT)
  };
  void submit(size_t len);
  int take_free_buffer();
  void writer_loop();
  void pwrite_all(const uint8_t* p, size_t len, uint64_t off);
  void rethrow_if_failed();
  void stop_threads();

  std::string path_;
  IoOptions opts_;
  int fd_ = -1;
  std::atomic<bool> direct_{false};
  uint64_t pos_ = 0;       // bytes accepted
  uint64_t file_off_ = 0;  // file offset of the buffer being filled
  std::vector<uint8_t*> bufs_;
  int cur_ = -1;           // buffer being filled (-1: none)
  size_t fill_ = 0;        // bytes in bufs_[cur_]
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<int> free_;
  int busy_ = 0;            // jobs being written
  bool stop_ = false;
  std::string error_;       // first writer failure
  std::atomic<bool> failed_{false};
  std::atomic<bool> injected_{false};
  std::vector<std::thread> threads_;
};

/// Writes `contents` to `path` atomically: path.tmp-<pid> → fsync → rename → fsync(dir).
void write_file_atomic(const std::string& path, const std::string& contents);
/// fsyncs a directory (makes renames/creations inside it durable).
void fsync_dir(const std::string& dir);
/// Whole file as a string; throws UserError naming the path if it cannot be read.
std::string read_text_file(const std::string& path);

/// Read-only memory map of a whole file (empty files map to size 0, data() == nullptr).
class MappedFile {
 public:
  /// Throws UserError naming the path if it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace megatron::dist_checkpointing
