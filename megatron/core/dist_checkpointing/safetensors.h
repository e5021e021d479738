// safetensors files: read (memory-mapped) and write.
//
// Format (github.com/huggingface/safetensors, "Format" section of its README):
//   8 bytes   N, little-endian uint64: size of the header
//   N bytes   UTF-8 JSON object: {"__metadata__": {str: str, ...},            (optional)
//                                 "<tensor name>": {"dtype": "F32", "shape": [2, 3],
//                                                   "data_offsets": [begin, end]}, ...}
//             (may be padded at the end with spaces; we pad so that 8 + N is a multiple of 8)
//   rest      the byte buffer; data_offsets are relative to its start; tensors are row-major,
//             little-endian, and the buffer is fully indexed without holes or overlaps.
// dtype names: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 F32 F64 I64 (the ones we have a
// DType for; others — U32, U64, F8_E8M0, F4, F6_* — are rejected with a UserError naming them).
//
// Our writer's canonical order is the reference implementation's: tensors sorted by dtype
// descending in the order above (I64/F64 first ... BOOL last), then by name; the compact JSON
// header lists "__metadata__" first (keys sorted), then the tensors in buffer order with the fields
// dtype, shape, data_offsets — byte-identical to the reference writer for files whose metadata has
// one key (its metadata map order is unspecified). Any conforming order is accepted on read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace megatron::dist_checkpointing {

class MappedFile;

/// safetensors dtype string of `t` ("F32", "BF16", "F8_E4M3", ...).
const char* safetensors_dtype_name(DType t);
/// Inverse of safetensors_dtype_name; throws UserError "<where>: unsupported safetensors dtype X".
DType safetensors_dtype_from_name(const std::string& name, const std::string& where);

/// One tensor of a safetensors file. begin/end: byte offsets relative to the data buffer.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

/// Memory-mapped reader. The header is fully validated on open (sizes, offsets inside the
/// buffer, no overlap, byte sizes = numel × element size); errors name the file and tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  /// Entries ordered by their begin offset.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// nullptr when absent.
  const SafetensorsEntry* find(const std::string& name) const;
  /// Throws UserError "<path>: no tensor '<name>'" when absent.
  const SafetensorsEntry& at(const std::string& name) const;
  /// The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Pointer to the entry's bytes inside the mapping (valid while the reader lives).
  const uint8_t* bytes(const SafetensorsEntry& e) const;
  /// Absolute file offset of the data buffer (8 + header size).
  uint64_t data_start() const { return data_start_; }
  /// A CPU tensor copy of `name` (dtype and shape from the header).
  Tensor tensor(const std::string& name) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Something to write: name, dtype, shape and a pointer to numel×size bytes (CPU memory).
struct SafetensorsItem {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  const void* data = nullptr;
};

/// The header of a file about to be written: `header` is the complete prefix (8-byte length
/// + padded JSON); `order[i]` is the index into the items of the i-th tensor in the buffer and
/// `entries[i]` its entry (same order).
struct SafetensorsLayout {
  std::string header;
  std::vector<size_t> order;
  std::vector<SafetensorsEntry> entries;
  uint64_t data_bytes = 0;
};

/// Computes the canonical layout (see top of file). Throws UserError on duplicate names.
SafetensorsLayout plan_safetensors(const std::vector<SafetensorsItem>& items,
                                   const std::map<std::string, std::string>& metadata);

/// Writes a safetensors file atomically (temporary name, fsync, rename).
void save_safetensors(const std::string& path, const std::vector<SafetensorsItem>& items,
                      const std::map<std::string, std::string>& metadata = {});
/// Convenience: named CPU (or CUDA: copied to CPU) tensors.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace megatron::dist_checkpointing
