#include "megatron/core/datasets/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "megatron/core/utils/errors.h"

namespace megatron::datasets {

const char* npy_descr(NpyDType t) {
  switch (t) {
    case NpyDType::kInt16: return "<i2";
    case NpyDType::kInt32: return "<i4";
    case NpyDType::kUInt32: return "<u4";
    case NpyDType::kInt64: return "<i8";
  }
  return "?";
}

size_t npy_itemsize(NpyDType t) {
  switch (t) {
    case NpyDType::kInt16: return 2;
    case NpyDType::kInt32: return 4;
    case NpyDType::kUInt32: return 4;
    case NpyDType::kInt64: return 8;
  }
  return 0;
}

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::string npy_header(NpyDType dtype, const std::vector<int64_t>& shape) {
  std::string shp = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    shp += std::to_string(shape[i]);
    if (shape.size() == 1) shp += ",";
    else if (i + 1 < shape.size()) shp += ", ";
  }
  shp += ")";
  std::string h = std::string("{'descr': '") + npy_descr(dtype) + "', 'fortran_order': False, 'shape': " + shp + ", }";
  if (!shape.empty()) h += std::string(21 - std::to_string(shape[0]).size(), ' ');
  const size_t hlen = h.size() + 1;
  const size_t padlen = 64 - ((6 + 2 + 2 + hlen) % 64);
  h += std::string(padlen, ' ') + "\n";
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  const uint16_t len = static_cast<uint16_t>(h.size());
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  return out + h;
}

namespace {
void write_file(const std::string& path, const std::string& header, const void* data, size_t bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) user_error(path, ": cannot create (", std::strerror(errno), "); check --data-cache-path is writable");
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  if (bytes) ok = ok && std::fwrite(data, 1, bytes, f) == bytes;
  ok = (std::fflush(f) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    user_error(path, ": write failed (", std::strerror(errno), ")");
  }
}
}  // namespace

void npy_save(const std::string& path, NpyDType dtype, const std::vector<int64_t>& shape, const int64_t* data) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  const size_t isz = npy_itemsize(dtype);
  std::vector<char> buf(static_cast<size_t>(n) * isz);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case NpyDType::kInt16: { int16_t v = static_cast<int16_t>(data[i]); std::memcpy(&buf[i * 2], &v, 2); break; }
      case NpyDType::kInt32: { int32_t v = static_cast<int32_t>(data[i]); std::memcpy(&buf[i * 4], &v, 4); break; }
      case NpyDType::kUInt32: { uint32_t v = static_cast<uint32_t>(data[i]); std::memcpy(&buf[i * 4], &v, 4); break; }
      case NpyDType::kInt64: std::memcpy(&buf[i * 8], &data[i], 8); break;
    }
  }
  write_file(path, npy_header(dtype, shape), buf.data(), buf.size());
}

void npy_save_i32(const std::string& path, const std::vector<int64_t>& shape, const int32_t* data) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  write_file(path, npy_header(NpyDType::kInt32, shape), data, static_cast<size_t>(n) * 4);
}

void npy_save_raw(const std::string& path, NpyDType dtype, const std::vector<int64_t>& shape, const void* data) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  write_file(path, npy_header(dtype, shape), data, static_cast<size_t>(n) * npy_itemsize(dtype));
}

std::vector<int64_t> NpyView::to_vector() const {
  std::vector<int64_t> v(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) v[i] = (*this)[i];
  return v;
}

namespace {
struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base && size) ::munmap(base, size);
  }
};

