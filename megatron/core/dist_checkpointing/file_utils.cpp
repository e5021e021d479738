#include "megatron/core/dist_checkpointing/file_utils.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "megatron/core/utils/errors.h"

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
  }
}

void FileWriter::close() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) user_error("cannot fsync ", path_, ": ", os_error());
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
  {
    FileWriter w(tmp);
    w.write(contents.data(), contents.size());
    w.close();
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = os_error();
    ::unlink(tmp.c_str());
    user_error("cannot rename ", tmp, " to ", path, ": ", err);
  }
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
