// LD_PRELOAD shim for the full-disk tests (tests/functional_tests/full_disk_*.sh): every file
// whose path contains $FAIL_WRITES_MATCHING is created as asked (so a temporary file really
// appears on disk, 0 bytes) but its descriptor is then pointed at /dev/full, so each write to it
// fails with ENOSPC, as on a full disk. Interposes the public entry points our writers call
// (open/open64/openat, fopen/fopen64; std::ofstream goes through fopen or open).
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cstdlib>

namespace {
bool matches(const char* path) {
  const char* pat = std::getenv("FAIL_WRITES_MATCHING");
  return path && pat && *pat && strstr(path, pat) != nullptr;
}
bool writable(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }
int to_full(int fd) {
  if (fd < 0) return fd;
  using open_fn = int (*)(const char*, int, ...);
  static open_fn real = reinterpret_cast<open_fn>(dlsym(RTLD_NEXT, "open"));
  int full = real("/dev/full", O_WRONLY | O_CLOEXEC);
  if (full >= 0) {
    dup2(full, fd);
    close(full);
  }
  return fd;
}
template <class Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}
}  // namespace

extern "C" {
int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = static_cast<mode_t>(va_arg(ap, int));
  va_end(ap);
  static auto real = next<int (*)(const char*, int, ...)>("open");
  int fd = real(path, flags, mode);
  return matches(path) && writable(flags) ? to_full(fd) : fd;
}
int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = static_cast<mode_t>(va_arg(ap, int));
  va_end(ap);
  static auto real = next<int (*)(const char*, int, ...)>("open64");
  int fd = real(path, flags, mode);
  return matches(path) && writable(flags) ? to_full(fd) : fd;
}
int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = static_cast<mode_t>(va_arg(ap, int));
  va_end(ap);
  static auto real = next<int (*)(int, const char*, int, ...)>("openat");
  int fd = real(dirfd, path, flags, mode);
  return matches(path) && writable(flags) ? to_full(fd) : fd;
}
FILE* fopen(const char* path, const char* mode) {
  static auto real = next<FILE* (*)(const char*, const char*)>("fopen");
  FILE* f = real(path, mode);
  if (f && matches(path) && mode && (mode[0] == 'w' || mode[0] == 'a' || strchr(mode, '+'))) to_full(fileno(f));
  return f;
}
FILE* fopen64(const char* path, const char* mode) {
  static auto real = next<FILE* (*)(const char*, const char*)>("fopen64");
  FILE* f = real(path, mode);
  if (f && matches(path) && mode && (mode[0] == 'w' || mode[0] == 'a' || strchr(mode, '+'))) to_full(fileno(f));
  return f;
}
}
