// NumPy .npy files, format version 1.0, as numpy.save writes them (numpy/lib/format.py):
// magic "\x93NUMPY", version 1.0, little-endian u16 header length, a Python dict literal
// {'descr': '<i4', 'fortran_order': False, 'shape': (n,), } padded with spaces (plus numpy's
// 21-digit growth room) and a newline to a multiple of 64 bytes, then the C-order data.
// Megatron's index caches are such files (megatron.md §4.5).
#pragma once

#include <cstdint>
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
