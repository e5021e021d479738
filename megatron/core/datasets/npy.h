// NumPy .npy files, format version 1.0, as numpy.save writes them (numpy/lib/format.py):
// magic "\x93NUMPY", version 1.0, little-endian u16 header length, a Python dict literal
// {'descr': '<i4', 'fortran_order': False, 'shape': (n,), } padded with spaces (plus numpy's
// 21-digit growth room) and a newline to a multiple of 64 bytes, then the C-order data.
// Megatron's index caches are such files (docs/megatron-reference.md#cache-files).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace megatron::datasets {

/// Element types used by Megatron's index files.
enum class NpyDType { kInt16, kInt32, kUInt32, kInt64 };
/// "<i2", "<i4", "<u4", "<i8"
const char* npy_descr(NpyDType t);
size_t npy_itemsize(NpyDType t);

/// A loaded .npy array: shape and its elements widened to int64 (all our index dtypes fit).
struct NpyArray {
  NpyDType dtype = NpyDType::kInt64;
  std::vector<int64_t> shape;
  std::vector<int64_t> data;
  int64_t numel() const;
};

/// A read-only .npy array kept in its file dtype: memory-mapped from a cache file (as Megatron's
/// numpy.load(mmap_mode="r"), so ranks on a node share the pages) or owning a built buffer.
class NpyView {
 public:
  NpyView() = default;
  /// Maps `path` (version 1.0-3.0, little-endian C order, dtype <i2/<i4/<u4/<i8). UserError naming
  /// the path on a bad header or a file shorter than the header says.
  static NpyView map(const std::string& path);
  /// Takes ownership of typed data (T matching dtype's item size).
  template <class T>
  static NpyView own(NpyDType dtype, std::vector<int64_t> shape, std::vector<T> data) {
    auto holder = std::make_shared<std::vector<T>>(std::move(data));
    NpyView v;
    v.dtype_ = dtype;
    v.shape_ = std::move(shape);
    v.data_ = holder->data();
    v.numel_ = static_cast<int64_t>(holder->size());
    v.holder_ = holder;
    return v;
  }
  NpyDType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  const void* data() const { return data_; }
  /// Element i (flat index), widened to int64.
  int64_t operator[](int64_t i) const {
    switch (dtype_) {
      case NpyDType::kInt16: return static_cast<const int16_t*>(data_)[i];
      case NpyDType::kInt32: return static_cast<const int32_t*>(data_)[i];
      case NpyDType::kUInt32: return static_cast<const uint32_t*>(data_)[i];
      case NpyDType::kInt64: return static_cast<const int64_t*>(data_)[i];
    }
    return 0;
  }
  std::vector<int64_t> to_vector() const;

 private:
  NpyDType dtype_ = NpyDType::kInt64;
  std::vector<int64_t> shape_;
  const void* data_ = nullptr;
  int64_t numel_ = 0;
  std::shared_ptr<const void> holder_;
};

/// Writes raw typed data (numel(shape) items of dtype) as a .npy file (temp name, then rename).
void npy_save_raw(const std::string& path, NpyDType dtype, const std::vector<int64_t>& shape, const void* data);

/// The header bytes numpy.save would write for this dtype and shape (C order).
std::string npy_header(NpyDType dtype, const std::vector<int64_t>& shape);
/// Writes `data` (int64 values narrowed to `dtype`) as a .npy file: to path + ".tmp.<pid>", then
/// renamed. Throws UserError naming the path if it cannot be written.
void npy_save(const std::string& path, NpyDType dtype, const std::vector<int64_t>& shape,
              const int64_t* data);
/// Same for int32 data (no widening copy).
void npy_save_i32(const std::string& path, const std::vector<int64_t>& shape, const int32_t* data);
/// Reads a version 1.0/2.0 little-endian C-order .npy of one of the dtypes above. Throws UserError
/// naming the path on a bad magic, an unsupported dtype, Fortran order or a short file.
NpyArray npy_load(const std::string& path);

}  // namespace megatron::datasets