// Parses the header dict at `h`; fills dtype and shape.
void parse_header(const std::string& path, const std::string& h, NpyDType& dtype, std::vector<int64_t>& shape) {
  auto field = [&](const std::string& key) -> std::string {
    const size_t k = h.find("'" + key + "'");
    if (k == std::string::npos) user_error(path, ": .npy header lacks '", key, "'; delete the cache file to rebuild it");
    return h.substr(h.find(':', k) + 1);
  };
  std::string d = field("descr");
  const size_t q1 = d.find('\'');
  const size_t q2 = d.find('\'', q1 + 1);
  const std::string descr = d.substr(q1 + 1, q2 - q1 - 1);
  if (descr == "<i2") dtype = NpyDType::kInt16;
  else if (descr == "<i4") dtype = NpyDType::kInt32;
  else if (descr == "<u4") dtype = NpyDType::kUInt32;
  else if (descr == "<i8") dtype = NpyDType::kInt64;
  else user_error(path, ": unsupported .npy dtype '", descr, "' (expected <i2, <i4, <u4 or <i8)");
  if (field("fortran_order").find("False") > 2) user_error(path, ": Fortran-order .npy is not supported");
  std::string s = field("shape");
  const size_t p1 = s.find('(');
  const size_t p2 = s.find(')');
  if (p1 == std::string::npos || p2 == std::string::npos) user_error(path, ": bad .npy shape");
  std::string inner = s.substr(p1 + 1, p2 - p1 - 1);
  size_t i = 0;
  shape.clear();
  while (i < inner.size()) {
    while (i < inner.size() && (inner[i] == ' ' || inner[i] == ',')) ++i;
    if (i >= inner.size()) break;
    size_t j = i;
    while (j < inner.size() && inner[j] >= '0' && inner[j] <= '9') ++j;
    if (j == i) user_error(path, ": bad .npy shape");
    shape.push_back(std::stoll(inner.substr(i, j - i)));
    i = j;
  }
}
}  // namespace

NpyView NpyView::map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) user_error(path, ": cannot open (", std::strerror(errno), ")");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    user_error(path, ": cannot stat (", std::strerror(errno), ")");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  auto m = std::make_shared<Mapping>();
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      user_error(path, ": mmap failed (", std::strerror(errno), ")");
    }
    m->base = p;
    m->size = size;
  }
  ::close(fd);
  const char* b = static_cast<const char*>(m->base);
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0)
    user_error(path, ": not a NumPy .npy file (bad magic); delete the cache file to rebuild it");
  size_t hstart, hlen;
  if (b[6] == 1) {
    hlen = static_cast<unsigned char>(b[8]) | (static_cast<unsigned char>(b[9]) << 8);
    hstart = 10;
  } else if ((b[6] == 2 || b[6] == 3) && size >= 12) {
    hlen = static_cast<unsigned char>(b[8]) | (static_cast<unsigned char>(b[9]) << 8) |
           (static_cast<unsigned char>(b[10]) << 16) | (static_cast<size_t>(static_cast<unsigned char>(b[11])) << 24);
    hstart = 12;
  } else {
    user_error(path, ": unsupported .npy version ", int(b[6]));
  }
  if (hstart + hlen > size) user_error(path, ": truncated .npy header; delete the cache file to rebuild it");
  NpyView v;
  parse_header(path, std::string(b + hstart, hlen), v.dtype_, v.shape_);
  v.numel_ = 1;
  for (auto s : v.shape_) v.numel_ *= s;
  const size_t need = hstart + hlen + static_cast<size_t>(v.numel_) * npy_itemsize(v.dtype_);
  if (need > size)
    user_error(path, ": truncated .npy data (", size, " bytes, header says ", need, "); delete the cache file to rebuild it");
  v.data_ = b + hstart + hlen;
  v.holder_ = m;
  return v;
}

NpyArray npy_load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) user_error(path, ": cannot open (", std::strerror(errno), ")");
  char pre[8];
  if (!f.read(pre, 8) || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    user_error(path, ": not a NumPy .npy file (bad magic); delete the cache file to rebuild it");
  uint32_t hlen = 0;
  if (pre[6] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else if (pre[6] == 2 || pre[6] == 3) {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    user_error(path, ": unsupported .npy version ", int(pre[6]));
  }
  std::string h(hlen, '\0');
  if (!f.read(h.data(), hlen)) user_error(path, ": truncated .npy header");
  NpyArray a;
  parse_header(path, h, a.dtype, a.shape);
  const int64_t n = a.numel();
  const size_t isz = npy_itemsize(a.dtype);
  std::vector<char> buf(static_cast<size_t>(n) * isz);
  if (n && !f.read(buf.data(), buf.size()))
    user_error(path, ": truncated .npy data (expected ", n, " elements); delete the cache file to rebuild it");
  a.data.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    switch (a.dtype) {
      case NpyDType::kInt16: { int16_t v; std::memcpy(&v, &buf[i * 2], 2); a.data[i] = v; break; }
      case NpyDType::kInt32: { int32_t v; std::memcpy(&v, &buf[i * 4], 4); a.data[i] = v; break; }
      case NpyDType::kUInt32: { uint32_t v; std::memcpy(&v, &buf[i * 4], 4); a.data[i] = v; break; }
      case NpyDType::kInt64: std::memcpy(&a.data[i], &buf[i * 8], 8); break;
    }
  }
  return a;
}

}  // namespace megatron::datasets
