// Temporary files that never outlive an error: every writer of this tree publishes its outputs
// as "write <path>.tmp..., then rename", and a write that fails half-way (ENOSPC, EFBIG, EIO,
// an exception from the caller's own checks) must not leave the temporary behind (docs/
// checkpointing.md, "Full disks"). TempFileGuard removes the file on scope exit unless it was
// released after the rename; write_file_atomic_or_throw() is the whole pattern for a small file.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "megatron/core/utils/errors.h"

namespace megatron {

/// Removes `path` (a file; unlink, errors ignored) when destroyed, unless release() was called.
/// Not copyable; movable. Use: `TempFileGuard guard(tmp); ... write tmp ...; rename(tmp, path);
/// guard.release();` so that every exception and early return on the way removes `tmp`.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::string path) : path_(std::move(path)) {}
  ~TempFileGuard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  TempFileGuard(TempFileGuard&& o) noexcept : path_(std::exchange(o.path_, std::string())) {}
  /// The file is published (renamed) or intentionally kept: do not remove it.
  void release() { path_.clear(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Writes `contents` to `path` through "<path>.tmp-<pid>" (fflush + fsync, then rename(2)), so a
/// reader sees the old file or the complete new one. On any failure (cannot create, short write
/// such as ENOSPC/EFBIG, fsync, rename) the temporary is removed and a UserError is thrown:
/// "<what>: cannot write <path>: <strerror>" (`what` names the flag or feature, may be empty).
inline void write_file_atomic_or_throw(const std::string& path, const std::string& contents,
                                       const std::string& what = std::string()) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  TempFileGuard guard(tmp);
  const std::string pre = what.empty() ? std::string() : what + ": ";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) user_error(pre, "cannot create ", tmp, ": ", std::strerror(errno));
  const bool wrote = contents.empty() || std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  const int werr = errno;
  const bool flushed = wrote && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int ferr = errno;
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !flushed || !closed)
    user_error(pre, "cannot write ", path, ": ", std::strerror(!wrote ? werr : !flushed ? ferr : errno),
               " (nothing was replaced; free space or fix the folder and retry)");
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    user_error(pre, "cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  guard.release();
}

}  // namespace megatron
