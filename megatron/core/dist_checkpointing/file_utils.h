// Small POSIX file helpers for crash-safe output (DESIGN.md "Nothing lost"): write to a
// temporary name, fsync, rename, fsync the directory. Errors are UserErrors naming the path and
// the OS error (strerror).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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
